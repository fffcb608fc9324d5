"""Jobs as the API shows them (`service.jobs` decides; this shapes)."""

from __future__ import annotations

import time

from compute.errors import SpecError
from service.api.queries.models_and_runs import utc
from service.jobs.board import WorkerSeen
from service.jobs.configs import JobRequest
from service.jobs.errors import BrokerUnavailableError
from service.jobs.estimate import describe
from service.jobs.service import JobService, JobView
from service.schemas.jobs import Job, JobProgress, Worker
from service.schemas.models import DefaultRun
from service.settings import Settings
from service.store.tables import RegisteredModelRow


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
        estimate=view.estimate,
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


def default_run_of(
    jobs: JobService,
    settings: Settings,
    model: RegisteredModelRow,
    *,
    asked: bool,
    created: bool,
) -> DefaultRun:
    """What a registration does about the model's default run, and says: queued now (asked
    for), left to reconciliation (within `STRATA_JOBS__AUTO_RUN_MAX_TFLOP`), or not queued —
    with its estimate and how to ask for it."""
    try:
        config, found, automatic = jobs.default_run_plan(model)
    except SpecError as exc:
        return DefaultRun(False, None, None, f"the model has no default run: {exc}")
    cost = describe(found)
    how = (
        f"ask for it with `strata jobs submit --model {model.name}` (POST /api/v1/jobs "
        f'{{"model": "{model.name}"}}), or register with default_run: true '
        "(`strata models add --compute`)"
    )
    existing = jobs.default_job(config)
    if asked:
        try:
            view, _ = jobs.submit(JobRequest(model=str(model.id)))
        except BrokerUnavailableError as exc:
            return DefaultRun(False, None, found, f"not queued: {exc} ({cost})")
        return DefaultRun(True, view.job.id, found, f"queued as asked: {cost}")
    if existing is not None:
        return DefaultRun(
            True,
            existing.id,
            found,
            f"already queued (job {existing.id}, {existing.state}): {cost}",
        )
    if not settings.jobs.reconcile:
        return DefaultRun(
            False,
            None,
            found,
            f"not queued: reconciliation is off (STRATA_JOBS__RECONCILE=false) ({cost}); {how}",
        )
    if not automatic:
        limit = settings.jobs.auto_run_max_tflop
        why = (
            "its cost is unknown before the model is loaded"
            if found.flops is None
            else f"its estimate is above STRATA_JOBS__AUTO_RUN_MAX_TFLOP ({limit:g} TFLOP)"
        )
        return DefaultRun(False, None, found, f"not queued: {why} ({cost}); {how}")
    if created:
        jobs.reconcile_soon()
    return DefaultRun(True, None, found, f"queued by reconciliation: {cost}")
