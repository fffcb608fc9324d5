"""Pieces shared by several answers: references to a model and a run."""

from __future__ import annotations

from datetime import datetime

import msgspec


class ModelRef(msgspec.Struct):
    id: int
    name: str
    n_layers: int | None


class RunRef(msgspec.Struct):
    """The run a data answer was read from. `stderr_basis`: what its stderr and n count —
    "sequence" (metric version 2 on: n = sequences) or "token" (version 1: n = tokens)."""

    id: int
    metric_version: str
    finished_at: datetime | None
    stderr_basis: str = "sequence"
