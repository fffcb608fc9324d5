"""The Python client's methods: reads answered as DataFrames (from the API's Arrow IPC answers)
or as the API's own schemas, jobs submitted and waited for."""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec
import polars as pl
import pyarrow as pa

from service.client.errors import JobFailedError, WaitTimeoutError
from service.client.frames import frame_of
from service.client.transport import NO_RETRY, READS, RetryPolicy, Transport, decode
from service.schemas.families import Family
from service.schemas.health import Health
from service.schemas.jobs import Job, JobPage
from service.schemas.models import Model, ModelDetail, ModelPage, Registered
from service.schemas.pins import Pins
from service.schemas.pruning import SCORE_SCHEMA, PruningScore
from service.schemas.runs import Run, RunPage
from service.schemas.stages import ModelStages

if TYPE_CHECKING:
    import pandas as pd

ARROW = "application/vnd.apache.arrow.stream"
V1 = "/api/v1"
PAGE = 500
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

FrameT = TypeVar("FrameT")
T = TypeVar("T")
Schema = dict[str, pl.DataType | type[pl.DataType]]


@dataclass(frozen=True)
class StagesResult(Generic[FrameT]):
    """`stages`: the four stages of each model (with a metric's per-stage aggregate when one was
    asked for) and the boundaries that place them, each with its rule and evidence."""

    stages: FrameT
    boundaries: FrameT


@dataclass(frozen=True)
class PruningPlanResult(Generic[FrameT]):
    """`pruning_plan`: the four choices for a budget of n blocks (measured best, block influence,
    Gromov last-token and all-token) with their measured costs; the predictors' rank
    correlations with the measured drops (every width) with their intervals; the budgets the
    run measured, and the run(s) read (the answer's context, as the API gives it)."""

    choices: FrameT
    scores: FrameT
    widths: list[int]
    context: dict[str, Any]


class BaseClient(ABC, Generic[FrameT]):
    """The API's reads and writes; subclasses choose the DataFrame type."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.25,
        rate_limit_wait_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.reads = RetryPolicy(
            attempts=1 + retries, backoff_s=backoff_s, rate_limit_wait_s=rate_limit_wait_s
        )
        self.writes = replace(NO_RETRY, rate_limit_wait_s=rate_limit_wait_s)
        self._transport = Transport(self.url, api_key, timeout=timeout, transport=transport)
        self.last_context: dict[str, Any] = {}

    # -- plumbing
    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> BaseClient[FrameT]:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @abstractmethod
    def _frame(self, table: pa.Table) -> FrameT: ...

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        accept: str = "application/json",
    ) -> httpx.Response:
        """One request: reads retried on connection errors, any request refused with 429
        retried after its `Retry-After` (`service.client.transport`)."""
        clean = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        return self._transport.request(
            method,
            path,
            policy=self.reads if method in READS else self.writes,
            params=clean,
            json=body,
            headers={"Accept": accept},
        )

    def _get(self, path: str, schema: type[T], params: dict[str, Any] | None = None) -> T:
        return decode(self._send("GET", path, params=params), schema)

    def _table(self, path: str, params: dict[str, Any]) -> FrameT:
        """A data endpoint's answer in Arrow IPC, as a DataFrame; its context kept aside."""
        response = self._send("GET", path, params={**params, "format": "arrow"}, accept=ARROW)
        table = pa.ipc.open_stream(response.content).read_all()
        meta = (table.schema.metadata or {}).get(b"strata")
        self.last_context = json.loads(meta) if meta else {}
        return self._frame(table.replace_schema_metadata(None))

    # -- models and runs
    def health(self) -> bool:
        """True when the service answers."""
        return self._get(f"{V1}/health", Health).status == "ok"

    def models(
        self,
        *,
        name: str | None = None,
        source: str | None = None,
        family: str | None = None,
        architecture: str | None = None,
        min_layers: int | None = None,
        max_layers: int | None = None,
    ) -> FrameT:
        """Registered models (every page), one row each, with the columns of the API's `Model`
        that a column can hold: id, name, source, architecture numbers, refit families,
        registration time (`model()` has the rest, `current_runs` among it)."""
        filters = dict(
            name=name,
            source=source,
            family=family,
            architecture=architecture,
            min_layers=min_layers,
            max_layers=max_layers,
        )
        items: list[Model] = []
        offset: int | None = 0
        while offset is not None:
            page = self._get(
                f"{V1}/models", ModelPage, {**filters, "limit": PAGE, "offset": offset}
            )
            items += page.items
            offset = page.next_offset
        return self._frame(frame_of(items, Model).to_arrow())

    def model(self, model: str | int) -> ModelDetail:
        """One model with its number of runs, current runs and other registrations."""
        return self._get(f"{V1}/models/{_seg(model)}", ModelDetail)

    def current_runs(self, model: str | int) -> dict[str, int]:
        """Metric family -> id of the run the API reads for it by default, the model's
        canonical run (the API decides: the run pinned for the family, else the default
        configuration's run, else the latest; `model(m).current_run_basis` says which)."""
        return dict(self.model(model).current_runs)

    def pins(self, model: str | int) -> Pins:
        """The model's pinned runs, its canonical run for each family (with why) and the audit
        log of pins and unpins."""
        return self._get(f"{V1}/models/{_seg(model)}/pins", Pins)

    def pin(
        self,
        model: str | int,
        run_id: int,
        *,
        families: Sequence[str] | None = None,
        by: str | None = None,
        note: str | None = None,
    ) -> Pins:
        """Make `run_id` the model's canonical run for `families` (default: every family it
        computed) until unpinned (API key); recorded in the audit log with `by` (default: the
        key's id) and `note`."""
        body: dict[str, Any] = {"run_id": run_id}
        for key, value in (
            ("families", None if families is None else list(families)),
            ("by", by),
            ("note", note),
        ):
            if value is not None:
                body[key] = value
        return decode(self._send("POST", f"{V1}/models/{_seg(model)}/pins", body=body), Pins)

    def unpin(
        self,
        model: str | int,
        *,
        families: Sequence[str] | None = None,
        by: str | None = None,
        note: str | None = None,
    ) -> Pins:
        """Unpin the model's pinned runs (default: every pinned family; API key): the default
        configuration's run is canonical again."""
        params = dict(family=None if families is None else ",".join(families), by=by, note=note)
        return decode(self._send("DELETE", f"{V1}/models/{_seg(model)}/pins", params=params), Pins)

    def register(
        self,
        name: str,
        source: str,
        *,
        revision: str | None = None,
        processing: dict[str, bool] | None = None,
        default_run: bool = False,
    ) -> Registered:
        """Register a model (API key). The same registration again answers the existing model;
        its source under another name is a `ConflictError`. The answer's `default_run` says
        what the model's default run would cost and whether it was queued (`default_run`:
        True asks for it whatever it costs; otherwise it is queued automatically only within
        the service's STRATA_JOBS__AUTO_RUN_MAX_TFLOP)."""
        body: dict[str, Any] = {"name": name, "source": source}
        if revision is not None:
            body["revision"] = revision
        if processing is not None:
            body["processing"] = processing
        if default_run:
            body["default_run"] = True
        return decode(self._send("POST", f"{V1}/models", body=body), Registered)

    def runs(
        self,
        *,
        model: str | int | None = None,
        status: str | None = None,
        family: str | None = None,
    ) -> FrameT:
        """Runs, newest first (every page), with the columns of the API's `Run` that a column
        can hold (its timings spread out: created_at, started_at, finished_at, wall_s)."""
        filters = dict(model=model, status=status, family=family)
        items: list[Run] = []
        offset: int | None = 0
        while offset is not None:
            page = self._get(f"{V1}/runs", RunPage, {**filters, "limit": PAGE, "offset": offset})
            items += page.items
            offset = page.next_offset
        return self._frame(frame_of(items, Run, flatten=["timings"]).to_arrow())

    def run(self, run_id: int) -> Run:
        """One run: its configuration (model, tokens, families, options), status, timings."""
        return self._get(f"{V1}/runs/{run_id}", Run)

    # -- results
    def metrics(
        self,
        model: str | int,
        metric: str,
        component: str | None = None,
        *,
        layer_min: int | None = None,
        layer_max: int | None = None,
        run_id: int | None = None,
        metric_version: str | None = None,
    ) -> FrameT:
        """Per-layer rows of one metric of a model's current run: metric, component, layer,
        relative_depth, value, stderr, n, unit."""
        return self._table(
            f"{V1}/models/{_seg(model)}/metrics",
            dict(
                metric=metric,
                component=component,
                layer_min=layer_min,
                layer_max=layer_max,
                run_id=run_id,
                metric_version=metric_version,
            ),
        )

    def sequences(
        self,
        model: str | int,
        metric: str,
        component: str | None = None,
        *,
        layer_min: int | None = None,
        layer_max: int | None = None,
        run_id: int | None = None,
        metric_version: str | None = None,
    ) -> FrameT:
        """Per-sequence means of one metric (the samples behind `metrics`' value and stderr):
        metric, component, layer, head, sequence, value, unit."""
        return self._table(
            f"{V1}/models/{_seg(model)}/sequences",
            dict(
                metric=metric,
                component=component,
                layer_min=layer_min,
                layer_max=layer_max,
                run_id=run_id,
                metric_version=metric_version,
            ),
        )

    def heads(
        self,
        model: str | int,
        metric: str = "heads.induction",
        *,
        run_id: int | None = None,
        metric_version: str | None = None,
    ) -> FrameT:
        """Per-head rows of a heads.* or attention.* metric."""
        return self._table(
            f"{V1}/models/{_seg(model)}/heads",
            dict(metric=metric, run_id=run_id, metric_version=metric_version),
        )

    def compare(
        self,
        models: Sequence[str | int],
        metric: str,
        component: str | None = None,
        *,
        bins: int = 20,
        method: str = "interpolate",
        metric_version: str | None = None,
        run_ids: Sequence[int] | None = None,
    ) -> FrameT:
        """One metric across models on relative depth, one row per model and bin; each
        model's canonical run, or the one of `run_ids` (at most one per model)."""
        return self._table(
            f"{V1}/compare",
            dict(
                models=_join(models),
                metric=metric,
                component=component,
                bins=bins,
                method=method,
                metric_version=metric_version,
                run_ids=None if run_ids is None else _join(run_ids),
            ),
        )

    def stages(
        self,
        models: Sequence[str | int] | str | int,
        metric: str | None = None,
        component: str | None = None,
        *,
        metric_version: str | None = None,
        run_ids: Sequence[int] | None = None,
    ) -> StagesResult[FrameT]:
        """Stage boundaries with their evidence, and the four stages of each model (with the
        mean of `metric` over each stage when given); each model's canonical runs, or the run
        of `run_ids` (at most one per model)."""
        names = [models] if isinstance(models, str | int) else list(models)
        stages = self._table(
            f"{V1}/stages",
            dict(
                models=_join(names),
                metric=metric,
                component=component,
                metric_version=metric_version,
                run_ids=None if run_ids is None else _join(run_ids),
            ),
        )
        # the boundaries travel in the answer's context, decoded with the API's own schema
        found = msgspec.convert(self.last_context.get("models", []), list[ModelStages])
        rows = [
            {
                "model": m.name,
                "model_id": m.id,
                "run_id": m.run_id,
                "boundary": b.boundary,
                "ends_stage": b.ends_stage,
                "found": b.found,
                "layer": b.layer,
                "relative_depth": b.relative_depth,
                "clear": b.clear,
                "sharpness": b.sharpness,
                "interval_low": b.interval[0] if b.interval else None,
                "interval_high": b.interval[1] if b.interval else None,
                "interval_level": b.interval_level,
                "rule": b.rule,
                "evidence": json.dumps(b.evidence, sort_keys=True),
            }
            for m in found
            for b in m.boundaries
        ]
        schema: Schema = {
            "model": pl.String,
            "model_id": pl.Int64,
            "run_id": pl.Int64,
            "boundary": pl.Int64,
            "ends_stage": pl.String,
            "found": pl.Boolean,
            "layer": pl.Int64,
            "relative_depth": pl.Float64,
            "clear": pl.Boolean,
            "sharpness": pl.Float64,
            "interval_low": pl.Int64,
            "interval_high": pl.Int64,
            "interval_level": pl.Float64,
            "rule": pl.String,
            "evidence": pl.String,
        }
        boundaries = pl.DataFrame(rows, schema=schema)
        return StagesResult(stages, self._frame(boundaries.to_arrow()))

    def pruning_plan(
        self,
        model: str | int,
        n: int = 1,
        *,
        run_id: int | None = None,
        metric_version: str | None = None,
    ) -> PruningPlanResult[FrameT]:
        """The model's pruning plan for a budget of `n` blocks (`GET /models/{model}/pruning-plan`):
        the measured best block(s) to remove, what Block Influence's and Gromov's rules remove,
        each choice's measured KL, top-1 agreement and loss delta (stderr over sequences), and
        the predictors' rank correlations with the measured drops."""
        choices = self._table(
            f"{V1}/models/{_seg(model)}/pruning-plan",
            dict(n=n, run_id=run_id, metric_version=metric_version),
        )
        context = dict(self.last_context)
        found = msgspec.convert(context.get("scores", []), list[PruningScore])
        fields = PruningScore.__struct_fields__
        rows = [{f: getattr(s, f) for f in fields} for s in found]
        scores = pl.DataFrame(rows, schema=SCORE_SCHEMA)
        widths = [int(w) for w in context.get("widths", [])]
        return PruningPlanResult(choices, self._frame(scores.to_arrow()), widths, context)

    def pruning_scores(
        self,
        models: Sequence[str | int] | str | int,
        predictor: str | None = None,
        n: int | None = None,
        *,
        metric_version: str | None = None,
        run_ids: Sequence[int] | None = None,
    ) -> FrameT:
        """Does each pruning predictor rank the blocks as the measured drops do? One row per
        model, predictor and width: Spearman's rho with `pruning_drops.kl_<n>`, its bootstrap
        interval over sequences, and `predicts` (the interval above 0)."""
        names = [models] if isinstance(models, str | int) else list(models)
        return self._table(
            f"{V1}/pruning-scores",
            dict(
                models=_join(names),
                predictor=predictor,
                n=n,
                metric_version=metric_version,
                run_ids=None if run_ids is None else _join(run_ids),
            ),
        )

    def neurons(
        self,
        model: str | int,
        neuron_class: str = "prediction",
        *,
        top: int = 20,
        layer: int | None = None,
        run_id: int | None = None,
        metric_version: str | None = None,
    ) -> FrameT:
        """The top neurons of a class in each layer (or one): moments, flags, and their most
        promoted / suppressed tokens (list columns)."""
        return self._table(
            f"{V1}/models/{_seg(model)}/neurons",
            {
                "class": neuron_class,
                "top": top,
                "layer": layer,
                "run_id": run_id,
                "metric_version": metric_version,
            },
        )

    def neuron_counts(self, model: str | int, *, run_id: int | None = None) -> FrameT:
        """Per layer: neurons of each class, counts and fractions of d_mlp."""
        return self._table(f"{V1}/models/{_seg(model)}/neurons/counts", dict(run_id=run_id))

    def families(self) -> list[Family]:
        """Refit families: name, anchor and members."""
        return self._get(f"{V1}/families", list[Family])

    def family(self, family: str) -> Family:
        """One refit family: anchor, members with their state (`current`: in its current
        stability run; `pending`: not yet), settings, current stability run, newest job."""
        return self._get(f"{V1}/families/{_seg(family)}", Family)

    def create_family(
        self,
        name: str,
        members: Sequence[str | int],
        *,
        anchor: str | int | None = None,
        n_prompts: int | None = None,
        prompt_len: int | None = None,
        n_null: int | None = None,
        seed: int | None = None,
        cka_tokens: int | None = None,
        description: str | None = None,
    ) -> Family:
        """Make a refit family of registered models of one architecture (API key). Refused
        (`ApiError` with the API's detail, nothing stored) for one member, an unknown model,
        members of different architectures."""
        body: dict[str, Any] = {"name": name, "members": [str(m) for m in members]}
        for key, value in (
            ("anchor", None if anchor is None else str(anchor)),
            ("n_prompts", n_prompts),
            ("prompt_len", prompt_len),
            ("n_null", n_null),
            ("seed", seed),
            ("cka_tokens", cka_tokens),
            ("description", description),
        ):
            if value is not None:
                body[key] = value
        return decode(self._send("POST", f"{V1}/families", body=body), Family)

    def add_family_members(self, family: str, members: Sequence[str | int]) -> Family:
        """Add registered models to a refit family (API key)."""
        body = {"members": [str(m) for m in members]}
        return decode(
            self._send("POST", f"{V1}/families/{_seg(family)}/members", body=body), Family
        )

    def remove_family_member(self, family: str, member: str | int) -> Family:
        """Take a member out of a refit family (API key)."""
        path = f"{V1}/families/{_seg(family)}/members/{_seg(member)}"
        return decode(self._send("DELETE", path), Family)

    def compute_stability(
        self,
        family: str,
        *,
        force: bool = False,
        device: str | None = None,
        queue: str | None = None,
    ) -> Job:
        """Queue a refit family's stability as a worker's job (API key); the same
        configuration asked again answers its job. Wait for it with `wait`. Not retried."""
        body: dict[str, Any] = {"force": force}
        if device is not None:
            body["device"] = device
        if queue is not None:
            body["queue"] = queue
        return decode(self._send("POST", f"{V1}/families/{_seg(family)}/stability", body=body), Job)

    def stability(
        self, family: str, metric: str | None = None, *, per_head: bool = False
    ) -> FrameT:
        """Head stability (and its null baseline, residual CKA) of a refit family, per layer."""
        return self._table(
            f"{V1}/families/{_seg(family)}/stability", dict(metric=metric, per_head=per_head)
        )

    def stability_importance(self, family: str, importance: str = "heads.ablation_kl") -> FrameT:
        """Per layer, the correlation over heads between a head's stability across the family's
        refits and its ablation importance (`importance`) on the anchor: Pearson r with a 95%
        interval, Spearman rho, the means."""
        return self._table(
            f"{V1}/families/{_seg(family)}/stability-importance", dict(importance=importance)
        )

    # -- jobs
    def submit(
        self,
        model: str | int,
        metrics: Sequence[str] | None = None,
        *,
        tokens: str | None = None,
        n_sequences: int | None = None,
        seq_len: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        force: bool = False,
        tuned_lens: Mapping[str, Any] | None = None,
    ) -> Job:
        """Queue a computation of a registered model (API key); the deployment's defaults
        fill what is not given. `tuned_lens`: the tuned lens's training settings (`steps`,
        `train_sequences`, ...) or a stored lens's key (`{"lens": KEY}`), for a job with the
        tuned_lens family. Not retried: a lost answer may still have queued the job."""
        body: dict[str, Any] = {"model": str(model), "force": force}
        for key, value in (
            ("metrics", None if metrics is None else list(metrics)),
            ("tokens", tokens),
            ("n_sequences", n_sequences),
            ("seq_len", seq_len),
            ("device", device),
            ("dtype", dtype),
            ("tuned_lens", None if tuned_lens is None else dict(tuned_lens)),
        ):
            if value is not None:
                body[key] = value
        return decode(self._send("POST", f"{V1}/jobs", body=body), Job)

    def job(self, job: Job | int) -> Job:
        return self._get(f"{V1}/jobs/{_job_id(job)}", Job)

    def jobs(
        self,
        *,
        state: str | None = None,
        model: str | int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]:
        return self._get(
            f"{V1}/jobs", JobPage, dict(state=state, model=model, limit=limit, offset=offset)
        ).items

    def cancel(self, job: Job | int) -> Job:
        """Cancel a queued or running job (API key)."""
        return decode(self._send("DELETE", f"{V1}/jobs/{_job_id(job)}"), Job)

    def wait(
        self,
        job: Job | int,
        *,
        timeout: float | None = None,
        poll_s: float = 1.0,
        on_progress: Callable[[Job], None] | None = None,
    ) -> Job:
        """Poll a job until it finishes; the succeeded job (its `run_id` holds the results).
        Raises `JobFailedError` when it fails or is cancelled, `WaitTimeoutError` after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        current = self.job(job)
        while current.state not in TERMINAL:
            if on_progress is not None:
                on_progress(current)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(current, timeout or 0.0)
            time.sleep(
                poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
            )
            current = self.job(current)
        if current.state != "succeeded":
            raise JobFailedError(current)
        return current


class Client(BaseClient[pl.DataFrame]):
    """Answers Polars DataFrames."""

    def _frame(self, table: pa.Table) -> pl.DataFrame:
        return pl.DataFrame(table)


class PandasClient(BaseClient["pd.DataFrame"]):
    """Answers pandas DataFrames (needs pandas)."""

    def _frame(self, table: pa.Table) -> pd.DataFrame:
        return table.to_pandas()


def _seg(value: str | int) -> str:
    """A path segment: a model or family name, quoted whole."""
    return quote(str(value), safe="")


def _join(models: Sequence[str | int]) -> str:
    return ",".join(str(m) for m in models)


def _param(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _job_id(job: Job | int) -> int:
    return job.id if isinstance(job, Job) else int(job)
