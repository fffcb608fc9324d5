"""Jobs as the API shows them (`service.jobs` decides; this shapes)."""

from __future__ import annotations

import time

from service.api.queries.models_and_runs import utc
from service.jobs.board import WorkerSeen
from service.jobs.service import JobView
from service.schemas.jobs import Job, JobProgress, Worker


def job_out(view: JobView) -> Job:
    job, live = view.job, view.live
    progress = None
    if live is not None and live.total > 0:
        progress = JobProgress(
            live.done,
            live.total,
            round(live.done / live.total, 4),
            float(f"{live.tokens_per_s:.4g}"),  # slow real models sweep < 0.1 token/s
            None if live.eta_s is None else round(live.eta_s, 1),
        )
    wall = None
    if job.started_at is not None and job.finished_at is not None:
        wall = round((job.finished_at - job.started_at).total_seconds(), 3)
    return Job(
        id=job.id,
        state=job.state,
        model=view.model,
        model_id=job.model_id,
        run_id=job.run_id,
        config_hash=job.config_hash,
        metric_version=job.metric_version,
        families=list(job.families),
        device=job.device,
        dtype=job.dtype,
        reason=job.reason,
        queue=job.queue,
        forced=job.forced,
        created_at=utc(job.created_at),  # type: ignore[arg-type]
        started_at=utc(job.started_at),
        finished_at=utc(job.finished_at),
        wall_s=wall,
        progress=progress,
        worker=job.worker,
        attempts=job.attempts,
        error=job.error,
        config=dict(job.config),
    )


def worker_out(seen: WorkerSeen) -> Worker:
    return Worker(
        seen.name,
        seen.device,
        seen.dtype,
        list(seen.queues),
        seen.host,
        seen.pid,
        round(time.monotonic() - seen.last_seen, 1),
    )
