"""Job rows: the queries the job service makes (SQL lives here, decisions in
`service.jobs.service`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.store.tables import (
    LIVE_STATES,
    JobRow,
    RegisteredModelRow,
    RunResource,
    RunRow,
    TokenSource,
)


def get(session: Session, job_id: int) -> JobRow | None:
    return session.get(JobRow, job_id)


def live_for(session: Session, config_hash: str, metric_version: str) -> JobRow | None:
    """The queued or running job of a configuration, if any."""
    return session.scalars(
        sa.select(JobRow)
        .where(
            JobRow.config_hash == config_hash,
            JobRow.metric_version == metric_version,
            JobRow.state.in_(LIVE_STATES),
        )
        .order_by(JobRow.id.desc())
        .limit(1)
    ).first()


def latest_for(
    session: Session, config_hash: str, metric_version: str, states: tuple[str, ...] | None = None
) -> JobRow | None:
    query = sa.select(JobRow).where(
        JobRow.config_hash == config_hash, JobRow.metric_version == metric_version
    )
    if states is not None:
        query = query.where(JobRow.state.in_(states))
    return session.scalars(query.order_by(JobRow.id.desc()).limit(1)).first()


def succeeded_run(session: Session, config_hash: str, metric_version: str) -> RunRow | None:
    return session.scalars(
        sa.select(RunRow).where(
            RunRow.config_hash == config_hash,
            RunRow.metric_version == metric_version,
            RunRow.status == "succeeded",
        )
    ).first()


def model(session: Session, ref: str) -> RegisteredModelRow | None:
    """A registered model by id, or by name (the latest registration of that name)."""
    if ref.isascii() and ref.isdigit() and len(ref) < 19:  # an id that fits a BIGINT
        found = session.get(RegisteredModelRow, int(ref))
        if found is not None:
            return found
    return session.scalars(
        sa.select(RegisteredModelRow)
        .where(RegisteredModelRow.name == ref)
        .order_by(RegisteredModelRow.id.desc())
        .limit(1)
    ).first()


def model_names(session: Session) -> dict[int, str]:
    return dict(session.execute(sa.select(RegisteredModelRow.id, RegisteredModelRow.name)).all())


def all_models(session: Session) -> list[RegisteredModelRow]:
    return list(session.scalars(sa.select(RegisteredModelRow).order_by(RegisteredModelRow.id)))


def token_source(session: Session, ref: str) -> TokenSource | None:
    return session.get(TokenSource, int(ref)) if ref.isdigit() else None


def page(
    session: Session, *, state: str | None, model_id: int | None, limit: int, offset: int
) -> tuple[list[JobRow], int]:
    """Jobs, newest first, filtered; and how many match."""
    where = []
    if state is not None:
        where.append(JobRow.state == state)
    if model_id is not None:
        where.append(JobRow.model_id == model_id)
    total = session.scalar(sa.select(sa.func.count()).select_from(JobRow).where(*where)) or 0
    rows = session.scalars(
        sa.select(JobRow).where(*where).order_by(JobRow.id.desc()).limit(limit).offset(offset)
    )
    return list(rows), int(total)


def finished_by(
    session: Session, workers: list[str], per_worker: int
) -> list[tuple[JobRow, RegisteredModelRow, dict[str, Any] | None]]:
    """The newest succeeded run jobs (not stability jobs) of each of `workers`, with their
    models and their runs' recorded timings (None where the run recorded none): what a worker's
    measured rate is taken over."""
    out: list[tuple[JobRow, RegisteredModelRow, dict[str, Any] | None]] = []
    for worker in workers:
        rows = session.execute(
            sa.select(JobRow, RegisteredModelRow, RunResource.timings_s)
            .join(RegisteredModelRow, RegisteredModelRow.id == JobRow.model_id)
            .outerjoin(RunResource, RunResource.run_id == JobRow.run_id)
            .where(
                JobRow.worker == worker,
                JobRow.state == "succeeded",
                JobRow.started_at.is_not(None),
                JobRow.finished_at.is_not(None),
            )
            .order_by(JobRow.id.desc())
            .limit(per_worker)
        )
        out += [(job, model, timings) for job, model, timings in rows.tuples()]
    return out


def in_state(session: Session, state: str) -> list[JobRow]:
    return list(session.scalars(sa.select(JobRow).where(JobRow.state == state).order_by(JobRow.id)))


def recent(session: Session, limit: int) -> list[JobRow]:
    return list(session.scalars(sa.select(JobRow).order_by(JobRow.id.desc()).limit(limit)))


def busy_by_queue(session: Session) -> dict[str, int]:
    """Per queue: jobs a worker runs or whose message waits in the broker."""
    busy = sa.or_(
        JobRow.state == "running",
        sa.and_(JobRow.state == "queued", JobRow.dispatched_at.is_not(None)),
    )
    rows = session.execute(
        sa.select(JobRow.queue, sa.func.count()).where(busy).group_by(JobRow.queue)
    )
    return {str(queue): int(n) for queue, n in rows.all()}


def unsent(
    session: Session, *, background: tuple[str, ...], held: bool, limit: int | None = None
) -> list[tuple[int, int, str]]:
    """(id, dispatch, queue) of queued jobs no message was sent for, oldest first: the
    background ones (reason in `background`) when `held`, the others (people's) otherwise."""
    reason = JobRow.reason.in_(background)
    query = (
        sa.select(JobRow.id, JobRow.dispatch, JobRow.queue)
        .where(
            JobRow.state == "queued",
            JobRow.dispatched_at.is_(None),
            reason if held else sa.not_(reason),
        )
        .order_by(JobRow.id)
        .limit(limit)
    )
    return [(int(i), int(d), str(q)) for i, d, q in session.execute(query).all()]


def latest_stability_job(session: Session, family: str) -> JobRow | None:
    """The newest stability job of refit family `family`."""
    return session.scalars(
        sa.select(JobRow)
        .where(
            sa.func.json_extract_string(JobRow.config, "$.kind") == "stability",
            sa.func.json_extract_string(JobRow.config, "$.refit_family") == family,
        )
        .order_by(JobRow.id.desc())
        .limit(1)
    ).first()


def queued_stability_jobs(session: Session, family: str) -> list[JobRow]:
    """Refit family `family`'s stability jobs that no worker has started (state `queued`)."""
    return list(
        session.scalars(
            sa.select(JobRow)
            .where(
                sa.func.json_extract_string(JobRow.config, "$.kind") == "stability",
                sa.func.json_extract_string(JobRow.config, "$.refit_family") == family,
                JobRow.state == "queued",
            )
            .order_by(JobRow.id)
        )
    )
