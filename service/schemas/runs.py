"""Runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from service.schemas.models import ParityReport


class Timings(msgspec.Struct):
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    wall_s: float | None


class RunResources(msgspec.Struct):
    """Where a run's time went and the peak memory it reached, as its worker measured them
    (`compute.run`; runs stored before these were kept have none): `timings_s`, seconds by phase
    (load, the tuned lens's training, the clean pass, each family); `host_peak_rss_mib`, the
    process's peak resident memory since the run started (`host_peak_scope` "run") or over the
    process's life where the kernel could not restart the mark ("process"); on a CUDA device,
    `device_peak_allocated_mib`, PyTorch's peak allocation (null elsewhere)."""

    timings_s: dict[str, float]
    host_peak_rss_mib: int | None
    host_peak_scope: str | None
    device_peak_allocated_mib: int | None


class Run(msgspec.Struct):
    id: int
    model_id: int
    model: str
    status: str
    progress: float
    error: str | None
    families: list[str]
    config_hash: str
    metric_version: str
    stderr_basis: str  # what stderr and n count: "sequence" (version 2 on) or "token" (1)
    code_version: str
    config: dict[str, Any]
    device: str | None
    dtype: str
    tokens_evaluated: int | None
    n_records: int | None
    token_source_id: int
    timings: Timings
    environment: dict[str, Any] | None
    # The parity report of this run's own load, at its dtype (null for runs stored before it).
    parity: ParityReport | None = None
    # The tuned lens this run evaluated (runs with the tuned_lens family): `key`, `trained`
    # (false: a stored lens was reused or named) and the training budget used.
    tuned_lens: dict[str, Any] | None = None
    # Its phases' seconds and peak memory, measured (null for runs stored before they were kept).
    resources: RunResources | None = None


class RunPage(msgspec.Struct):
    items: list[Run]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class IngestSummary(msgspec.Struct):
    """What an ingest stored: the store's answer (`service.store.ingest.ingest_result`) and the
    API's, one type."""

    run_id: int
    model_id: int
    replaced: bool
    results: int
    neurons: int
    neuron_tokens: int
    stage_boundaries: int
    sequence_means: int = 0
