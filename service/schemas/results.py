"""Per-layer and per-head rows of one model's run, and the same metric across models."""

from __future__ import annotations

from typing import Any

import msgspec

from service.schemas.common import ModelRef, RunRef


class MetricRow(msgspec.Struct):
    metric: str
    component: str | None
    layer: int | None
    relative_depth: float | None
    value: float
    stderr: float | None
    n: int
    unit: str


class MetricRows(msgspec.Struct):
    model: ModelRef
    run: RunRef
    metric: str
    component: str | None
    rows: list[MetricRow]


class SequenceRow(msgspec.Struct):
    """One sequence's mean of a per-layer (or per-head) metric: the sample whose spread is the
    row's `stderr` (docs/metrics.md: the sequence is the unit)."""

    metric: str
    component: str | None
    layer: int | None
    head: int | None
    sequence: int
    value: float
    unit: str


class SequenceRows(msgspec.Struct):
    model: ModelRef
    run: RunRef
    metric: str
    component: str | None
    rows: list[SequenceRow]


class HeadRow(msgspec.Struct):
    metric: str
    layer: int | None
    head: int
    relative_depth: float | None
    value: float
    stderr: float | None
    n: int
    unit: str


class HeadRows(msgspec.Struct):
    model: ModelRef
    run: RunRef
    metric: str
    rows: list[HeadRow]


class CompareModel(msgspec.Struct):
    """A compared model; `run_id` null when it has no run computing the metric."""

    id: int
    name: str
    n_layers: int | None
    run_id: int | None
    n_points: int
    stderr_basis: str | None = None  # "sequence" or "token" (docs/metrics.md); null: no run
    run: RunRef | None = None  # the run read, why, and its configuration; null: no run


class CompareRow(msgspec.Struct):
    """One model's value in one relative-depth bin [bin_lo, bin_hi) (the last bin is closed)."""

    model: str
    model_id: int
    run_id: int
    bin: int
    bin_lo: float
    bin_hi: float
    relative_depth: float
    value: float | None
    stderr: float | None
    n_points: int
    n: int | None
    unit: str


class Comparison(msgspec.Struct):
    metric: str
    component: str | None
    bins: int
    method: str
    models: list[CompareModel]
    rows: list[CompareRow]


def columns(row_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The columns of a data answer: the row type's fields, in order."""
    return tuple(row_type.__struct_fields__)


Rows = list[dict[str, Any]]
