"""Ingest: a run's results into the store, all at once or not at all.

1. Everything is checked first, in Arrow (`rows.prepare_rows`): nothing is written for a run
   that is refused, and the message names the problem.
2. One transaction: register the model and token source if new; find the run by (config hash,
   metric version) — or by id, for results delivered to a queued run — and create it if new;
   delete that run's old rows; bulk-insert the new ones from Arrow tables with DuckDB's own
   `INSERT ... SELECT` on the raw connection (never row by row); store the stage boundaries
   inferred from these records (`stages.py`, for runs with intervention, logit_lens and neurons);
   mark the run succeeded; commit.
   Readers see the previous rows until the commit, the new ones after it. A process killed before
   the commit leaves the previous rows intact (DuckDB's write-ahead log holds only committed work).

>>> run_id = ingest_result(store, result).run_id     # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.run import CODE_VERSION, RunResult
from service.schemas.runs import IngestSummary
from service.store.boundaries import infer_boundaries, store_boundaries
from service.store.db import Store, raw_connection
from service.store.errors import IngestError, RunNotFoundError
from service.store.registry import record_parity, register_model, register_token_source
from service.store.rows import PreparedRows, parse_model_info, prepare_rows
from service.store.runs import find_run
from service.store.tables import (
    NEURON_COLUMNS,
    NEURON_TOKEN_COLUMNS,
    RESULT_COLUMNS,
    SEQUENCE_MEAN_COLUMNS,
    RunLens,
    RunResource,
    RunRow,
    StageBoundary,
    utcnow,
)

# Test seam: called inside the ingest transaction after the new rows are written, before commit.
before_commit: Callable[[], None] | None = None

# Tables owned by a run, children first (DuckDB has no ON DELETE CASCADE).
_RUN_ROWS = (
    ("neuron_tokens", NEURON_TOKEN_COLUMNS),
    ("neurons", NEURON_COLUMNS),
    ("results", RESULT_COLUMNS),
    ("sequence_means", SEQUENCE_MEAN_COLUMNS),
)


def ingest_result(
    store: Store,
    result: RunResult,
    *,
    run_id: int | None = None,
    also: Callable[[Session, IngestSummary], None] | None = None,
) -> IngestSummary:
    """Store a computed run. Same configuration hash and metric version -> the run is replaced.

    With `run_id`, the results are for that (queued or running) run, which must exist and have
    been created for the same configuration. `also` runs inside the same transaction once the
    rows are written (a job marked succeeded with its results, or neither); an exception from it
    rolls everything back. Raises `IngestError` (nothing stored) on bad input.
    """
    if result.config.config_hash() != result.config_hash:
        raise IngestError(
            f"config_hash {result.config_hash[:12]}… does not match the run's configuration "
            f"({result.config.config_hash()[:12]}…): results and configuration were mixed up"
        )
    info = parse_model_info(result.model_info)
    if info.parity is not None and info.parity.get("passed") is False:
        raise IngestError(
            "these results come from a model that failed its parity check (Strata's forward "
            "is not the Hugging Face model's): refused, nothing stored"
        )
    rows = prepare_rows(result.records, result.neuron_tokens, info, result.sequence_means)
    if result.tokens_evaluated < 0:
        raise IngestError(f"tokens_evaluated is negative ({result.tokens_evaluated})")
    boundaries = infer_boundaries(
        result.records, result.config.families, info.n_layers, rows.sequence_means
    )
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        run = _target_run(session, result, run_id)
        replaced = run is not None and run.n_records is not None
        model = register_model(session, result.config.model, info)
        tokens = register_token_source(session, result.config.tokens)
        if run is None:
            run = RunRow(
                config_hash=result.config_hash, metric_version=result.config.metric_version
            )
            session.add(run)
        _describe(run, result, model.id, tokens.id, rows)
        session.flush()
        record_parity(session, model, info, run.id)
        raw = raw_connection(conn)
        if replaced:
            delete_run_rows(session, run.id)
        for (table, columns), data in zip(
            _RUN_ROWS,
            (rows.neuron_tokens, rows.neurons, rows.results, rows.sequence_means),
            strict=True,
        ):
            bulk_insert(raw, table, columns, run.id, data)
        store_boundaries(session, run.id, model.id, boundaries)
        if result.lens is not None:
            session.add(lens_row(run.id, result.lens))
        if result.timings_s or result.memory:
            session.add(resource_row(run.id, result.timings_s, result.memory))
        session.flush()
        summary = IngestSummary(
            run.id,
            model.id,
            replaced,
            rows.results.num_rows,
            rows.neurons.num_rows,
            rows.neuron_tokens.num_rows,
            len(boundaries),
            rows.sequence_means.num_rows,
        )
        if also is not None:
            also(session, summary)
        if before_commit is not None:
            before_commit()
        return summary


def _target_run(session: Session, result: RunResult, run_id: int | None) -> RunRow | None:
    """The stored run these results belong to (None: a new run)."""
    version = result.config.metric_version
    if run_id is not None:
        run = session.get(RunRow, run_id)
        if run is None:
            raise RunNotFoundError(f"run {run_id} does not exist")
        if (run.config_hash, run.metric_version) != (result.config_hash, version):
            raise IngestError(
                f"these results are for configuration {result.config_hash[:12]}… (metric "
                f"version {version}) but run {run_id} was created for "
                f"{run.config_hash[:12]}… (metric version {run.metric_version})"
            )
        return run
    return find_run(session, result.config_hash, version)


def _describe(
    run: RunRow, result: RunResult, model_id: int, token_source_id: int, rows: PreparedRows
) -> None:
    now = utcnow()
    run.model_id, run.token_source_id = model_id, token_source_id
    run.code_version = result.environment.get("strata", CODE_VERSION)
    run.families = sorted(result.config.families)
    run.config = json.loads(result.config.canonical_json())
    run.status, run.progress, run.error = "succeeded", 1.0, None
    run.started_at = run.started_at or now - timedelta(seconds=max(result.wall_s, 0.0))
    run.finished_at = now
    run.device, run.dtype = result.device, result.config.model.dtype
    run.tokens_evaluated, run.wall_s = result.tokens_evaluated, result.wall_s
    run.environment = dict(result.environment)
    run.n_records = rows.n_records


def resource_row(run_id: int, timings_s: dict[str, float], memory: dict[str, Any]) -> RunResource:
    """The `run_resources` row of a run: its phases' seconds and measured peak memory
    (`RunResult.timings_s`, `RunResult.memory`; a delivery's are checked where it is decoded,
    `service.api.queries.ingest.RunMetadata`)."""
    return RunResource(
        run_id=run_id,
        timings_s=dict(timings_s),
        host_peak_rss_mib=memory.get("host_peak_rss_mib"),
        host_peak_scope=memory.get("host_peak_scope"),
        device_peak_allocated_mib=memory.get("device_peak_allocated_mib"),
    )


def lens_row(run_id: int, lens: dict[str, object]) -> RunLens:
    """The `run_lenses` row of the tuned lens a run evaluated (`RunResult.lens`)."""
    key, trained = lens.get("key"), lens.get("trained")
    if not isinstance(key, str) or not isinstance(trained, bool):
        raise IngestError(
            "the run's tuned_lens metadata needs a string 'key' and a boolean 'trained' "
            f"(got {key!r}, {trained!r})"
        )
    return RunLens(run_id=run_id, key=key, trained=trained, info=dict(lens))


def delete_run_rows(session: Session, run_id: int) -> None:
    """Delete a run's record, neuron, token, stage and lens rows (inside the caller's
    transaction)."""
    raw = raw_connection(session.connection())
    for table, _ in _RUN_ROWS:
        raw.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
    session.execute(sa.delete(StageBoundary).where(StageBoundary.run_id == run_id))
    session.execute(sa.delete(RunLens).where(RunLens.run_id == run_id))
    session.execute(sa.delete(RunResource).where(RunResource.run_id == run_id))


def bulk_insert(
    raw: object, table: str, columns: tuple[str, ...], run_id: int, data: pa.Table
) -> None:
    if data.num_rows == 0:
        return
    view = f"strata_ingest_{table}"
    names = [c for c in columns if c != "run_id"]
    quoted = ", ".join(f'"{c}"' for c in names)
    raw.register(view, data)  # type: ignore[attr-defined]
    try:
        raw.execute(  # type: ignore[attr-defined]
            f'INSERT INTO {table} ("run_id", {quoted}) SELECT {int(run_id)}, {quoted} FROM {view}'
        )
    finally:
        raw.unregister(view)  # type: ignore[attr-defined]
