"""Across models: one metric on relative depth (/compare), stages (/stages), the pruning
predictors' scores (/pruning-scores)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get
from litestar.params import Parameter

from service.api.controllers.params import (
    Component,
    Format,
    Metric,
    MetricVersion,
    Models,
    RunIds,
    split_models,
    split_run_ids,
)
from service.api.docs import TabularOperation
from service.api.queries import compare as compare_queries
from service.api.queries import pruning as pruning_queries
from service.api.queries import stages as stage_queries
from service.api.queries.answers import Answer
from service.api.queries.index import Snapshot
from service.api.respond import DATA_ERRORS, ApiContext, respond
from service.schemas.pruning import PruningScores
from service.schemas.results import Comparison
from service.schemas.stages import Stages


class AcrossModelsController(Controller):
    path = "/api/v1"
    tags = ["across models"]  # noqa: RUF012

    @get("/compare", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def compare(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        metric: Metric,
        models: Models,
        component: Component = None,
        bins: Annotated[int, Parameter(ge=2, le=200)] = 20,
        method: Annotated[
            compare_queries.Method,
            Parameter(
                description=(
                    "interpolate: each curve read at bin centres; mean: layers within each "
                    "bin averaged"
                )
            ),
        ] = "interpolate",
        metric_version: MetricVersion = None,
        run_ids: RunIds = None,
        fmt: Format = None,
    ) -> Response[Comparison]:
        """One metric across models on relative depth, binned: mean ± stderr per model and
        bin, so models of any depth line up."""

        def build(snap: Snapshot) -> Answer:
            return compare_queries.compare(
                ctx.reader,
                snap,
                metric=metric,
                component=component,
                models=split_models(models),
                bins=bins,
                method=method,
                metric_version=metric_version,
                run_ids=split_run_ids(run_ids),
            )

        return await respond(request, ctx, build, fmt)

    @get("/stages", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def stages(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        models: Models,
        metric: Annotated[
            str | None,
            Parameter(
                query="metric", max_length=200, description="aggregate this metric over each stage"
            ),
        ] = None,
        component: Component = None,
        metric_version: MetricVersion = None,
        run_ids: RunIds = None,
        fmt: Format = None,
    ) -> Response[Stages]:
        """Stage boundaries (with evidence) of several models, and their four stages with
        per-stage aggregates of a metric."""

        def build(snap: Snapshot) -> Answer:
            return stage_queries.stages(
                ctx.reader,
                snap,
                models=split_models(models),
                metric=metric,
                component=component,
                metric_version=metric_version,
                run_ids=split_run_ids(run_ids),
            )

        return await respond(request, ctx, build, fmt)

    @get("/pruning-scores", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def pruning_scores(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        models: Models,
        predictor: Annotated[
            str | None,
            Parameter(
                query="predictor",
                max_length=64,
                description="block_influence, angular_distance or angular_distance_last",
            ),
        ] = None,
        n: Annotated[int | None, Parameter(query="n", ge=1, le=100_000)] = None,
        metric_version: MetricVersion = None,
        run_ids: RunIds = None,
        fmt: Format = None,
    ) -> Response[PruningScores]:
        """Does each pruning predictor rank the blocks as their measured drops do? Per model,
        predictor and width n: Spearman's rho with the measured KL of dropping n blocks, its
        bootstrap interval over sequences and whether it lies above 0."""

        def build(snap: Snapshot) -> Answer:
            return pruning_queries.pruning_scores(
                ctx.reader,
                snap,
                models=split_models(models),
                predictor=predictor,
                n=n,
                metric_version=metric_version,
                run_ids=split_run_ids(run_ids),
            )

        return await respond(request, ctx, build, fmt)
