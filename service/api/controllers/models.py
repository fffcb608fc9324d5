"""/models: list, one, register; and each model's data (metrics, heads, neurons, stages)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.params import Parameter

from service.api.auth import SECURITY, key_id, require_write_key
from service.api.controllers.params import (
    Component,
    Format,
    LayerMax,
    LayerMin,
    Metric,
    MetricVersion,
    ModelId,
    RunId,
)
from service.api.docs import TabularOperation
from service.api.errors import BadRequestHttpError
from service.api.queries import models_and_runs, results
from service.api.queries import neurons as neuron_queries
from service.api.queries import pins as pin_queries
from service.api.queries import pruning as pruning_queries
from service.api.queries import stages as stage_queries
from service.api.queries.answers import Answer
from service.api.queries.index import Snapshot
from service.api.queries.jobs import default_run_of
from service.api.respond import DATA_ERRORS, ApiContext, errors, respond
from service.schemas.models import ModelDetail, ModelPage, Registered, RegisterModel
from service.schemas.neurons import NeuronCounts, Neurons
from service.schemas.pins import PinRequest, Pins
from service.schemas.pruning import PruningPlan
from service.schemas.results import HeadRows, MetricRows, SequenceRows
from service.schemas.stages import Stages
from service.store.registration import Registration, register


class ModelsController(Controller):
    path = "/api/v1/models"
    tags = ["models"]  # noqa: RUF012

    @get("/", sync_to_thread=True, responses=errors(400))
    def list_models(
        self,
        ctx: ApiContext,
        family: Annotated[
            str | None, Parameter(max_length=200, description=("members of this refit family"))
        ] = None,
        source: Annotated[
            str | None,
            Parameter(max_length=32, description=("zoo, hf_dir, transformer_lens or random")),
        ] = None,
        architecture: Annotated[
            str | None,
            Parameter(max_length=200, description=("e.g. GPT2LMHeadModel (case-insensitive)")),
        ] = None,
        name: Annotated[str | None, Parameter(max_length=1000)] = None,
        min_layers: Annotated[int | None, Parameter(ge=0, le=100_000)] = None,
        max_layers: Annotated[int | None, Parameter(ge=0, le=100_000)] = None,
        limit: Annotated[int, Parameter(ge=1, le=10_000)] = 100,
        offset: Annotated[int, Parameter(ge=0, le=10**9)] = 0,
    ) -> ModelPage:
        """Registered models, by name; filtered, paginated (limit/offset)."""
        if limit > ctx.settings.api.max_page_size:
            raise BadRequestHttpError(f"limit is at most {ctx.settings.api.max_page_size}")
        return models_and_runs.list_models(
            ctx.store,
            ctx.snapshot(),
            source=source,
            family=family,
            architecture=architecture,
            name=name,
            min_layers=min_layers,
            max_layers=max_layers,
            limit=limit,
            offset=offset,
        )

    @post(
        "/",
        sync_to_thread=True,
        guards=[require_write_key],
        security=SECURITY,
        status_code=201,
        responses=errors(400, 401, 403, 409, 422),
    )
    def register(self, ctx: ApiContext, data: RegisterModel) -> Response[Registered]:
        """Register a model (API key). 201 when new; 200 with the existing model when the same
        registration exists; 409 when its source is registered under another name. `name`
        defaults to the checkpoint folder's name (or the source's). `default_run` says what
        its default run would cost (FLOPs, peak memory, time on each worker by its measured
        rate) and whether it was queued: automatically when reconciliation is on
        (`STRATA_JOBS__RECONCILE`) and its estimate is within
        `STRATA_JOBS__AUTO_RUN_MAX_TFLOP`, else only when asked (`"default_run": true`)."""
        model, created = register(
            ctx.store,
            _registration(data),
            checkpoint_roots=ctx.settings.registration_roots(),
            load_max_mb=ctx.settings.api.register_load_max_mb,
        )
        plan = None
        if ctx.jobs is not None:
            plan = default_run_of(
                ctx.jobs, ctx.settings, model, asked=data.default_run, created=created
            )
        current = ctx.snapshot().canonical_runs(model.id)
        base = models_and_runs.model_out(model, [], current)
        answer = Registered(
            **{f: getattr(base, f) for f in base.__struct_fields__}, default_run=plan
        )
        return Response(answer, status_code=201 if created else 200)

    @get("/{model:str}", sync_to_thread=True, responses=errors(400, 404))
    def get_model(self, ctx: ApiContext, model: str, model_id: ModelId = None) -> ModelDetail:
        """A model by name (its latest registration) or id."""
        return models_and_runs.get_model(ctx.store, ctx.snapshot(), model, model_id)

    @get("/{model:str}/metrics", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def metrics(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        metric: Metric,
        component: Component = None,
        layer_min: LayerMin = None,
        layer_max: LayerMax = None,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[MetricRows]:
        """Per-layer rows of one metric: layer, relative depth, value, stderr, n, unit."""

        def build(snap: Snapshot) -> Answer:
            return results.metric_rows(
                ctx.reader,
                snap,
                model,
                metric=metric,
                component=component,
                layer_min=layer_min,
                layer_max=layer_max,
                run_id=run_id,
                metric_version=metric_version,
                model_id=model_id,
            )

        return await respond(request, ctx, build, fmt)

    @get("/{model:str}/sequences", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def sequences(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        metric: Metric,
        component: Component = None,
        layer_min: LayerMin = None,
        layer_max: LayerMax = None,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[SequenceRows]:
        """Per-sequence means of one metric, the samples behind each per-layer row's value and
        stderr: layer, head, sequence, value, unit (runs of metric version 2 on)."""

        def build(snap: Snapshot) -> Answer:
            return results.sequence_rows(
                ctx.reader,
                snap,
                model,
                metric=metric,
                component=component,
                layer_min=layer_min,
                layer_max=layer_max,
                run_id=run_id,
                metric_version=metric_version,
                model_id=model_id,
            )

        return await respond(request, ctx, build, fmt)

    @get("/{model:str}/heads", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def heads(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        metric: Annotated[
            str,
            Parameter(
                query="metric", min_length=1, max_length=200, description="heads.* or attention.*"
            ),
        ] = "heads.induction",
        layer_min: LayerMin = None,
        layer_max: LayerMax = None,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[HeadRows]:
        """Per-head rows of a heads.* or attention.* metric."""

        def build(snap: Snapshot) -> Answer:
            return results.head_rows(
                ctx.reader,
                snap,
                model,
                metric=metric,
                layer_min=layer_min,
                layer_max=layer_max,
                run_id=run_id,
                metric_version=metric_version,
                model_id=model_id,
            )

        return await respond(request, ctx, build, fmt)

    @get("/{model:str}/neurons", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def neurons(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        neuron_class: Annotated[
            neuron_queries.NeuronClass, Parameter(query="class")
        ] = "prediction",
        top: Annotated[int, Parameter(ge=1, le=1000)] = 20,
        layer: Annotated[int | None, Parameter(ge=0, le=100_000)] = None,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[Neurons]:
        """The top neurons of a class in each layer (or one layer), with their moments and
        most promoted / suppressed tokens (prediction and suppression by kurtosis, partition by
        variance)."""

        def build(snap: Snapshot) -> Answer:
            return neuron_queries.top_neurons(
                ctx.reader,
                snap,
                model,
                neuron_class=neuron_class,
                top=top,
                layer=layer,
                run_id=run_id,
                metric_version=metric_version,
                model_id=model_id,
            )

        return await respond(request, ctx, build, fmt)

    @get("/{model:str}/neurons/counts", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def neuron_counts(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        layer_min: LayerMin = None,
        layer_max: LayerMax = None,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[NeuronCounts]:
        """Per layer: neurons of each class, as counts and as fractions of d_mlp."""

        def build(snap: Snapshot) -> Answer:
            return neuron_queries.neuron_counts(
                ctx.reader,
                snap,
                model,
                layer_min=layer_min,
                layer_max=layer_max,
                run_id=run_id,
                metric_version=metric_version,
                model_id=model_id,
            )

        return await respond(request, ctx, build, fmt)

    @get("/{model:str}/stages", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def stages(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        metric: Annotated[
            str | None,
            Parameter(
                query="metric", max_length=200, description="aggregate this metric over each stage"
            ),
        ] = None,
        component: Component = None,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[Stages]:
        """The model's stage boundaries with their evidence, and its four stages (with a
        metric: the metric's mean over each)."""

        def build(snap: Snapshot) -> Answer:
            return stage_queries.stages(
                ctx.reader,
                snap,
                models=[model],
                metric=metric,
                component=component,
                metric_version=metric_version,
                model_id=model_id,
                run_ids=None if run_id is None else [run_id],
            )

        return await respond(request, ctx, build, fmt)

    @get("/{model:str}/pruning-plan", responses=DATA_ERRORS, operation_class=TabularOperation)
    async def pruning_plan(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        n: Annotated[
            int,
            Parameter(
                query="n",
                ge=-100_000,
                le=100_000,
                description="the budget: blocks to remove (one of the widths the run measured)",
            ),
        ] = 1,
        run_id: RunId = None,
        metric_version: MetricVersion = None,
        model_id: ModelId = None,
        fmt: Format = None,
    ) -> Response[PruningPlan]:
        """The pruning plan for a budget of n blocks: the measured best block to remove, what
        Block Influence's and Gromov's rules (last-token and all-token) would remove, each
        choice's measured cost (KL, top-1 agreement, loss delta, with stderr over sequences),
        and the predictors' rank correlations with the measured drops (with intervals). Reads
        the model's canonical run with pruning_drops (and pruning)."""

        def build(snap: Snapshot) -> Answer:
            return pruning_queries.pruning_plan(
                ctx.reader,
                snap,
                model,
                n=n,
                run_id=run_id,
                metric_version=metric_version,
                model_id=model_id,
            )

        return await respond(request, ctx, build, fmt, build_in_thread=True)

    # ---- pinning the canonical run

    @get("/{model:str}/pins", sync_to_thread=True, responses=errors(400, 404))
    def pins(self, ctx: ApiContext, model: str, model_id: ModelId = None) -> Pins:
        """The model's pinned runs, its canonical run for each family (and why: pinned,
        default or latest), its default run, and the audit log of pins and unpins."""
        snap = ctx.snapshot()
        return pin_queries.pins_of(ctx.store, snap, snap.model(model, model_id))

    @post(
        "/{model:str}/pins",
        sync_to_thread=True,
        guards=[require_write_key],
        security=SECURITY,
        status_code=201,
        responses=errors(400, 401, 403, 404, 409, 422),
    )
    def pin(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        data: PinRequest,
        model_id: ModelId = None,
    ) -> Pins:
        """Pin a run as the model's canonical run for its families (API key): every answer
        about the model reads it until it is unpinned. Recorded in the audit log with who
        (`by`, default the key's id), the key's id and the time."""
        snap = ctx.snapshot()
        entry = snap.model(model, model_id)
        pin_queries.pin(ctx.store, snap, entry, data, key_id(request))
        return pin_queries.pins_of(ctx.store, ctx.snapshot(), entry)

    @delete(
        "/{model:str}/pins",
        sync_to_thread=True,
        guards=[require_write_key],
        security=SECURITY,
        status_code=200,
        responses=errors(400, 401, 403, 404),
    )
    def unpin(
        self,
        request: Request[Any, Any, Any],
        ctx: ApiContext,
        model: str,
        family: Annotated[
            str | None,
            Parameter(
                max_length=1000,
                description="comma-separated families to unpin (default: every pinned one)",
            ),
        ] = None,
        by: Annotated[str | None, Parameter(max_length=200, description="who")] = None,
        note: Annotated[str | None, Parameter(max_length=2000, description="why")] = None,
        model_id: ModelId = None,
    ) -> Pins:
        """Unpin (API key): the families' canonical runs are their default configuration's
        runs again. Recorded in the audit log."""
        snap = ctx.snapshot()
        entry = snap.model(model, model_id)
        families = [f.strip() for f in family.split(",") if f.strip()] if family else None
        pin_queries.unpin(
            ctx.store, snap, entry, families, by=by, note=note, key_id=key_id(request)
        )
        return pin_queries.pins_of(ctx.store, ctx.snapshot(), entry)


def _registration(data: RegisterModel) -> Registration:
    """The store's registration from the request body (its processing defaults to all on)."""
    import msgspec

    from compute.models import Processing

    processing = (
        Processing()
        if data.processing is None
        else Processing(**msgspec.structs.asdict(data.processing))
    )
    return Registration(data.source, name=data.name, revision=data.revision, processing=processing)
