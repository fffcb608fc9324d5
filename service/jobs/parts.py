"""What the job service (`service.py`) and the refit families' stability jobs (`families.py`)
share: a job as the API shows it, a job to create, and the mark of a delivered job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from service.jobs.board import Live
from service.jobs.errors import JobConflictError, JobNotFoundError
from service.schemas.jobs import Estimate
from service.store import job_rows
from service.store.errors import IngestError
from service.store.tables import JobRow, utcnow


@dataclass(frozen=True)
class JobView:
    """A job as the API shows it: its row, its live progress, its model's name, and (in the
    answer to its submission) what it would cost."""

    job: JobRow
    live: Live | None
    model: str
    estimate: Estimate | None = None


@dataclass(frozen=True)
class NewJob:
    """A job to create: what it computes (its configuration, hash and version) and where."""

    model_id: int  # the model whose run it stores (a stability job: the family's anchor)
    config_hash: str
    metric_version: str
    config: dict[str, Any]
    families: list[str]
    device: str | None
    dtype: str
    queue: str
    force: bool = False


def mark_succeeded(session: Session, job_id: int, identity: tuple[str, str], run_id: int) -> None:
    """In the ingest's transaction: the job succeeded with run `run_id`. Refused (and so
    nothing stored) for a cancelled job (`JobConflictError`) or results of another
    configuration (`identity`: config hash, metric version) than the job's (`IngestError`)."""
    job = job_rows.get(session, job_id)
    if job is None:
        raise JobNotFoundError(f"job {job_id} does not exist")
    if job.state == "cancelled":
        raise JobConflictError(f"job {job_id} was cancelled; its results are not stored")
    if (job.config_hash, job.metric_version) != identity:
        raise IngestError(
            f"these results are for configuration {identity[0][:12]}…, not job {job_id}'s "
            f"{job.config_hash[:12]}…"
        )
    job.state, job.run_id, job.error = "succeeded", run_id, None
    job.finished_at = utcnow()
    session.flush()
