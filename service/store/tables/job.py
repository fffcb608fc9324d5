"""`jobs`: a request to compute one run configuration, and where that request stands.

A job is queued by the API (a submission, a reconciliation, a watched folder), taken by one
worker at a time, and ends `succeeded` (its results are stored: `run_id`), `failed` (with the
reason) or `cancelled`. The same configuration (config hash + metric version) has at most one
live job: submitting it again returns that job.

`dispatch` numbers the messages sent to the broker for this job: a worker may start the job only
with the current number, so a message that was re-sent after its worker was lost, or redelivered
by the broker, can never run the job twice. Progress and leases live in the API's memory (they
change every few seconds; writing them would churn the database), only transitions are stored.
The table has no foreign keys or unique indexes: DuckDB rewrites an indexed row on update, and
a job row is updated at every transition.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
LIVE_STATES: tuple[str, ...] = ("queued", "running")
FINAL_STATES: tuple[str, ...] = ("succeeded", "failed", "cancelled")


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Sequence("jobs_id_seq"), primary_key=True)
    model_id: Mapped[int] = mapped_column(sa.BigInteger)
    config_hash: Mapped[str] = mapped_column(sa.String(64))
    metric_version: Mapped[str]
    config: Mapped[dict[str, Any]]
    families: Mapped[list[str]]
    device: Mapped[str | None]
    dtype: Mapped[str]
    state: Mapped[str]
    reason: Mapped[str]
    queue: Mapped[str]
    forced: Mapped[bool]
    dispatch: Mapped[int]
    attempts: Mapped[int]
    worker: Mapped[str | None]
    error: Mapped[str | None]
    run_id: Mapped[int | None] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    dispatched_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
