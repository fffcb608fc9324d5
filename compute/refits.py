"""A refit family's stability run: from model references to validated records.

`family_stability` is the whole pipeline behind `strata stability`: the members are resolved (a
folder holding checkpoint folders stands for all of them), the anchor is picked, every model is
loaded on one device, the prompt set is drawn from the built-in corpus with the anchor's
tokenizer, and `compute.stability.stability_records` compares the refits with the anchor (and
with randomly initialised models of its architecture, the null baseline).

    >>> family_name(["tiny-4l-s0", "tiny-4l-s1"])
    'tiny-4l'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from compute.errors import SpecError
from compute.models import ModelSpec
from compute.stability import StabilityOptions
from compute.tokens import TokenSpec

if TYPE_CHECKING:
    from compute.engine import ProgressFn
    from compute.models import LoadedModel


@dataclass(frozen=True)
class FamilyStability:
    """A computed stability comparison: the records and what they were computed from."""

    records: pa.Table  # validated long records (docs/metrics.md)
    anchor: ModelSpec
    members: list[tuple[ModelSpec, dict[str, Any]]]  # every member (anchor included), in the
    # order given, with its architecture numbers (`LoadedModel.describe()`)
    options: StabilityOptions
    prompts: TokenSpec
    wall_s: float = 0.0
    environment: dict[str, str] = field(default_factory=dict)  # torch, python, strata versions

    def metadata(self) -> dict[str, Any]:
        """What an exported file carries beside the records."""
        return {
            "family": [spec.model_dump(mode="json") for spec, _ in self.members],
            "anchor": self.anchor.model_dump(mode="json"),
            "options": self.options.model_dump(mode="json"),
            "prompts": self.prompts.model_dump(mode="json"),
        }


def expand_family(refs: Sequence[str]) -> list[str]:
    """The member references: a comma-separated list stands for its items (a seed suite such as
    `EleutherAI/pythia-160m-seed1,EleutherAI/pythia-160m-seed2`; a path that exists is never
    split), a folder that is not itself a checkpoint for the checkpoint folders in it (sorted by
    name); every other reference stays as given.

        >>> expand_family(["zoo:tiny-4l-s0,zoo:tiny-4l-s1"])
        ['zoo:tiny-4l-s0', 'zoo:tiny-4l-s1']
    """
    split: list[str] = []
    for ref in refs:
        if "," in ref and not Path(ref).exists():
            split += [item.strip() for item in ref.split(",") if item.strip()]
        else:
            split.append(ref)
    expanded: list[str] = []
    for ref in split:
        path = Path(ref)
        if path.is_dir() and not (path / "config.json").is_file():
            expanded += sorted(str(p) for p in path.iterdir() if (p / "config.json").is_file())
        else:
            expanded.append(ref)
    return expanded


def _named_anchor(refs: list[str], anchor: str) -> str:
    """The member `anchor` names: its reference, or its short name (a folder's name, a zoo
    name without `zoo:`)."""
    if anchor in refs:
        return anchor
    matches = [r for r in refs if Path(r).name == anchor or r.removeprefix("zoo:") == anchor]
    if len(matches) != 1:
        raise SpecError(f"--anchor {anchor!r} is not one of the family: {', '.join(refs)}")
    return matches[0]


def prompt_spec(opts: StabilityOptions) -> TokenSpec:
    """The prompt set of a comparison: windows of the built-in corpus, drawn with the options'
    seed (unresolved: `compute.tokens.resolve_token_spec` adds its fingerprint)."""
    return TokenSpec(
        source="builtin", n_sequences=opts.n_prompts, seq_len=opts.prompt_len, seed=opts.seed
    )


def family_stability(
    members: Sequence[str],
    *,
    anchor: str | None = None,
    n_prompts: int = 32,
    prompt_len: int = 64,
    n_null: int = 3,
    device: str = "cpu",
) -> FamilyStability:
    """Head stability and residual CKA of a refit family against its anchor.

    `members` are model references (zoo names, checkpoint folders, TransformerLens names) or
    folders of checkpoint folders; the options are those of `StabilityOptions`. Raises
    `SpecError` for an unknown anchor, a family of fewer than two models or refits that cannot
    be compared (`RefitMismatchError`), `ModelLoadError` when a member does not load.
    """
    from compute.models import resolve_model_spec
    from compute.tokens import resolve_token_spec

    refs = expand_family(members)
    named = _named_anchor(refs, anchor) if anchor is not None else None
    if len(refs) < 2:
        raise SpecError("a family needs at least two models (the anchor and one refit)")
    anchor_ref = named or refs[0]
    opts = StabilityOptions(n_prompts=n_prompts, prompt_len=prompt_len, n_null=n_null)
    specs = {ref: resolve_model_spec(ref) for ref in refs}
    prompts = resolve_token_spec(prompt_spec(opts))
    return stability_of(specs[anchor_ref], list(specs.values()), opts, prompts, device=device)


def stability_of(
    anchor: ModelSpec,
    members: Sequence[ModelSpec],
    opts: StabilityOptions,
    prompts: TokenSpec,
    *,
    device: str = "cpu",
    load: Callable[[ModelSpec], LoadedModel] | None = None,
    progress: ProgressFn | None = None,
) -> FamilyStability:
    """The one implementation of a family's comparison, for `strata stability` and for a
    worker's stability job alike: `members` (the anchor among them) are loaded with `load`
    (default `load_model` on `device`; a worker passes its model cache), the prompt set
    `prompts` (a resolved `prompt_spec`) is tokenized with the anchor's tokenizer, and
    `compute.stability.stability_records` compares the refits with the anchor and with
    `opts.n_null` random models of its architecture (always loaded afresh). `progress` gets the
    engine's `Progress` after each model's pass (and may raise to stop)."""
    import platform
    import time

    import torch

    from compute.engine import Progress
    from compute.models import load_model
    from compute.records import records_to_table, validate_records
    from compute.run import CODE_VERSION
    from compute.stability import stability_records
    from compute.tokens import load_tokens

    if len(members) < 2:
        raise SpecError("a family needs at least two models (the anchor and one refit)")
    if anchor not in members:
        raise SpecError(f"the anchor {anchor.name} is not one of the family's members")

    def fresh(spec: ModelSpec) -> LoadedModel:
        return load_model(spec, device)

    load_member = load or fresh
    start = time.perf_counter()
    per_model = prompts.n_sequences * prompts.seq_len

    def report(done: int, total: int) -> None:
        if progress is not None:
            elapsed = time.perf_counter() - start
            tokens = min(done, total - 1) * per_model
            progress(Progress(done, total, tokens, tokens / elapsed if elapsed else 0.0, elapsed))

    anchor_lm = load_member(anchor)
    tokens = load_tokens(
        prompts,
        anchor_lm.tokenizer,
        bos_token_id=anchor_lm.bos_token_id,
        d_vocab=anchor_lm.d_vocab,
        n_ctx=anchor_lm.n_ctx,
    )
    refits = [load_member(m) for m in members if m != anchor]
    records = stability_records(anchor_lm, refits, tokens, opts, fresh, progress=report)
    table = validate_records(records_to_table(records), n_layers=anchor_lm.n_layers)
    others = iter(refits)
    described = [(m, (anchor_lm if m == anchor else next(others)).describe()) for m in members]
    return FamilyStability(
        records=table,
        anchor=anchor,
        members=described,
        options=opts,
        prompts=prompts,
        wall_s=time.perf_counter() - start,
        environment={
            "torch": torch.__version__,
            "python": platform.python_version(),
            "strata": CODE_VERSION,
        },
    )


def family_name(names: Sequence[str]) -> str:
    """The members' common name prefix without a trailing seed marker (tiny-4l-s0, tiny-4l-s1
    -> tiny-4l); the first member's name when they share none."""
    short = [Path(n).name for n in names]
    common = short[0]
    for name in short[1:]:
        while not name.startswith(common):
            common = common[:-1]
    prefix = re.sub(r"[-_.]?(s|seed)?[-_.]*$", "", common)
    return prefix or f"{short[0]}-refits"
