"""/runs: list, one, and results delivered by remote workers (ingest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from litestar import Controller, Request, Response, get, post
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema
from litestar.params import Parameter

from service.api.auth import SECURITY, require_write_key
from service.api.controllers.jobs import jobs_of
from service.api.controllers.params import MetricVersion, ModelId
from service.api.errors import BadRequestHttpError, PayloadTooLargeHttpError, body_too_large
from service.api.formats import MEDIA_TYPES
from service.api.queries import ingest as ingest_queries
from service.api.queries import models_and_runs
from service.api.respond import ApiContext, errors
from service.schemas.runs import IngestSummary, Run, RunPage
from service.store.tables import RUN_STATUSES


@dataclass
class IngestOperation(Operation):
    """Documents the Arrow IPC body that the handler reads itself."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            description="Arrow IPC stream(s): records (+ neuron tokens)",
            content={
                MEDIA_TYPES["arrow"]: OpenAPIMediaType(
                    schema=Schema(type=OpenAPIType.STRING, content_media_type=MEDIA_TYPES["arrow"])
                )
            },
        )


Status = Annotated[
    str | None,
    Parameter(query="status", max_length=16, description=("queued, running, succeeded or failed")),
]


class RunsController(Controller):
    path = "/api/v1/runs"
    tags = ["runs"]  # noqa: RUF012

    @get("/", sync_to_thread=True, responses=errors(400, 404, 422))
    def list_runs(
        self,
        ctx: ApiContext,
        model: Annotated[
            str | None, Parameter(max_length=1000, description=("runs of this model (name or id)"))
        ] = None,
        model_id: ModelId = None,
        status: Status = None,
        family: Annotated[
            str | None,
            Parameter(max_length=64, description=("runs that computed this metric family")),
        ] = None,
        metric_version: MetricVersion = None,
        limit: Annotated[int, Parameter(ge=1, le=10_000)] = 100,
        offset: Annotated[int, Parameter(ge=0, le=10**9)] = 0,
    ) -> RunPage:
        """Runs, newest first: status, configuration, timings; filtered, paginated."""
        if limit > ctx.settings.api.max_page_size:
            raise BadRequestHttpError(f"limit is at most {ctx.settings.api.max_page_size}")
        if status is not None and status not in RUN_STATUSES:
            raise BadRequestHttpError(f"status is one of {', '.join(RUN_STATUSES)}")
        return models_and_runs.list_runs(
            ctx.store,
            ctx.snapshot(),
            model=model,
            model_id=model_id,
            status=status,
            family=family,
            metric_version=metric_version,
            limit=limit,
            offset=offset,
        )

    @get("/{run_id:int}", sync_to_thread=True, responses=errors(400, 404))
    def get_run(self, ctx: ApiContext, run_id: int) -> Run:
        """A run: status, progress, error, configuration, timings, environment."""
        return models_and_runs.get_run(ctx.store, ctx.snapshot(), run_id)

    @post(
        "/ingest",
        guards=[require_write_key],
        security=SECURITY,
        status_code=201,
        responses=errors(400, 401, 403, 404, 409, 413, 422, 503),
        request_max_body_size=None,
        operation_class=IngestOperation,
    )
    async def ingest(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        run_id: Annotated[
            int | None, Parameter(query="run_id", ge=0, description=("deliver to this queued run"))
        ] = None,
        job_id: Annotated[
            int | None,
            Parameter(
                query="job_id",
                ge=1,
                le=2**62,
                description=(
                    "these are the results of this job: it succeeds in the same transaction "
                    "(409 if it was cancelled: nothing is stored)"
                ),
            ),
        ] = None,
    ) -> Response[IngestSummary]:
        """Store a run's results (API key): atomic per run, idempotent by configuration hash
        (201 new, 200 replaced). Stage boundaries are inferred in the same transaction.

        Body (`application/vnd.apache.arrow.stream`): one Arrow IPC stream of the records, whose
        schema metadata `strata` is the run (as `strata compute --out run.arrow` writes it),
        optionally followed by streams of the neuron top tokens and of the per-sequence means
        (recognised by their columns). A refit family's stability comes the same way, marked
        `kind: "stability"` in that metadata (a worker's stability job)."""
        body = await read_limited(request, ctx.settings.api.ingest_max_mb)
        jobs = None
        if job_id is not None:
            if run_id is not None:
                raise BadRequestHttpError("give run_id or job_id, not both")
            jobs = jobs_of(ctx)
        s = await anyio.to_thread.run_sync(
            lambda: ingest_queries.deliver(ctx.store, jobs, body, run_id=run_id, job_id=job_id)
        )
        request.app.state.metrics.ingested(
            s.results + s.neurons + s.neuron_tokens + s.stage_boundaries + s.sequence_means,
            len(body),
        )
        return Response(s, status_code=200 if s.replaced else 201)


async def read_limited(request: Request[Any, Any, Any], max_mb: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `max_mb` MiB."""
    limit, chunks, size = max_mb * 2**20, [], 0
    too_large = body_too_large(limit, "STRATA_API__INGEST_MAX_MB")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeHttpError(too_large)
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeHttpError(too_large)
        chunks.append(chunk)
    return b"".join(chunks)
