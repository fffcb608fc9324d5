"""/families: refit families and their head stability."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get
from litestar.params import Parameter

from service.api.controllers.params import Format, LayerMax, LayerMin, MetricVersion
from service.api.docs import TabularOperation
from service.api.queries import families as family_queries
from service.api.queries.answers import Answer
from service.api.queries.index import Snapshot
from service.api.respond import DATA_ERRORS, ApiContext, errors, respond
from service.schemas.families import Family, Stability, StabilityImportance


class FamiliesController(Controller):
    path = "/api/v1/families"
    tags = ["families"]  # noqa: RUF012

    @get("/", sync_to_thread=True)
    def list_families(self, ctx: ApiContext) -> list[Family]:
        """Refit families: anchor and members."""
        return family_queries.list_families(ctx.reader, ctx.snapshot())

    @get("/{family:str}", sync_to_thread=True, responses=errors(400, 404))
    def get_family(self, ctx: ApiContext, family: str) -> Family:
        return family_queries.get_family(ctx.reader, ctx.snapshot(), family)

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
