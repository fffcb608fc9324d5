"""Running one job on this worker: claim it, load the model (cached), compute with progress,
deliver the results to the API.

The engine's progress callback is the one progress mechanism: each report updates what the
heartbeat thread sends to the API every `heartbeat_s` seconds (which also renews the job's
lease), and a `stop` answer (the job was cancelled) makes the next report raise `JobCancelledError`,
which ends the computation with nothing stored.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compute.errors import SpecError, StrataError
from service.client.errors import ApiError, UnreachableError
from service.settings import Settings
from service.worker.cache import ModelCache
from service.worker.client import ApiClient
from service.worker.stability import STABILITY_KIND, stability_body

if TYPE_CHECKING:  # annotations only: `strata beat` imports this module and needs no torch
    from compute.engine import Progress, ProgressFn

log = logging.getLogger("strata.worker")


class JobCancelledError(Exception):
    """The job was cancelled (or handed to another dispatch) while this worker ran it."""


@dataclass
class Identity:
    """Who this worker is: its name (in job records) and the device its jobs run on."""

    name: str
    device: str


class Reporter:
    """Sends a running job's progress as heartbeats from a background thread."""

    def __init__(
        self, client: ApiClient, job_id: int, dispatch: int, worker: str, every_s: float
    ) -> None:
        self.client, self.job_id, self.dispatch, self.worker = client, job_id, dispatch, worker
        self.every_s = every_s
        self.latest: Progress | None = None
        self.stop_requested = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="strata-heartbeat", daemon=True)

    def __enter__(self) -> Reporter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def progress(self, report: Progress) -> None:
        """The engine's progress callback."""
        self.latest = report
        if self.stop_requested.is_set():
            raise JobCancelledError(f"job {self.job_id} was cancelled")

    def _beat(self) -> None:
        p = self.latest
        fields: dict[str, Any] = {}
        if p is not None:
            fields = {
                "done": p.done,
                "total": p.total,
                "tokens_per_s": max(p.tokens_per_s, 0.0),
                "elapsed_s": max(p.elapsed_s, 0.0),
            }
        try:
            if self.client.heartbeat(self.job_id, self.dispatch, self.worker, **fields):
                self.stop_requested.set()
        except ApiError as exc:
            if exc.status in (404, 409):
                self.stop_requested.set()
        except UnreachableError as exc:  # the API is down: keep computing, try again next beat
            log.info("heartbeat of job %s not delivered: %s", self.job_id, exc)

    def _loop(self) -> None:
        while True:
            self._beat()
            if self._done.wait(self.every_s):
                return


def run_job(
    job_id: int,
    dispatch: int,
    *,
    settings: Settings,
    client: ApiClient,
    me: Identity,
    cache: ModelCache,
) -> str:
    """Run one job to its end; returns what happened: succeeded, failed, cancelled, refused.
    What it computes follows its configuration's `kind` (`BODIES`: a run's sweep, a refit
    family's stability); claiming, heartbeats, cancellation, delivery and failure are the
    same for every kind."""
    try:
        claimed = client.claim(job_id, dispatch, me.name, me.device)
    except ApiError as exc:  # stale message, cancelled job, wrong device: the API decided
        log.info("job %s (dispatch %s) not started: %s", job_id, dispatch, exc.detail)
        return "refused"
    deadline = settings.worker.delivery_timeout_s
    kind = str(claimed.config.get("kind", "run"))
    with Reporter(client, job_id, dispatch, me.name, settings.worker.heartbeat_s) as reporter:
        try:
            compute_body = BODIES.get(kind)
            if compute_body is None:
                raise SpecError(f"this worker cannot run jobs of kind {kind!r}: upgrade it")
            body, n_records = compute_body(
                claimed.config,
                settings=settings,
                device=me.device,
                cache=cache,
                progress=reporter.progress,
            )
            if reporter.stop_requested.is_set():
                raise JobCancelledError(f"job {job_id} was cancelled")
            client.deliver(job_id, body, deadline_s=deadline)
            log.info("job %s succeeded: %s records", job_id, n_records)
            return "succeeded"
        except JobCancelledError:
            log.info("job %s cancelled: stopped, nothing stored", job_id)
            return "cancelled"
        except ApiError as exc:  # the API refused the results (cancelled meanwhile, or invalid)
            if exc.status == 409:
                log.info("job %s: results not stored: %s", job_id, exc.detail)
                return "cancelled"
            return _fail(client, job_id, dispatch, me, f"results refused: {exc.detail}", deadline)
        except StrataError as exc:  # bad spec, model not loadable, NaN/inf: the job's fault
            return _fail(client, job_id, dispatch, me, f"{type(exc).__name__}: {exc}", deadline)
        except Exception as exc:
            if type(exc).__name__ == "SoftTimeLimitExceeded":
                message = (
                    f"the job ran past the soft time limit of "
                    f"{settings.worker.soft_time_limit_s} s (STRATA_WORKER__"
                    "SOFT_TIME_LIMIT_S)"
                )
            else:
                message = f"{type(exc).__name__}: {exc}"
                log.error("job %s crashed:\n%s", job_id, traceback.format_exc())
            return _fail(client, job_id, dispatch, me, message, deadline)


def sweep_body(
    config: dict[str, Any],
    *,
    settings: Settings,
    device: str,
    cache: ModelCache,
    progress: ProgressFn,
) -> tuple[bytes, int]:
    """Compute a claimed run configuration; the delivery body (records, then the neurons' top
    tokens and the per-sequence means, each recognised by its columns: queries/ingest.py) and
    the record count."""
    from compute.hardware import dtype_speed_warning
    from compute.lens.store import LensStore
    from compute.run import RunConfig, compute_run, result_metadata
    from service.exports import FORMATS

    run = with_worker_budgets(RunConfig.model_validate(config), settings)
    lm = cache.get(run.model, device)
    note = dtype_speed_warning(run.model.dtype, device)
    if note:  # in the worker's log: the job's ETA says the rest
        log.warning("%s", note)
    lenses = LensStore(settings.data_dir / "lenses")  # trained once, then reused
    result = compute_run(run, device=device, progress=progress, lm=lm, lenses=lenses)
    body = FORMATS["arrow"].encode(result.records, result_metadata(result))
    if result.neuron_tokens.num_rows:
        body += FORMATS["arrow"].encode(result.neuron_tokens, None)
    if result.sequence_means.num_rows:
        body += FORMATS["arrow"].encode(result.sequence_means, None)
    return body, result.records.num_rows


# What a job computes, by its configuration's `kind` (a run's configuration has none).
BODIES: dict[str, Callable[..., tuple[bytes, int]]] = {
    "run": sweep_body,
    STABILITY_KIND: stability_body,
}


def with_worker_budgets(config: Any, settings: Settings) -> Any:
    """The run configuration with this worker's memory and batch budgets where the job set
    none. They change speed and memory, not results, and are not part of the run's identity."""
    fill = {
        name: getattr(settings.worker, name)
        for name in ("memory_budget_mb", "tokens_per_batch")
        if getattr(config.options, name) is None and getattr(settings.worker, name)
    }
    if not fill:
        return config
    return config.model_copy(update={"options": config.options.model_copy(update=fill)})


def _fail(
    client: ApiClient, job_id: int, dispatch: int, me: Identity, message: str, deadline: float
) -> str:
    log.warning("job %s failed: %s", job_id, message)
    try:
        client.fail(job_id, dispatch, me.name, message, deadline_s=deadline)
    except ApiError as exc:
        log.info("failure of job %s not recorded: %s", job_id, exc.detail)
    return "failed"
