"""/jobs: submit, follow and cancel computations; the endpoints workers report through; and
/workers, the workers heard from recently."""

from __future__ import annotations

from typing import Annotated

import anyio
import msgspec
from litestar import Controller, Response, delete, get, post
from litestar.params import Parameter

from service.api.auth import SECURITY, require_write_key
from service.api.errors import BadRequestHttpError, ServiceUnavailableHttpError
from service.api.queries.jobs import job_out, worker_out
from service.api.ratelimit import NO_RATE_LIMIT
from service.api.respond import ApiContext, errors
from service.jobs.board import WorkerSeen
from service.jobs.configs import JobRequest, LensRequest
from service.jobs.service import JobService
from service.schemas.jobs import (
    Claim,
    Claimed,
    Failure,
    Heartbeat,
    HeartbeatAnswer,
    Job,
    JobPage,
    Reconciled,
    SubmitJob,
    Worker,
    WorkerBeat,
)

JobId = Annotated[int, Parameter(ge=1, le=2**62, description="job id")]


def jobs_of(ctx: ApiContext) -> JobService:
    if ctx.jobs is None:
        raise ServiceUnavailableHttpError("this service runs no job system")
    return ctx.jobs


class JobsController(Controller):
    path = "/api/v1/jobs"
    tags = ["jobs"]  # noqa: RUF012

    @post(
        "/",
        status_code=202,
        responses=errors(400, 401, 403, 404, 422, 503),
        guards=[require_write_key],
        security=SECURITY,
    )
    async def submit(self, ctx: ApiContext, data: SubmitJob) -> Response[Job]:
        """Queue a computation (API key). 202 with the new job; the same configuration submitted
        again answers 200 with its existing job (one job, one run) unless `force` is true.
        Refused with 422 before anything is queued: unknown model or family, seq_len beyond the
        model's context, a device no worker has, tuned-lens settings without the tuned_lens
        family, a stored lens that does not exist or does not fit the model, a lens to train on
        a token source with no training split (a `.npy`, the Pile). 503 when the broker is
        down."""
        request = JobRequest(
            model=data.model,
            metrics=tuple(data.metrics) if data.metrics is not None else None,
            tokens=data.tokens,
            n_sequences=data.n_sequences,
            seq_len=data.seq_len,
            device=data.device,
            dtype=data.dtype,
            force=data.force,
            queue=data.queue,
            tuned_lens=(
                LensRequest(**msgspec.structs.asdict(data.tuned_lens))
                if data.tuned_lens is not None
                else None
            ),
        )
        view, new = await anyio.to_thread.run_sync(jobs_of(ctx).submit, request)
        return Response(job_out(view), status_code=202 if new else 200)

    @get("/", sync_to_thread=True, responses=errors(400, 404, 422))
    def list_jobs(
        self,
        ctx: ApiContext,
        job_state: Annotated[
            str | None,
            Parameter(
                query="state",
                max_length=16,
                description=("queued, running, succeeded, failed or cancelled"),
            ),
        ] = None,
        model: Annotated[
            str | None, Parameter(max_length=1000, description=("jobs of this model (name or id)"))
        ] = None,
        limit: Annotated[int, Parameter(ge=1, le=10_000)] = 100,
        offset: Annotated[int, Parameter(ge=0, le=10**9)] = 0,
    ) -> JobPage:
        """Jobs, newest first, with live progress for running ones."""
        if limit > ctx.settings.api.max_page_size:
            raise BadRequestHttpError(f"limit is at most {ctx.settings.api.max_page_size}")
        views, total = jobs_of(ctx).page(state=job_state, model=model, limit=limit, offset=offset)
        return JobPage([job_out(v) for v in views], total)

    @get("/{job_id:int}", sync_to_thread=True, responses=errors(400, 404))
    def get_job(self, ctx: ApiContext, job_id: JobId) -> Job:
        """A job: state, progress (units done of total, tokens/s, ETA) while running, timings,
        the worker that ran it, the run it stored, the error if it failed."""
        return job_out(jobs_of(ctx).get(job_id))

    @delete(
        "/{job_id:int}",
        status_code=200,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 404, 409),
        guards=[require_write_key],
        security=SECURITY,
    )
    def cancel(self, ctx: ApiContext, job_id: JobId) -> Job:
        """Cancel (API key): a queued job never starts; a running one stops at its worker's next
        heartbeat and stores nothing. 409 for a job that already ended."""
        return job_out(jobs_of(ctx).cancel(job_id))

    @post(
        "/reconcile",
        status_code=200,
        sync_to_thread=True,
        responses=errors(401, 403),
        guards=[require_write_key],
        security=SECURITY,
        opt={NO_RATE_LIMIT: True},
    )
    def reconcile(self, ctx: ApiContext) -> Reconciled:
        """Queue the default run of every registered model that lacks current results (what
        beat asks for on its schedule); nothing when reconciliation is off
        (`STRATA_JOBS__RECONCILE=false`)."""
        return Reconciled(jobs_of(ctx).reconcile())

    # -------------------------------------------------- what workers call
    @post(
        "/{job_id:int}/claim",
        status_code=200,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 404, 409),
        guards=[require_write_key],
        security=SECURITY,
        opt={NO_RATE_LIMIT: True},
    )
    def claim(self, ctx: ApiContext, job_id: JobId, data: Claim) -> Claimed:
        """A worker starts a job (API key): allowed once per dispatch of a queued job."""
        got = jobs_of(ctx).claim(job_id, data.dispatch, data.worker, data.device)
        return Claimed(got.config, got.device, got.attempt)

    @post(
        "/{job_id:int}/heartbeat",
        status_code=200,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 404),
        guards=[require_write_key],
        security=SECURITY,
        opt={NO_RATE_LIMIT: True},
    )
    def heartbeat(self, ctx: ApiContext, job_id: JobId, data: Heartbeat) -> HeartbeatAnswer:
        """A running job's progress and lease (API key); `stop` tells the worker to stop."""
        stop = jobs_of(ctx).heartbeat(
            job_id,
            data.dispatch,
            data.worker,
            done=data.done,
            total=data.total,
            tokens_per_s=data.tokens_per_s,
            elapsed_s=data.elapsed_s,
        )
        return HeartbeatAnswer(stop)

    @post(
        "/{job_id:int}/fail",
        status_code=200,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 404, 409),
        guards=[require_write_key],
        security=SECURITY,
        opt={NO_RATE_LIMIT: True},
    )
    def fail(self, ctx: ApiContext, job_id: JobId, data: Failure) -> Job:
        """A worker reports that a job failed (API key), with the reason."""
        return job_out(jobs_of(ctx).fail(job_id, data.dispatch, data.worker, data.error))


class WorkersController(Controller):
    path = "/api/v1/workers"
    tags = ["jobs"]  # noqa: RUF012

    @get("/", sync_to_thread=False)
    def list_workers(self, ctx: ApiContext) -> list[Worker]:
        """Workers heard from in the last minute: name, device, queues."""
        service = jobs_of(ctx)
        return [worker_out(w) for w in service.board.workers(service.worker_window())]

    @post(
        "/heartbeat",
        status_code=204,
        sync_to_thread=False,
        responses=errors(400, 401, 403),
        guards=[require_write_key],
        security=SECURITY,
        opt={NO_RATE_LIMIT: True},
    )
    def heartbeat(self, ctx: ApiContext, data: WorkerBeat) -> None:
        """A worker says it is alive, and what it runs on (API key)."""
        jobs_of(ctx).board.worker_seen(
            WorkerSeen(data.name, data.device, data.dtype, list(data.queues), data.host, data.pid)
        )
