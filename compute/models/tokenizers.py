"""A model's tokenizer without its weights, read offline from the files its source keeps: what
a job's submission needs to count the sequences a text yields (`compute.tokens.check_text_yields`)
before any worker loads the model.

None where it cannot be had that way — random weights (no tokenizer), a hub name not in the local
Hugging Face cache, a GGUF file not dequantized yet — and the worker checks then, as before.
Never downloads (`local_files_only`). Kept per process, by source, name and revision.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from compute.models.spec import ModelSpec


def tokenizer_of(spec: ModelSpec) -> Any | None:
    """The tokenizer `load_model(spec)` would give the model, or None (see the module)."""
    try:
        return _tokenizer(spec.source, spec.name, spec.revision)
    except Exception:  # unreadable or absent tokenizer files: the worker will say why
        return None


@functools.lru_cache(maxsize=16)
def _tokenizer(source: str, name: str, revision: str | None) -> Any | None:
    if source == "zoo":
        from compute.zoo.paths import zoo_path
        from compute.zoo.planted import PLANTED, planted_tokenizer

        return planted_tokenizer() if name in PLANTED else _from_folder(zoo_path(name))
    if source == "hf_dir":
        return _from_folder(Path(name))
    if source == "gguf" and revision and revision.startswith("sha256:"):
        from compute.gguf import cached_checkpoint

        folder = cached_checkpoint(revision.removeprefix("sha256:"))
        return _from_folder(folder) if folder is not None else None
    if source == "transformer_lens":
        from transformers import AutoTokenizer

        from compute.models.sources import loading_name

        kwargs = {"revision": revision} if revision else {}
        return AutoTokenizer.from_pretrained(loading_name(name), local_files_only=True, **kwargs)
    return None


def _from_folder(path: Path) -> Any | None:
    """A checkpoint folder's tokenizer, as `HFDirSource` loads it (None without its files)."""
    from transformers import AutoTokenizer

    files = ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json")
    if not any((path / f).is_file() for f in files):
        return None
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
