"""What to tell a user whose model reference names nothing Strata can load
(`resolve_model_spec`'s refusal): a path that does not exist says so, a path that exists says
what it lacks, and anything else lists every zoo name (or as many as fit, and how many more).

>>> unknown_model_message("/no/such/checkpoint", ["tiny-2l-s0"])
"unknown model '/no/such/checkpoint': no such file or directory: /no/such/checkpoint"
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ZOO_NAMES_SHOWN = 16  # more than the zoo holds today: every name is listed


def looks_like_path(ref: str) -> bool:
    """Whether a reference means a place on disk rather than a name: absolute, relative to
    `.`/`..`/`~`, or a relative path whose folder exists (`checkpoints/typo`). A hub name such
    as `someone/model` is not one unless a folder `someone` is here."""
    if ref.startswith(("/", "~", "./", "../")) or ref in (".", ".."):
        return True
    if "/" not in ref:
        return False
    try:
        return Path(ref).parent.is_dir()
    except (OSError, ValueError):  # a NUL byte, a name too long for the file system
        return False


def zoo_hint(names: Sequence[str], shown: int = ZOO_NAMES_SHOWN) -> str:
    """The zoo's names, all of them, or the first `shown` and how many more there are."""
    if not names:
        return "none built yet: run `strata zoo train`"
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, … and {len(names) - shown} more"


def unknown_model_message(ref: str, zoo: Sequence[str]) -> str:
    """Why `ref` is no model: what is wrong with the path it names, or every kind of name it is
    not."""
    head = f"unknown model {ref!r}"
    if looks_like_path(ref):
        path = Path(ref).expanduser()
        try:
            exists, is_dir = path.exists(), path.is_dir()
        except (OSError, ValueError):
            exists, is_dir = False, False
        if not exists:
            return f"{head}: no such file or directory: {ref}"
        if is_dir:
            return (
                f"{head}: {ref} is a directory without config.json, not a Hugging Face "
                "checkpoint; give the folder that holds config.json and the weights"
            )
        return (
            f"{head}: {ref} is a file, not a checkpoint directory (with config.json) or a "
            ".gguf file"
        )
    return (
        f"{head}: not a zoo model ({zoo_hint(zoo)}), not a directory with config.json, "
        "and not a TransformerLens official name (e.g. gpt2, pythia-410m-deduped)"
    )
