"""Refit families and their head stability."""

from __future__ import annotations

from datetime import datetime

import msgspec

from service.api.schemas.common import ModelRef, RunRef


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
