"""/families: refit families — made, grown and shrunk (API key) — their stability computed
as a worker's job, and their head stability read."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from litestar import Controller, Request, Response, delete, get, post
from litestar.params import Parameter

from compute.stability import StabilityOptions
from service.api.auth import SECURITY, require_write_key
from service.api.controllers.jobs import jobs_of
from service.api.controllers.params import Format, LayerMax, LayerMin, MetricVersion
from service.api.docs import TabularOperation
from service.api.queries import families as family_queries
from service.api.queries.answers import Answer
from service.api.queries.index import Snapshot
from service.api.queries.jobs import job_out
from service.api.respond import DATA_ERRORS, ApiContext, errors, respond
from service.schemas.families import (
    ComputeStability,
    Family,
    FamilyMembers,
    NewFamily,
    Stability,
    StabilityImportance,
)
from service.schemas.jobs import Job
from service.store import families as stored_families


def _request(data: NewFamily) -> stored_families.FamilyRequest:
    options = StabilityOptions(
        n_prompts=data.n_prompts,
        prompt_len=data.prompt_len,
        seed=data.seed,
        n_null=data.n_null,
        cka_tokens=data.cka_tokens,
    )
    return stored_families.FamilyRequest(
        data.name, data.members, data.anchor, options, data.description
    )


def _changed(ctx: ApiContext, family: str) -> None:
    """A family was made or its members changed: its queued jobs for other members are
    cancelled, and its stability is queued (behind people's jobs) once the edits settle
    (`service.jobs.families.FamilyJobs.edited`)."""
    if ctx.jobs is not None:
        ctx.jobs.families.edited(family)


class FamiliesController(Controller):
    path = "/api/v1/families"
    tags = ["families"]  # noqa: RUF012

    @get("/", sync_to_thread=True)
    def list_families(self, ctx: ApiContext) -> list[Family]:
        """Refit families: anchor, members and their state, settings, current stability run
        and newest stability job."""
        return family_queries.list_families(ctx.reader, ctx.snapshot())

    @get("/{family:str}", sync_to_thread=True, responses=errors(400, 404))
    def get_family(self, ctx: ApiContext, family: str) -> Family:
        """One refit family, as in the list."""
        return family_queries.get_family(ctx.reader, ctx.snapshot(), family)

    @post(
        "/",
        status_code=201,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 409, 422),
        guards=[require_write_key],
        security=SECURITY,
    )
    def create_family(self, ctx: ApiContext, data: NewFamily) -> Family:
        """Make a refit family (API key) of registered models of one architecture, with an
        anchor among them and its stability settings. Refused with 422, nothing stored: fewer
        than two distinct members, a model that is not registered, an anchor that is not a
        member, members of different architectures; 409 if the name is taken. With
        reconciliation on, its stability is then queued (behind people's jobs) once the family
        has gone unchanged for `STRATA_JOBS__FAMILY_SETTLE_S`."""
        stored_families.create(ctx.store, _request(data))
        _changed(ctx, data.name)
        return family_queries.get_family(ctx.reader, ctx.snapshot(), data.name)

    @post(
        "/{family:str}/members",
        status_code=200,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 404, 422),
        guards=[require_write_key],
        security=SECURITY,
    )
    def add_members(self, ctx: ApiContext, family: str, data: FamilyMembers) -> Family:
        """Add registered models to a family (API key); members already in it stay. 422,
        nothing stored, for a model that is not registered or of another architecture. Its
        stability jobs that no worker has started, for the members it had, are cancelled."""
        stored_families.add_members(ctx.store, family, data.members)
        _changed(ctx, family)
        return family_queries.get_family(ctx.reader, ctx.snapshot(), family)

    @delete(
        "/{family:str}/members/{model:str}",
        status_code=200,
        sync_to_thread=True,
        responses=errors(400, 401, 403, 404, 422),
        guards=[require_write_key],
        security=SECURITY,
    )
    def remove_member(self, ctx: ApiContext, family: str, model: str) -> Family:
        """Take a member out of a family (API key). 422 for a model that is not a member, the
        anchor, or a member whose leaving would leave one. Its stability jobs that no worker
        has started, for the members it had, are cancelled."""
        stored_families.remove_member(ctx.store, family, model)
        _changed(ctx, family)
        return family_queries.get_family(ctx.reader, ctx.snapshot(), family)

    @post(
        "/{family:str}/stability",
        status_code=202,
        responses=errors(400, 401, 403, 404, 422, 503),
        guards=[require_write_key],
        security=SECURITY,
    )
    async def compute_stability(
        self, ctx: ApiContext, family: str, data: ComputeStability | None = None
    ) -> Response[Job]:
        """Queue the family's stability as a worker's job (API key): 202 with the new job; the
        same configuration (members, anchor, prompts, metric version) asked again answers 200
        with its job unless `force`. Follow it with `GET /api/v1/jobs/{id}`; cancel it with
        `DELETE /api/v1/jobs/{id}`. 422 before anything is queued: fewer than two members, a
        device no worker has; 503 when the broker is down."""
        asked = data or ComputeStability()
        jobs = jobs_of(ctx)
        view, new = await anyio.to_thread.run_sync(
            lambda: jobs.families.submit(
                family, device=asked.device, queue=asked.queue, force=asked.force
            )
        )
        return Response(job_out(view), status_code=202 if new else 200)

    @get("/{family:str}/stability", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def stability(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        family: str,
        metric: Annotated[
            str | None,
            Parameter(
                query="metric",
                max_length=200,
                description="one of the stability metrics (default: all)",
            ),
        ] = None,
        per_head: Annotated[bool, Parameter(description=("also the per-head rows"))] = False,
        layer_min: LayerMin = None,
        layer_max: LayerMax = None,
        metric_version: MetricVersion = None,
        fmt: Format = None,
    ) -> Response[Stability]:
        """Head stability across the family's refits against its anchor (per layer: mean and
        std over heads; null baseline beside it) and residual CKA, from its latest stored
        comparison."""

        def build(snap: Snapshot) -> Answer:
            return family_queries.stability(
                ctx.reader,
                snap,
                family,
                metric=metric,
                per_head=per_head,
                layer_min=layer_min,
                layer_max=layer_max,
                metric_version=metric_version,
            )

        return await respond(request, ctx, build, fmt, build_in_thread=True)

    @get(
        "/{family:str}/stability-importance",
        responses=DATA_ERRORS,
        operation_class=TabularOperation,
    )
    async def stability_importance(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        family: str,
        importance: Annotated[
            str,
            Parameter(
                query="importance",
                max_length=200,
                description="the per-head ablation metric taken as a head's importance",
            ),
        ] = "heads.ablation_kl",
        metric_version: MetricVersion = None,
        fmt: Format = None,
    ) -> Response[StabilityImportance]:
        """Per layer, the correlation over heads between a head's stability across the family's
        refits and its ablation importance on the anchor (the anchor's current heads run):
        Pearson r with a 95% interval (Fisher z over heads), Spearman rho, and the means."""

        def build(snap: Snapshot) -> Answer:
            return family_queries.stability_importance(
                ctx.reader, snap, family, importance=importance, metric_version=metric_version
            )

        return await respond(request, ctx, build, fmt, build_in_thread=True)
