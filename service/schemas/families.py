"""Refit families, their members and settings, and their head stability."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

from service.schemas.common import ModelRef, RunRef

FamilyName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$",
        description="letters, digits and ._+- (part of URLs), not all digits",
    ),
]
ModelName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=1000, description="registered model name or id")
]


class FamilySettings(msgspec.Struct):
    """How the family's stability is computed (docs/metrics.md: heads.stability)."""

    n_prompts: int  # prompts of the built-in corpus
    prompt_len: int  # tokens per prompt, BOS included
    seed: int  # which windows are drawn
    n_null: int  # randomly initialised models of the anchor's architecture (the null)
    cka_tokens: int  # residual rows compared by CKA


class FamilyMember(msgspec.Struct):
    """A member and where it stands: `current` — in the family's current stability run;
    `pending` — not in it yet (it joined since, or nothing is computed yet): the next
    computation includes it."""

    model: ModelRef
    anchor: bool
    state: str
    architecture: str | None
    n_heads: int | None
    d_model: int | None


class FamilyJob(msgspec.Struct):
    """The family's newest stability job (its progress: `GET /api/v1/jobs/{id}`)."""

    id: int
    state: str
    reason: str
    run_id: int | None


class Family(msgspec.Struct):
    id: int
    name: str
    description: str | None
    anchor: ModelRef
    members: list[ModelRef]
    created_at: datetime
    settings: FamilySettings | None = None
    member_states: list[FamilyMember] = []
    stability_run_id: int | None = None  # the current stability run (null: none yet)
    job: FamilyJob | None = None
    origin: str | None = None  # api: POST /families; cli: `strata stability --store`


class NewFamily(msgspec.Struct, forbid_unknown_fields=True):
    """A refit family to make: registered models of one architecture, an anchor among them
    (default: the first), and how stability is computed (defaults as `strata stability`)."""

    name: FamilyName
    members: Annotated[list[ModelName], msgspec.Meta(min_length=1, max_length=1000)]
    anchor: ModelName | None = None
    description: Annotated[str, msgspec.Meta(max_length=2000)] | None = None
    n_prompts: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 32
    prompt_len: Annotated[int, msgspec.Meta(ge=3, le=100_000)] = 64
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] = 0
    n_null: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    cka_tokens: Annotated[int, msgspec.Meta(ge=16, le=10_000_000)] = 1024


class FamilyMembers(msgspec.Struct, forbid_unknown_fields=True):
    """Members to add: registered model names or ids."""

    members: Annotated[list[ModelName], msgspec.Meta(min_length=1, max_length=1000)]


class ComputeStability(msgspec.Struct, forbid_unknown_fields=True):
    """Queue the family's stability as a job (defaults: the job's usual ones)."""

    force: bool = False
    device: Annotated[str, msgspec.Meta(max_length=16)] | None = None
    queue: Annotated[
        str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    ] = "gpu"


class StabilityRow(msgspec.Struct):
    metric: str
    layer: int | None
    head: int | None
    relative_depth: float | None
    value: float
    stderr: float | None
    n: int
    unit: str


class Stability(msgspec.Struct):
    family: Family
    run: RunRef
    rows: list[StabilityRow]


class StabilityImportanceRow(msgspec.Struct):
    """One layer: how a head's stability across the refits goes with its ablation importance
    on the anchor, over the layer's heads."""

    layer: int
    relative_depth: float | None
    n_heads: int  # heads with both numbers
    pearson: float | None  # null with fewer than 3 heads or a constant column
    pearson_low: float | None  # 95% interval (Fisher z over heads); null with fewer than 4
    pearson_high: float | None
    spearman: float | None
    mean_stability: float
    mean_importance: float


class StabilityImportance(msgspec.Struct):
    family: Family
    stability_run: RunRef
    importance_run: RunRef  # the anchor's current heads run
    importance: str  # the per-head metric taken as importance
    rows: list[StabilityImportanceRow]
