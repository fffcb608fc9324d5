"""Pieces shared by several answers: references to a model and a run."""

from __future__ import annotations

from datetime import datetime

import msgspec


class ModelRef(msgspec.Struct):
    id: int
    name: str
    n_layers: int | None


class RunRef(msgspec.Struct):
    """The run a data answer was read from, and why. `stderr_basis`: what its stderr and n
    count — "sequence" (metric version 2 on: n = sequences) or "token" (version 1: n = tokens).

    `selected_by`: `pinned` (an operator pinned it), `default` (the model's default
    configuration's run, what reconciliation computes), `latest` (neither exists for the family:
    the model's latest succeeded run that computed it) or `run_id` (the request named it).
    `canonical`: the run is the model's canonical run for the family (pinned or default).
    The rest describes its configuration: `config_hash` (`GET /runs/{id}` has all of it), token
    source kind, sequences (0: all the source has), tokens per sequence, dtype, families."""

    id: int
    metric_version: str
    finished_at: datetime | None
    stderr_basis: str = "sequence"
    selected_by: str = "default"
    canonical: bool = True
    config_hash: str = ""
    tokens: str | None = None
    n_sequences: int | None = None
    seq_len: int | None = None
    dtype: str | None = None
    families: list[str] = []
