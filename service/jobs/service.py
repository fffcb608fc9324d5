"""The job service: every decision about a job, made in the API process (the one writer).

    submit  ──► queued ──claim──► running ──deliver──► succeeded
                  │                  │  └──fail────► failed
                  │                  └──lease lost──► queued again (dispatch + 1), or failed
                  └──cancel──► cancelled ◄──cancel── running (the worker stops at its next
                                                              heartbeat; nothing is stored)

A configuration (config hash + metric version) has at most one live job. Workers reach these
methods over HTTP; a message whose dispatch number is not the job's current one is refused,
so a lost-and-requeued job never runs twice, and results delivered late are stored once
(ingest is idempotent by configuration hash).

(Longer than the ~500 lines a module should have, on purpose: every transition of the state
machine above is a method of the one class that holds the lock and the session; split across
modules, the invariants a transition keeps — one live job per configuration, dispatch numbers,
held reconciliation jobs — would have to be read in several places at once.)

People's jobs first: a job someone submitted goes to the broker at once; a job reconciliation
queued (reason `reconcile`) stays in the database, unsent, until its queue has a worker with
nothing to do — no more messages wait in the broker for a queue than it has workers. A
person's job submitted behind any number of reconciliation jobs is therefore next in the broker
on every transport (filesystem, Redis, RabbitMQ alike: no message priorities), and a running
reconciliation job is never interrupted. Held jobs are released as jobs end (delivered, failed,
cancelled) and on every upkeep round.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from compute.errors import SpecError
from compute.run import METRIC_VERSION, RunConfig, RunResult
from service.jobs.board import Board, WorkerSeen
from service.jobs.broker import OPS_QUEUE, Broker
from service.jobs.configs import (
    JobRequest,
    check_lens,
    check_sequences,
    default_config,
    run_config,
)
from service.jobs.errors import JobConflictError, JobNotFoundError
from service.jobs.estimate import (
    RATE_JOBS,
    Finished,
    above_threshold,
    computing_seconds,
    describe,
)
from service.jobs.estimate import estimate as estimate_run
from service.jobs.families import FamilyJobs
from service.jobs.parts import JobView, NewJob, mark_succeeded
from service.schemas.jobs import Estimate
from service.schemas.runs import IngestSummary
from service.settings import Settings
from service.store import Store, job_rows
from service.store.ingest import ingest_result
from service.store.tables import FINAL_STATES, JOB_STATES, JobRow, RegisteredModelRow, utcnow

log = logging.getLogger("strata.jobs")

# Jobs made by reconciliation, which wait behind people's jobs (`release_background`).
BACKGROUND_REASONS = ("reconcile",)


@dataclass(frozen=True)
class Claimed:
    """What a worker needs to run a job it was allowed to start."""

    config: dict[str, Any]
    device: str | None
    attempt: int


def _still_queued(dispatch: int) -> Callable[[JobRow], bool]:
    return lambda job: job.state == "queued" and job.dispatch == dispatch


def device_matches(requested: str | None, worker_device: str) -> bool:
    if requested is None:
        return True
    kind = requested.split(":")[0]
    return worker_device.split(":")[0] == kind


class JobService:
    def __init__(self, store: Store, settings: Settings, broker: Broker, board: Board) -> None:
        self.store = store
        self.settings = settings
        self.broker = broker
        self.board = board
        self._reconcile_lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.families = FamilyJobs(self)
        self._held_back: set[str] = set()  # default runs logged as waiting to be asked for

    # ------------------------------------------------------------------ reads
    def view(self, job: JobRow, names: dict[int, str] | None = None) -> JobView:
        live = self.board.live(job.id) if job.state == "running" else None
        if names is None:  # one job: its model's name only
            with self.store.read() as conn, Session(bind=conn) as session:
                model = session.get(RegisteredModelRow, job.model_id)
                names = {job.model_id: model.name} if model is not None else {}
        return JobView(job, live, names.get(job.model_id, str(job.model_id)))

    def get(self, job_id: int) -> JobView:
        with self.store.read() as conn, Session(bind=conn, expire_on_commit=False) as session:
            job = job_rows.get(session, job_id)
            if job is None:
                raise JobNotFoundError(f"job {job_id} does not exist")
            session.expunge(job)
        return self.view(job)

    def page(
        self, *, state: str | None, model: str | None, limit: int, offset: int
    ) -> tuple[list[JobView], int]:
        if state is not None and state not in JOB_STATES:
            raise SpecError(f"state {state!r} is not one of {', '.join(JOB_STATES)}")
        with self.store.read() as conn, Session(bind=conn, expire_on_commit=False) as session:
            model_id = None
            if model is not None:
                found = job_rows.model(session, model)
                if found is None:
                    raise JobNotFoundError(f"no registered model is named {model!r}")
                model_id = found.id
            jobs, total = job_rows.page(
                session, state=state, model_id=model_id, limit=limit, offset=offset
            )
            names = job_rows.model_names(session)
            session.expunge_all()
        return [self.view(j, names) for j in jobs], total

    def summary(self) -> str:
        """One line for the console: counts by state, and each running job's progress."""
        from collections import Counter

        with self.store.read() as conn, Session(bind=conn) as session:
            jobs = job_rows.recent(session, 1000)
            names = job_rows.model_names(session)
            states = Counter(j.state for j in jobs)
            running = [
                (j.id, names.get(j.model_id, str(j.model_id))) for j in jobs if j.state == "running"
            ]
        if not jobs:
            return ""
        parts = [f"{states[s]} {s}" for s in JOB_STATES if states[s]]
        for job_id, model in running:
            live = self.board.live(job_id)
            if live is not None and live.total:
                eta = "" if live.eta_s is None else f", ETA {live.eta_s:.0f} s"
                parts.append(f"job {job_id} {model} {100 * live.done / live.total:.0f}%{eta}")
        return "jobs: " + ", ".join(parts)

    # ------------------------------------------------------------------ submit
    def check_device(self, device: str | None) -> None:
        if device is None:
            return
        if device.split(":")[0] not in ("cpu", "cuda", "mps"):
            raise SpecError(f"device {device!r} is not cpu, cuda or cuda:<n>")
        known = set(self.settings.jobs.devices)
        known |= {w.device for w in self.compute_workers()}
        if known and not any(device_matches(device, d) for d in known):
            raise SpecError(
                f"no worker has device {device!r}: the workers have {', '.join(sorted(known))}"
            )

    def check_queue(self, queue: str) -> None:
        """A queue that no live worker consumes is refused (while any worker is known)."""
        consumed = {q for w in self.compute_workers() for q in w.queues} - {OPS_QUEUE}
        if consumed and queue not in consumed:
            raise SpecError(
                f"no worker consumes queue {queue!r}: the workers consume "
                f"{', '.join(sorted(consumed))}"
            )

    def compute_workers(self) -> list[WorkerSeen]:
        """Workers heard from recently that consume a computing queue (not beat, whose `ops`
        queue only does bookkeeping)."""
        return [
            w
            for w in self.board.workers(within_s=self.worker_window())
            if set(w.queues) - {OPS_QUEUE}
        ]

    def worker_window(self) -> float:
        return max(6 * self.settings.worker.heartbeat_s, 60.0)

    def configure(self, request: JobRequest) -> tuple[RegisteredModelRow, RunConfig]:
        """The model and run configuration a request means; `SpecError` naming what is wrong."""
        with self.store.read() as conn, Session(bind=conn, expire_on_commit=False) as session:
            model = job_rows.model(session, request.model)
            if model is None:
                raise SpecError(
                    f"unknown model {request.model!r}: register it first "
                    "(POST /api/v1/models or `strata models add`)"
                )
            stored_tokens = None
            if request.tokens and request.tokens.startswith("source:"):
                source = job_rows.token_source(session, request.tokens.removeprefix("source:"))
                stored_tokens = source.spec if source is not None else None
            session.expunge(model)
        self.check_device(request.device)
        self.check_queue(request.queue)
        config = run_config(request, model.spec, model.n_ctx, self.settings, stored_tokens)
        check_lens(
            config,
            self.settings,
            n_layers=model.n_layers,
            d_model=model.d_model,
            centred=model.center_writing_weights,
        )
        return model, config

    def submit(self, request: JobRequest, *, reason: str = "api") -> tuple[JobView, bool]:
        """The job for a request, and whether it is new, with what it would cost (`estimate`).
        Raises `SpecError` before anything is stored or sent, `BrokerUnavailableError` if the
        broker does not take it (nothing kept)."""
        model, config = self.configure(request)
        # Counted for people's requests; reconciliation's default runs are not (every model's
        # tokenizer read at every start, for the deployment's own small default).
        check_sequences(config)
        found = self.estimate(model, config, device=request.device, queue=request.queue)
        job, new = self._create(model, config, request, reason)
        view = self.settle(job, new, reason)
        return dataclasses.replace(view, estimate=found), new

    # ------------------------------------------------------------------ estimates
    def estimate(
        self,
        model: RegisteredModelRow,
        config: RunConfig,
        *,
        device: str | None = None,
        queue: str = "gpu",
    ) -> Estimate:
        """What `config` would cost (`service.jobs.estimate`): FLOPs, peak memory on the
        device it would run on, and its time on each live worker that could take it, by the
        rate that worker's finished jobs measured."""
        workers = [
            w
            for w in self.compute_workers()
            if queue in w.queues and device_matches(device, w.device)
        ]
        on = device or (workers[0].device if workers else self.settings.worker.device)
        with self.store.read() as conn, Session(bind=conn, expire_on_commit=False) as session:
            done = job_rows.finished_by(session, [w.name for w in workers], RATE_JOBS)
            session.expunge_all()
        finished = []
        for job, job_model, timings in done:
            try:
                job_config = RunConfig.model_validate(job.config)
            except ValueError:  # a configuration of an older code version: not measured
                continue
            wall = (job.finished_at - job.started_at).total_seconds()  # type: ignore[operator]
            finished.append(
                Finished(job.worker or "", job_config, job_model, wall, computing_seconds(timings))
            )
        return estimate_run(
            config,
            model,
            device=on,
            workers=[(w.name, w.device) for w in workers],
            finished=finished,
        )

    def default_job(self, config: RunConfig) -> JobRow | None:
        """The newest job of a configuration (a default run's: was it ever queued?)."""
        with self.store.read() as conn, Session(bind=conn, expire_on_commit=False) as session:
            job = job_rows.latest_for(session, config.config_hash(), config.metric_version)
            if job is not None:
                session.expunge(job)
        return job

    def default_run_plan(self, model: RegisteredModelRow) -> tuple[RunConfig, Estimate, bool]:
        """A model's default run: its configuration, its estimate, and whether reconciliation
        may queue it on its own (false above `STRATA_JOBS__AUTO_RUN_MAX_TFLOP` or of unknown
        cost: it waits to be asked). `SpecError` when the defaults do not fit the model."""
        config = default_config(model.spec, model.n_ctx, self.settings)
        found = self.estimate(model, config)
        return config, found, not above_threshold(found, self.settings.jobs.auto_run_max_tflop)

    def settle(self, job: JobRow, new: bool, reason: str) -> JobView:
        """After `create` for a person's request: a new job is sent at once; a held
        reconciliation job of the same configuration is not held any more (sent now)."""
        if new and job.state == "queued":
            self._dispatch_new(job)
        elif (
            job.state == "queued" and job.dispatched_at is None and job.reason in BACKGROUND_REASONS
        ):  # a person asks for a held job: not held now
            promoted = self._set(job.id, only_if=_still_queued(job.dispatch), reason=reason)
            if promoted is not None:
                self._send(promoted.id, promoted.dispatch, promoted.queue)
                job = self.get(job.id).job
        return self.view(job)

    def _create(
        self, model: RegisteredModelRow, config: RunConfig, request: JobRequest, reason: str
    ) -> tuple[JobRow, bool]:
        return self.create(
            NewJob(
                model_id=model.id,
                config_hash=config.config_hash(),
                metric_version=config.metric_version,
                config=json.loads(config.canonical_json()),
                families=sorted(config.families),
                device=request.device,
                dtype=config.model.dtype,
                queue=request.queue,
                force=request.force,
            ),
            reason,
        )

    def create(self, new: NewJob, reason: str) -> tuple[JobRow, bool]:
        """The job of a configuration, and whether it is new: its live job if it has one; else
        (unless `force`) its succeeded job, or a succeeded job for a run stored elsewhere
        (`strata compute --store`, `strata stability --store`: one run); else a new queued job
        (not yet sent)."""
        config_hash, version = new.config_hash, new.metric_version
        with self.store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
            live = job_rows.live_for(session, config_hash, version)
            if live is not None:
                return live, False
            state, run_id = "queued", None
            if not new.force:
                done = job_rows.latest_for(session, config_hash, version, ("succeeded",))
                if done is not None:
                    return done, False
                run = job_rows.succeeded_run(session, config_hash, version)
                if run is not None:  # computed elsewhere: one run
                    state, run_id, reason = "succeeded", run.id, "stored"
            job = JobRow(
                model_id=new.model_id,
                config_hash=config_hash,
                metric_version=version,
                config=new.config,
                families=new.families,
                device=new.device,
                dtype=new.dtype,
                state=state,
                reason=reason,
                forced=new.force,
                dispatch=0,
                attempts=0,
                queue=new.queue,
                run_id=run_id,
                created_at=utcnow(),
            )
            if state == "succeeded":
                job.finished_at = job.created_at
            session.add(job)
            session.flush()
            return job, True

    def _dispatch_new(self, job: JobRow) -> None:
        try:
            self.broker.send(job.id, job.dispatch, job.queue)
        except Exception:
            with self.store.write() as conn, Session(bind=conn) as session:
                stored = job_rows.get(session, job.id)
                if stored is not None and stored.state == "queued":
                    session.delete(stored)
                    session.flush()
            raise
        self._set(job.id, dispatched_at=utcnow())
        job.dispatched_at = utcnow()

    def _set(
        self, job_id: int, *, only_if: Callable[[JobRow], bool] | None = None, **values: Any
    ) -> JobRow | None:
        """Update a job's row (if `only_if` holds for it); the updated job, detached."""
        with self.store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
            job = job_rows.get(session, job_id)
            if job is None or (only_if is not None and not only_if(job)):
                return None
            for key, value in values.items():
                setattr(job, key, value)
            session.flush()
            session.expunge(job)
            return job

    # ------------------------------------------------------------------ cancel
    def cancel(self, job_id: int) -> JobView:
        job = self._set(
            job_id,
            only_if=lambda j: j.state not in FINAL_STATES,
            state="cancelled",
            finished_at=utcnow(),
            error="cancelled by request",
        )
        if job is None:
            current = self.get(job_id).job  # 404 if it does not exist
            raise JobConflictError(
                f"job {job_id} has already {current.state}; only queued or "
                "running jobs can be cancelled"
            )
        self.board.forget(job_id)
        self.release_background()
        return self.view(job)

    def cancel_queued(self, job_id: int, why: str) -> bool:
        """Cancel a job no worker has started (a running one is left to finish); whether it
        was cancelled. `why` is its error."""
        job = self._set(
            job_id,
            only_if=lambda j: j.state == "queued",
            state="cancelled",
            finished_at=utcnow(),
            error=why,
        )
        if job is None:
            return False
        self.board.forget(job_id)
        return True

    # ------------------------------------------------------------------ the worker's side
    def claim(self, job_id: int, dispatch: int, worker: str, device: str) -> Claimed:
        """Start a job on a worker. Refused (`JobConflictError`) unless the job is queued under
        this dispatch number; a job asking for a device the worker lacks fails, clearly."""
        refused = None
        with self.store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
            job = job_rows.get(session, job_id)
            if job is None:
                raise JobNotFoundError(f"job {job_id} does not exist")
            if job.state != "queued" or job.dispatch != dispatch:
                raise JobConflictError(
                    f"job {job_id} is {job.state} (dispatch {job.dispatch}); "
                    f"message {dispatch} is stale: not started"
                )
            if device_matches(job.device, device):
                job.state, job.worker, job.started_at = "running", worker, utcnow()
                job.attempts += 1
            else:  # failed, and committed so: the refusal is the job's end, not an error here
                job.state, job.finished_at, job.worker = "failed", utcnow(), worker
                job.error = refused = (
                    f"job asks for device {job.device!r} but worker {worker} runs on "
                    f"{device!r}; submit it with a device the workers have"
                )
            session.flush()
            claimed = Claimed(dict(job.config), job.device, job.attempts)
        if refused is not None:
            self.release_background()
            raise JobConflictError(refused)
        self.board.start(job_id, dispatch, worker)
        return claimed

    def heartbeat(
        self,
        job_id: int,
        dispatch: int,
        worker: str,
        *,
        done: int = 0,
        total: int = 0,
        tokens_per_s: float = 0.0,
        elapsed_s: float = 0.0,
    ) -> bool:
        """Record a running job's progress and renew its lease. True: the worker must stop (the
        job was cancelled, finished, or handed to another dispatch)."""
        with self.store.read() as conn, Session(bind=conn) as session:
            job = job_rows.get(session, job_id)
            if job is None:
                raise JobNotFoundError(f"job {job_id} does not exist")
            current = job.state == "running" and job.dispatch == dispatch
        if not current:
            return True
        self.board.beat(
            job_id,
            dispatch,
            worker,
            done=done,
            total=total,
            tokens_per_s=tokens_per_s,
            elapsed_s=elapsed_s,
        )
        return False

    def fail(self, job_id: int, dispatch: int, worker: str, error: str) -> JobView:
        job = self._set(
            job_id,
            only_if=lambda j: j.state == "running" and j.dispatch == dispatch,
            state="failed",
            error=error[:4000],
            finished_at=utcnow(),
            worker=worker,
        )
        if job is None:
            current = self.get(job_id).job
            raise JobConflictError(
                f"job {job_id} is {current.state} (dispatch "
                f"{current.dispatch}): this failure report is stale"
            )
        self.board.forget(job_id)
        log.info("job %s failed on %s: %s", job_id, worker, error)
        self.release_background()
        return self.view(job)

    def deliver(self, result: RunResult, job_id: int) -> IngestSummary:
        """Store a job's results and mark it succeeded, in one transaction. Results of a
        cancelled job are refused (nothing stored)."""

        def mark(session: Session, summary: IngestSummary) -> None:
            mark_succeeded(
                session,
                job_id,
                (result.config_hash, result.config.metric_version),
                summary.run_id,
            )

        summary = ingest_result(self.store, result, also=mark)
        self.delivered(job_id)
        return summary

    def delivered(self, job_id: int) -> None:
        """After a job's results were stored: its live state goes, held jobs may be sent."""
        self.board.forget(job_id)
        self.release_background()

    # ------------------------------------------------------------------ upkeep
    def requeue_lost(self) -> list[int]:
        """Running jobs whose worker stopped sending heartbeats: queued again under a new
        dispatch number (or failed after `max_attempts`). Returns the re-sent job ids."""
        resent = []
        for job_id, dispatch in self.board.expired():
            self.board.forget(job_id)
            max_attempts = self.settings.jobs.max_attempts

            def lost(j: JobRow, dispatch: int = dispatch) -> bool:
                return j.state == "running" and j.dispatch == dispatch

            with self.store.write() as conn, Session(bind=conn, expire_on_commit=False) as s:
                job = job_rows.get(s, job_id)
                if job is None or not lost(job):
                    continue
                if job.attempts >= max_attempts:
                    job.state, job.finished_at = "failed", utcnow()
                    job.error = (
                        f"the worker was lost {job.attempts} times (last: "
                        f"{job.worker}); giving up (STRATA_JOBS__MAX_ATTEMPTS)"
                    )
                    s.flush()
                    log.warning("job %s: %s", job_id, job.error)
                    continue
                job.state, job.dispatch, job.dispatched_at = "queued", job.dispatch + 1, None
                s.flush()
                log.warning(
                    "job %s: worker %s lost, re-queued (dispatch %s)",
                    job_id,
                    job.worker,
                    job.dispatch,
                )
            resent.append(job_id)
        self.dispatch_pending()
        return resent

    def dispatch_pending(self) -> None:
        """Send people's queued jobs that no message was sent for (a re-queue, or a crash
        between storing and sending), then the held reconciliation jobs that have a free
        worker. A broker that is down is tried again on the next round."""
        with self.store.read() as conn, Session(bind=conn) as session:
            pending = job_rows.unsent(session, background=BACKGROUND_REASONS, held=False)
        for job_id, dispatch, queue in pending:
            if not self._send(job_id, dispatch, queue):
                return
        self.release_background()

    def _send(self, job_id: int, dispatch: int, queue: str) -> bool:
        """Send a stored, unsent job's message and note it; False if the broker refused."""
        try:
            self.broker.send(job_id, dispatch, queue)
        except Exception as exc:
            log.warning("job %s not sent yet: %s", job_id, exc)
            return False
        self._set(job_id, only_if=_still_queued(dispatch), dispatched_at=utcnow())
        return True

    def queue_slots(self, queue: str) -> int:
        """How many messages of `queue` may be in flight (running or waiting in the broker)
        before reconciliation jobs are held back: one per worker that consumes it, at least
        one (so the first worker to appear finds work)."""
        return max(1, sum(queue in w.queues for w in self.compute_workers()))

    def release_background(self) -> list[int]:
        """Send held reconciliation jobs, oldest first, to queues with fewer jobs in flight
        than workers (`queue_slots`); the rest stay in the database, behind any job a person
        submits meanwhile. Returns the sent job ids. Never raises: it runs after a job's end
        has been stored, and the next upkeep round tries again."""
        sent: list[int] = []
        try:
            with self._release_lock:
                with self.store.read() as conn, Session(bind=conn) as session:
                    busy = job_rows.busy_by_queue(session)
                    held = job_rows.unsent(
                        session, background=BACKGROUND_REASONS, held=True, limit=1000
                    )
                slots: dict[str, int] = {}
                for job_id, dispatch, queue in held:
                    if queue not in slots:
                        slots[queue] = self.queue_slots(queue)
                    if busy.get(queue, 0) >= slots[queue]:
                        continue
                    if not self._send(job_id, dispatch, queue):
                        break
                    busy[queue] = busy.get(queue, 0) + 1
                    sent.append(job_id)
        except Exception:  # logged; the next upkeep round tries again
            log.exception("releasing held reconciliation jobs failed")
        return sent

    def grace_running(self) -> None:
        """After a restart: every running job gets a fresh lease (its worker may still be at
        it, and could not send heartbeats while the API was down)."""
        with self.store.read() as conn, Session(bind=conn) as session:
            running = [
                (j.id, j.dispatch, j.worker or "?") for j in job_rows.in_state(session, "running")
            ]
        self.board.grace(running)

    def _may_queue_on_its_own(self, model: RegisteredModelRow, config: RunConfig) -> bool:
        """Whether reconciliation may queue this default run unasked: its estimate is within
        `STRATA_JOBS__AUTO_RUN_MAX_TFLOP` (said once per configuration in the log if not)."""
        if self.settings.jobs.auto_run_max_tflop is None:
            return True
        # the FLOPs decide: no worker's rate is needed (nor read, every minute, per model)
        found = estimate_run(config, model, device="cpu", workers=(), finished=())
        if not above_threshold(found, self.settings.jobs.auto_run_max_tflop):
            return True
        key = config.config_hash()
        if key not in self._held_back:
            self._held_back.add(key)
            log.info(_never_asked(model, config, found))
        return False

    def reconcile_soon(self, delay_s: float = 0.0) -> None:
        """Reconcile in the background (after a registration: the answer need not wait), after
        `delay_s` seconds (a refit family's edits settling); not at all if the service stops
        meanwhile."""

        def run() -> None:
            if self._stopping.wait(delay_s):
                return
            try:
                self.reconcile()
            except Exception:  # logged; the next scheduled reconciliation tries again
                log.exception("reconciliation failed")

        thread = threading.Thread(target=run, name="strata-reconcile", daemon=True)
        with self._threads_lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """At shutdown: background reconciliations stop after the model at hand, and are
        waited for (a thread cut off inside a DuckDB call at exit aborts the process)."""
        self._stopping.set()
        with self._threads_lock:
            threads = list(self._threads)
        end = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(timeout=max(end - time.monotonic(), 0.0))

    def reconcile(self, *, reason: str = "reconcile") -> list[int]:
        """Queue the default run of every registered model that lacks it under the current
        metric version, once: a model whose default run was ever queued (even if it failed or
        was cancelled) is not queued again, cheapest model first (held jobs are sent oldest
        first, so the first results arrive soonest); then the stability of every refit family
        whose configuration (members, anchor, prompts, metric version) has none
        (`FamilyJobs.reconcile`). Returns the new job ids. Serialised: two reconciliations
        never queue one configuration twice."""
        queued: list[int] = []
        if not self.settings.jobs.reconcile:  # off: only what is submitted is computed
            return queued
        with self._reconcile_lock:
            with self.store.read() as conn, Session(bind=conn, expire_on_commit=False) as session:
                models = job_rows.all_models(session)
                session.expunge_all()
            for model in sorted(models, key=_default_run_cost):
                if self._stopping.is_set():
                    break
                try:
                    _, config = self.configure(JobRequest(model=str(model.id)))
                except SpecError as exc:
                    log.warning("model %s (%s) has no default run: %s", model.id, model.name, exc)
                    continue
                config_hash = config.config_hash()
                with self.store.read() as conn, Session(bind=conn) as session:
                    known = (
                        job_rows.latest_for(session, config_hash, METRIC_VERSION) is not None
                        or job_rows.succeeded_run(session, config_hash, METRIC_VERSION) is not None
                    )
                if known or not self._may_queue_on_its_own(model, config):
                    continue
                job, new = self._create(model, config, JobRequest(model=str(model.id)), reason)
                if new and job.state == "queued":  # held: sent when a worker is free
                    queued.append(job.id)
            if not self._stopping.is_set():  # then every refit family's stability
                queued += self.families.reconcile(reason)
        if queued:
            log.info("reconcile queued jobs %s", queued)
            self.release_background()
        return queued


def _never_asked(model: RegisteredModelRow, config: RunConfig, found: Estimate) -> str:
    return (
        f"model {model.id} ({model.name}): its default run is not queued on its own "
        f"({describe(found)}; above STRATA_JOBS__AUTO_RUN_MAX_TFLOP or of unknown cost); "
        f"ask for it with `strata jobs submit --model {model.name}`"
    )


def _default_run_cost(model: RegisteredModelRow) -> tuple[float, int]:
    """How much a model's default run costs, roughly: each layer's interventions run a forward
    pass, which scales with the parameters (unknown numbers sort last; ties by id)."""
    if model.n_params is None or model.n_layers is None:
        return (float("inf"), model.id)
    return (float(model.n_params) * model.n_layers, model.id)
