"""A typed Python client of the Strata API: results as Polars (or pandas) DataFrames read from
the API's Arrow IPC answers, jobs submitted and waited for.

    >>> from service.client import Client
    >>> client = Client("http://127.0.0.1:8000", api_key="...")     # the key only for writes
    >>> client.models()                                   # doctest: +SKIP
    >>> kl = client.metrics("tiny-4l-s0", "intervention.kl", component="drop")  # doctest: +SKIP
    >>> job = client.submit("tiny-4l-s0", metrics=["intervention"], n_sequences=8)  # doctest: +SKIP
    >>> client.wait(job).run_id                           # doctest: +SKIP

`PandasClient` has the same methods and answers pandas DataFrames. Every table has exactly the
columns of the API's CSV / Parquet / Arrow answer (docs/api.md); the context of the last data
answer (model, run, ...) is in `client.last_context`.

A 429 (over the service's rate limit) is waited out and retried, reads and writes alike (the
refused request did nothing), as long as its `Retry-After` fits in what is left of
`rate_limit_wait_s` (60 s per call by default); past that it is raised as `RateLimitedError`.

Exceptions (all `ClientError`):

    ClientError
    ├── ApiError              the API answered an error: .status, .error, .detail (its body)
    │   ├── BadRequestError       400    ├── ConflictError          409
    │   ├── UnauthorizedError     401    ├── UnprocessableError     422
    │   ├── ForbiddenError        403    ├── RateLimitedError       429
    │   └── NotFoundError         404    └── UnavailableError       503
    ├── UnreachableError      the service could not be reached (reads are retried first)
    ├── JobFailedError        wait(): the job failed or was cancelled (.job)
    └── WaitTimeoutError      wait(): the job had not finished in time (.job)
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import polars as pl
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

ARROW = "application/vnd.apache.arrow.stream"
V1 = "/api/v1"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


# ----------------------------------------------------------------------------------- errors


class ClientError(Exception):
    """Anything this client raises."""


class ApiError(ClientError):
    """The API answered with an error; carries its body `{error, detail, status}`."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class BadRequestError(ApiError):
    pass


class UnauthorizedError(ApiError):
    pass


class ForbiddenError(ApiError):
    pass


class NotFoundError(ApiError):
    pass


class ConflictError(ApiError):
    pass


class UnprocessableError(ApiError):
    pass


class UnavailableError(ApiError):
    pass


class RateLimitedError(ApiError):
    """429: over the service's rate limit for longer than the client waits; `.retry_after`
    is the number of seconds the service asked for."""

    retry_after: float | None = None


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError, 401: UnauthorizedError, 403: ForbiddenError, 404: NotFoundError,
    409: ConflictError, 422: UnprocessableError, 429: RateLimitedError, 503: UnavailableError}


class UnreachableError(ClientError):
    """The service could not be reached."""


class JobFailedError(ClientError):
    """A waited-for job ended failed or cancelled."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} ({job.model}) {job.state}: {job.error or 'no error given'}")
        self.job = job


class WaitTimeoutError(ClientError):
    """A waited-for job had not finished in time."""

    def __init__(self, job: Job, timeout: float) -> None:
        super().__init__(f"job {job.id} ({job.model}) still {job.state} after {timeout:g} s")
        self.job = job


def api_error(response: httpx.Response) -> ApiError:
    """The exception for an error answer, from its body (or its text when it has none)."""
    try:
        body = response.json()
        error, detail = str(body["error"]), str(body["detail"])
    except (ValueError, KeyError, TypeError):
        error, detail = f"http_{response.status_code}", response.text[:500]
    cls = _BY_STATUS.get(response.status_code, ApiError)
    exc = cls(response.status_code, error, detail)
    if isinstance(exc, RateLimitedError):
        exc.retry_after = retry_after(response)
    return exc


def retry_after(response: httpx.Response) -> float | None:
    """The seconds of a `Retry-After` header (the API sends whole seconds), or None."""
    try:
        return max(float(response.headers["Retry-After"]), 0.0)
    except (KeyError, ValueError):
        return None


# ------------------------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    fraction: float
    tokens_per_s: float
    eta_s: float | None


@dataclass(frozen=True)
class Job:
    """A job as the API describes it (`GET /api/v1/jobs/{id}`)."""

    id: int
    state: str
    model: str
    model_id: int
    run_id: int | None
    config_hash: str
    metric_version: str
    families: list[str]
    device: str | None
    dtype: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: Progress | None
    worker: str | None
    attempts: int
    error: str | None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Job:
        values: dict[str, Any] = {f.name: body.get(f.name) for f in fields(cls)}
        for name in ("created_at", "started_at", "finished_at"):
            if values[name] is not None:
                values[name] = datetime.fromisoformat(str(values[name]).replace("Z", "+00:00"))
        if values["progress"] is not None:
            values["progress"] = Progress(**{f.name: values["progress"].get(f.name)
                                             for f in fields(Progress)})
        values["families"] = list(values["families"] or [])
        return cls(**values)


# ---------------------------------------------------------------------------------- client

FrameT = TypeVar("FrameT")
Schema = dict[str, pl.DataType | type[pl.DataType]]


@dataclass(frozen=True)
class StagesResult(Generic[FrameT]):
    """`stages`: the four stages of each model (with a metric's per-stage aggregate when one was
    asked for) and the boundaries that place them, each with its rule and evidence."""

    stages: FrameT
    boundaries: FrameT


class BaseClient(ABC, Generic[FrameT]):
    """The API's reads and writes; subclasses choose the DataFrame type."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0,
                 retries: int = 3, backoff_s: float = 0.25, rate_limit_wait_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.retries = retries
        self.backoff_s = backoff_s
        self.rate_limit_wait_s = rate_limit_wait_s
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers,
                                  transport=transport)
        self.last_context: dict[str, Any] = {}

    # -- plumbing
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BaseClient[FrameT]:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @abstractmethod
    def _frame(self, table: pa.Table) -> FrameT: ...

    def _send(self, method: str, path: str, *, params: dict[str, Any] | None = None,
              body: Any = None, accept: str = "application/json") -> httpx.Response:
        """One request; reads (GET) are retried on connection errors with a growing pause, and
        any request refused with 429 after its `Retry-After` (within `rate_limit_wait_s`)."""
        clean = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        attempts = 1 + (self.retries if method == "GET" else 0)
        attempt, waited = 0, 0.0
        while True:
            try:
                response = self._http.request(method, path, params=clean, json=body,
                                              headers={"Accept": accept})
            except httpx.TransportError as exc:
                attempt += 1
                if attempt >= attempts:
                    raise UnreachableError(f"{method} {self.url}{path}: {exc!r}") from exc
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
                continue
            if response.status_code == 429:
                pause = retry_after(response)
                if pause is not None and waited + pause <= self.rate_limit_wait_s:
                    time.sleep(pause)
                    waited += pause
                    continue
            if response.is_error:
                raise api_error(response)
            return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

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
        return bool(self._json("GET", f"{V1}/health")["status"] == "ok")

    def models(self, *, name: str | None = None, source: str | None = None,
               family: str | None = None, architecture: str | None = None,
               min_layers: int | None = None, max_layers: int | None = None) -> FrameT:
        """Registered models (every page), one row each: id, name, source, architecture
        numbers, refit families, registration time."""
        items = self._pages(f"{V1}/models", dict(name=name, source=source, family=family,
                                                 architecture=architecture,
                                                 min_layers=min_layers, max_layers=max_layers))
        columns = ["id", "name", "source", "revision", "architecture", "n_layers", "d_model",
                   "n_heads", "d_mlp", "d_vocab", "d_vocab_real", "n_ctx", "n_params",
                   "normalization_type", "parallel_attn_mlp", "refit_families", "registered_at"]
        schema: Schema = {
            "id": pl.Int64, "name": pl.String, "source": pl.String, "revision": pl.String,
            "architecture": pl.String, **{c: pl.Int64 for c in columns[5:13]},
            "normalization_type": pl.String, "parallel_attn_mlp": pl.Boolean,
            "refit_families": pl.List(pl.String), "registered_at": pl.String}
        frame = pl.DataFrame([{c: m.get(c) for c in columns} for m in items], schema=schema)
        frame = frame.with_columns(pl.col("registered_at").str.to_datetime(time_zone="UTC"))
        return self._frame(frame.to_arrow())

    def model(self, model: str | int) -> dict[str, Any]:
        """One model with its number of runs, current run and other registrations."""
        return dict(self._json("GET", f"{V1}/models/{_seg(model)}"))

    def register(self, name: str, source: str, *, revision: str | None = None,
                 processing: dict[str, bool] | None = None) -> dict[str, Any]:
        """Register a model without computing (API key). The same registration again answers
        the existing model; its source under another name is a `ConflictError`."""
        body: dict[str, Any] = {"name": name, "source": source}
        if revision is not None:
            body["revision"] = revision
        if processing is not None:
            body["processing"] = processing
        return dict(self._json("POST", f"{V1}/models", body=body))

    def runs(self, *, model: str | int | None = None, status: str | None = None,
             family: str | None = None) -> FrameT:
        """Runs, newest first (every page): id, model, status, families, versions, timings."""
        items = self._pages(f"{V1}/runs", dict(model=model, status=status, family=family))
        rows = [{"id": r["id"], "model_id": r["model_id"], "model": r["model"],
                 "status": r["status"], "families": r["families"],
                 "config_hash": r["config_hash"], "metric_version": r["metric_version"],
                 "device": r["device"], "dtype": r["dtype"],
                 "tokens_evaluated": r["tokens_evaluated"], "n_records": r["n_records"],
                 "error": r["error"], "created_at": r["timings"]["created_at"],
                 "finished_at": r["timings"]["finished_at"], "wall_s": r["timings"]["wall_s"]}
                for r in items]
        schema: Schema = {
            "id": pl.Int64, "model_id": pl.Int64, "model": pl.String, "status": pl.String,
            "families": pl.List(pl.String), "config_hash": pl.String,
            "metric_version": pl.String, "device": pl.String, "dtype": pl.String,
            "tokens_evaluated": pl.Int64, "n_records": pl.Int64, "error": pl.String,
            "created_at": pl.String, "finished_at": pl.String, "wall_s": pl.Float64}
        frame = pl.DataFrame(rows, schema=schema).with_columns(
            pl.col("created_at", "finished_at").str.to_datetime(time_zone="UTC"))
        return self._frame(frame.to_arrow())

    def _pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = self._json("GET", path, params={**params, "limit": 500, "offset": offset})
            items += page["items"]
            offset = page.get("next_offset")
        return items

    # -- results
    def metrics(self, model: str | int, metric: str, component: str | None = None, *,
                layer_min: int | None = None, layer_max: int | None = None,
                run_id: int | None = None, metric_version: str | None = None) -> FrameT:
        """Per-layer rows of one metric of a model's current run: metric, component, layer,
        relative_depth, value, stderr, n, unit."""
        return self._table(f"{V1}/models/{_seg(model)}/metrics", dict(
            metric=metric, component=component, layer_min=layer_min, layer_max=layer_max,
            run_id=run_id, metric_version=metric_version))

    def heads(self, model: str | int, metric: str = "heads.induction", *,
              run_id: int | None = None, metric_version: str | None = None) -> FrameT:
        """Per-head rows of a heads.* or attention.* metric."""
        return self._table(f"{V1}/models/{_seg(model)}/heads", dict(
            metric=metric, run_id=run_id, metric_version=metric_version))

    def compare(self, models: Sequence[str | int], metric: str, component: str | None = None,
                *, bins: int = 20, method: str = "interpolate",
                metric_version: str | None = None) -> FrameT:
        """One metric across models on relative depth, one row per model and bin."""
        return self._table(f"{V1}/compare", dict(
            models=_join(models), metric=metric, component=component, bins=bins,
            method=method, metric_version=metric_version))

    def stages(self, models: Sequence[str | int] | str | int, metric: str | None = None,
               component: str | None = None, *,
               metric_version: str | None = None) -> StagesResult[FrameT]:
        """Stage boundaries with their evidence, and the four stages of each model (with the
        mean of `metric` over each stage when given)."""
        names = [models] if isinstance(models, str | int) else list(models)
        stages = self._table(f"{V1}/stages", dict(models=_join(names), metric=metric,
                                                 component=component,
                                                 metric_version=metric_version))
        rows = [{"model": m["name"], "model_id": m["id"], "run_id": m["run_id"],
                 "boundary": b["boundary"], "ends_stage": b["ends_stage"], "found": b["found"],
                 "layer": b["layer"], "relative_depth": b["relative_depth"],
                 "clear": b.get("clear"), "sharpness": b.get("sharpness"),
                 "interval_low": (b.get("interval") or [None, None])[0],
                 "interval_high": (b.get("interval") or [None, None])[1],
                 "interval_level": b.get("interval_level"), "rule": b["rule"],
                 "evidence": json.dumps(b["evidence"], sort_keys=True)}
                for m in self.last_context.get("models", []) for b in m["boundaries"]]
        schema: Schema = {
            "model": pl.String, "model_id": pl.Int64, "run_id": pl.Int64, "boundary": pl.Int64,
            "ends_stage": pl.String, "found": pl.Boolean, "layer": pl.Int64,
            "relative_depth": pl.Float64, "clear": pl.Boolean, "sharpness": pl.Float64,
            "interval_low": pl.Int64, "interval_high": pl.Int64, "interval_level": pl.Float64,
            "rule": pl.String, "evidence": pl.String}
        boundaries = pl.DataFrame(rows, schema=schema)
        return StagesResult(stages, self._frame(boundaries.to_arrow()))

    def neurons(self, model: str | int, neuron_class: str = "prediction", *, top: int = 20,
                layer: int | None = None, run_id: int | None = None,
                metric_version: str | None = None) -> FrameT:
        """The top neurons of a class in each layer (or one): moments, flags, and their most
        promoted / suppressed tokens (list columns)."""
        return self._table(f"{V1}/models/{_seg(model)}/neurons", {
            "class": neuron_class, "top": top, "layer": layer, "run_id": run_id,
            "metric_version": metric_version})

    def neuron_counts(self, model: str | int, *, run_id: int | None = None) -> FrameT:
        """Per layer: neurons of each class, counts and fractions of d_mlp."""
        return self._table(f"{V1}/models/{_seg(model)}/neurons/counts", dict(run_id=run_id))

    def families(self) -> list[dict[str, Any]]:
        """Refit families: name, anchor and members."""
        return list(self._json("GET", f"{V1}/families"))

    def stability(self, family: str, metric: str | None = None, *,
                  per_head: bool = False) -> FrameT:
        """Head stability (and its null baseline, residual CKA) of a refit family, per layer."""
        return self._table(f"{V1}/families/{_seg(family)}/stability",
                           dict(metric=metric, per_head=per_head))

    # -- jobs
    def submit(self, model: str | int, metrics: Sequence[str] | None = None, *,
               tokens: str | None = None, n_sequences: int | None = None,
               seq_len: int | None = None, device: str | None = None, dtype: str | None = None,
               force: bool = False) -> Job:
        """Queue a computation of a registered model (API key); the deployment's defaults
        fill what is not given. Not retried: a lost answer may still have queued the job."""
        body: dict[str, Any] = {"model": str(model), "force": force}
        for key, value in (("metrics", None if metrics is None else list(metrics)),
                           ("tokens", tokens), ("n_sequences", n_sequences),
                           ("seq_len", seq_len), ("device", device), ("dtype", dtype)):
            if value is not None:
                body[key] = value
        return Job.from_json(self._json("POST", f"{V1}/jobs", body=body))

    def job(self, job: Job | int) -> Job:
        return Job.from_json(self._json("GET", f"{V1}/jobs/{_job_id(job)}"))

    def jobs(self, *, state: str | None = None, model: str | int | None = None,
             limit: int = 100, offset: int = 0) -> list[Job]:
        page = self._json("GET", f"{V1}/jobs", params=dict(state=state, model=model,
                                                           limit=limit, offset=offset))
        return [Job.from_json(item) for item in page["items"]]

    def cancel(self, job: Job | int) -> Job:
        """Cancel a queued or running job (API key)."""
        return Job.from_json(self._json("DELETE", f"{V1}/jobs/{_job_id(job)}"))

    def wait(self, job: Job | int, *, timeout: float | None = None, poll_s: float = 1.0,
             on_progress: Callable[[Job], None] | None = None) -> Job:
        """Poll a job until it finishes; the succeeded job (its `run_id` holds the results).
        Raises `JobFailedError` when it fails or is cancelled, `WaitTimeoutError` after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        current = self.job(job)
        while not current.done:
            if on_progress is not None:
                on_progress(current)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(current, timeout or 0.0)
            time.sleep(poll_s if deadline is None
                       else max(0.0, min(poll_s, deadline - time.monotonic())))
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
