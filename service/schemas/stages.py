"""Stage boundaries with their evidence, and per-stage aggregates of a metric."""

from __future__ import annotations

from typing import Any

import msgspec

from service.schemas.common import RunRef


class Boundary(msgspec.Struct):
    """Boundary k ends stage k: `layer` is the first block of stage k+1 (null: not clear).

    `clear` equals `found`; `estimate` is the rule's best layer even when not clear;
    `sharpness` how abrupt the change is (the change over the curve's robust noise); `range`
    [lo, hi] the hull of its signals' own positions; `interval` [lo, hi] the seeded
    percentile bootstrap interval over sequences at `interval_level` (null for runs without
    per-sequence means, or boundaries stored before intervals existed: see
    `evidence.bootstrap.reason`). docs/metrics.md: stages.*."""

    boundary: int
    ends_stage: str
    found: bool
    layer: int | None
    relative_depth: float | None
    rule: str
    evidence: dict[str, Any]
    clear: bool = False
    estimate: int | None = None
    sharpness: float | None = None
    range: list[int] | None = None
    interval: list[int] | None = None
    interval_relative_depth: list[float] | None = None
    interval_level: float | None = None


class ModelStages(msgspec.Struct):
    id: int
    name: str
    n_layers: int | None
    run_id: int | None
    metric_run_id: int | None
    boundaries: list[Boundary]
    # the runs behind `run_id` and `metric_run_id`: why each was read, its configuration
    run: RunRef | None = None
    metric_run: RunRef | None = None


class StageRow(msgspec.Struct):
    """One stage of one model: its blocks [layer_start, layer_end] and, with a metric, the mean
    of the metric over them. `clear` is false when a bounding boundary was not found (then the
    span and the aggregate are null)."""

    model: str
    model_id: int
    stage: int
    stage_name: str
    clear: bool
    layer_start: int | None
    layer_end: int | None
    relative_depth_start: float | None
    relative_depth_end: float | None
    metric: str | None
    component: str | None
    value: float | None
    stderr: float | None
    layer_std: float | None
    n_points: int
    unit: str | None


class Stages(msgspec.Struct):
    metric: str | None
    component: str | None
    models: list[ModelStages]
    rows: list[StageRow]
