"""A run's life: queued -> running (with progress) -> succeeded (by ingest) or failed.

`enqueue` returns the existing run for a configuration that is already stored (same config hash
and metric version) instead of creating a second one; a failed one is queued again.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.run import CODE_VERSION, RunConfig
from service.store.db import Store
from service.store.errors import RunNotFoundError, StoreError
from service.store.registry import register_model, register_token_source
from service.store.tables import RunRow, utcnow


def find_run(session: Session, config_hash: str, metric_version: str) -> RunRow | None:
    return session.scalars(
        sa.select(RunRow).where(
            RunRow.config_hash == config_hash, RunRow.metric_version == metric_version
        )
    ).one_or_none()


def enqueue(store: Store, config: RunConfig) -> RunRow:
    """The run for `config`: the stored one if any (a failed one is re-queued), else a new one."""
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        run = find_run(session, config.config_hash(), config.metric_version)
        if run is None:
            model = register_model(session, config.model, None)
            tokens = register_token_source(session, config.tokens)
            run = RunRow(
                model_id=model.id,
                token_source_id=tokens.id,
                config_hash=config.config_hash(),
                metric_version=config.metric_version,
                code_version=CODE_VERSION,
                families=sorted(config.families),
                config=json.loads(config.canonical_json()),
                status="queued",
                progress=0.0,
                dtype=config.model.dtype,
            )
            session.add(run)
        elif run.status == "failed":
            run.status, run.progress, run.error = "queued", 0.0, None
            run.started_at = run.finished_at = None
        session.flush()
        return run


def _update(store: Store, run_id: int, **values: object) -> None:
    with store.write() as conn:
        updated = conn.execute(
            sa.update(RunRow).where(RunRow.id == run_id).values(**values)
        ).rowcount
    if not updated:
        raise RunNotFoundError(f"run {run_id} does not exist")


def mark_running(store: Store, run_id: int, *, device: str | None = None) -> None:
    _update(store, run_id, status="running", started_at=utcnow(), progress=0.0, device=device)


def set_progress(store: Store, run_id: int, fraction: float) -> None:
    if not 0.0 <= fraction <= 1.0:
        raise StoreError(f"progress must be within [0, 1], got {fraction}")
    _update(store, run_id, progress=fraction)


def mark_failed(store: Store, run_id: int, error: str) -> None:
    """A failed run keeps its previous rows (if an earlier ingest stored any) out of sight: only
    succeeded runs are current."""
    _update(store, run_id, status="failed", error=error, finished_at=utcnow())
