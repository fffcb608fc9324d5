"""Refit families and their head stability."""

from __future__ import annotations

from datetime import datetime

import msgspec

from service.schemas.common import ModelRef, RunRef


class Family(msgspec.Struct):
    id: int
    name: str
    description: str | None
    anchor: ModelRef
    members: list[ModelRef]
    created_at: datetime


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
