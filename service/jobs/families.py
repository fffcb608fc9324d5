"""A refit family's stability as a job: queued, claimed, leased, cancelled and re-queued by the
one state machine of `service.jobs.service` like any run, with a configuration of its own.

A stability job's configuration is the family's as it stands when the job is made
(`service.store.stability.stability_config`: the family's name, anchor and members, its
comparison options, the prompt set, the metric version) and its identity that configuration's
hash: one live job and one stored run per configuration. The job belongs to the anchor model
(`model_id`), computes the `stability` family, and is recognised by its configuration's
`kind` (the worker's `service.worker.stability` runs it; its results come back through the same
`POST /api/v1/runs/ingest?job_id=` and are stored by `ingest_stability`, leaving the family's
membership as it is now).

Reconciliation queues, once, the stability of every family whose configuration has no job or
run: a family made or grown (members join or leave), a new metric version, a member's weights
changed (its checkpoint registered again with another checksum: the family follows the new
registration, `service.store.families.follow_registrations`). Those jobs wait behind people's
jobs, as every reconciliation job does.

One job per settled membership: a family is queued only once it has gone unchanged for
`STRATA_JOBS__FAMILY_SETTLE_S` (`StoredFamily.edited_at`), so `create`, `add`, `remove` in a
row make one job, for the members they leave; each edit reconciles again once that window has
passed. A job no worker has started whose configuration is no longer the family's is cancelled
(`supersede`, at each edit and each reconciliation; a running one finishes and stores its
result for the members it was given). A configuration whose only job was cancelled so is not
"known": a family that returns to an earlier membership is queued for it again.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import ValidationError
from sqlalchemy.orm import Session

from compute.errors import SpecError
from compute.models import ModelSpec
from compute.run import METRIC_VERSION
from service.jobs.configs import stability_prompts
from service.jobs.parts import JobView, NewJob, mark_succeeded
from service.settings import Settings
from service.store import families, job_rows
from service.store.db import Store
from service.store.errors import FamilyError, FamilyNotFoundError
from service.store.stability import (
    STABILITY_FAMILY,
    StabilityResult,
    StabilitySummary,
    config_hash,
    ingest_stability,
    stability_config,
)
from service.store.tables import JobRow, utcnow

log = logging.getLogger("strata.jobs")

# Stability is compared in float32: the attention patterns of every member at full precision.
STABILITY_DTYPE = "float32"
# The error of a job cancelled because its family's membership changed before it started.
SUPERSEDED = "superseded: the refit family's members changed before the job started"


def is_stability(config: dict[str, object]) -> bool:
    return config.get("kind") == STABILITY_FAMILY


class JobSystem(Protocol):
    """What family jobs use of `service.jobs.service.JobService` (which holds them)."""

    store: Store
    settings: Settings

    def check_device(self, device: str | None) -> None: ...

    def check_queue(self, queue: str) -> None: ...

    def create(self, new: NewJob, reason: str) -> tuple[JobRow, bool]: ...

    def settle(self, job: JobRow, new: bool, reason: str) -> JobView: ...

    def delivered(self, job_id: int) -> None: ...

    def cancel_queued(self, job_id: int, why: str) -> bool: ...

    def release_background(self) -> list[int]: ...

    def reconcile_soon(self, delay_s: float = 0.0) -> None: ...


class FamilyJobs:
    """Stability jobs of refit families, on the job service (its store, broker and state
    machine; `JobService.families`)."""

    def __init__(self, jobs: JobSystem) -> None:
        self.jobs = jobs

    def plan(
        self, name: str, *, device: str | None = None, queue: str = "gpu", force: bool = False
    ) -> NewJob:
        """The job that computes family `name`'s stability as the family stands now.
        `FamilyNotFoundError`; `FamilyError` for a family with fewer than two members."""
        with self.jobs.store.read() as conn, Session(bind=conn) as session:
            stored = families.load(session, name)
            anchor_id = stored.anchor_id
            specs = {m.id: ModelSpec.model_validate(m.spec) for m in stored.members}
            options = stored.options
        if len(specs) < 2:
            raise FamilyError(f"refit family {name!r} has fewer than two members: add members")
        config = stability_config(
            name,
            specs[anchor_id],
            list(specs.values()),
            options.model_dump(mode="json"),
            stability_prompts(options),
        )
        return NewJob(
            model_id=anchor_id,
            config_hash=config_hash(config),
            metric_version=METRIC_VERSION,
            config=config,
            families=[STABILITY_FAMILY],
            device=device,
            dtype=STABILITY_DTYPE,
            queue=queue,
            force=force,
        )

    def submit(
        self,
        name: str,
        *,
        device: str | None = None,
        queue: str = "gpu",
        force: bool = False,
        reason: str = "api",
    ) -> tuple[JobView, bool]:
        """A person's request for a family's stability: the job and whether it is new (the
        same configuration asked again answers its job). Refused before anything is stored:
        an unknown family (404), one with fewer than two members, a device no worker has, a
        queue no worker consumes (422). `BrokerUnavailableError` (503): nothing kept."""
        self.jobs.check_device(device)
        self.jobs.check_queue(queue)
        job, new = self.jobs.create(
            self.plan(name, device=device, queue=queue, force=force), reason
        )
        return self.jobs.settle(job, new, reason), new

    def deliver(self, result: StabilityResult, job_id: int) -> StabilitySummary:
        """Store a stability job's results and mark it succeeded, in one transaction (refused,
        nothing stored, for a cancelled job or results of another configuration)."""

        def mark(session: Session, summary: StabilitySummary) -> None:
            mark_succeeded(session, job_id, (result.config_hash(), METRIC_VERSION), summary.run_id)

        summary = ingest_stability(self.jobs.store, result, keep_members=True, also=mark)
        self.jobs.delivered(job_id)
        return summary

    def latest(self, name: str) -> JobRow | None:
        """The family's newest stability job, detached."""
        with self.jobs.store.read() as conn, Session(bind=conn, expire_on_commit=False) as s:
            job = job_rows.latest_stability_job(s, name)
            if job is not None:
                s.expunge(job)
            return job

    @property
    def settle(self) -> timedelta:
        return timedelta(seconds=self.jobs.settings.jobs.family_settle_s)

    def edited(self, name: str) -> list[int]:
        """After family `name` was made or its members changed: its queued jobs for other
        members are cancelled now, and, with reconciliation on, it is reconciled at once and
        again once the edit has settled (when its job is queued). The cancelled job ids."""
        cancelled = self.supersede(name)
        if self.jobs.settings.jobs.reconcile:
            self.jobs.reconcile_soon()
            if self.settle:
                # a little past the window, so that the edit reads as settled then
                self.jobs.reconcile_soon(self.settle.total_seconds() + 0.1)
        return cancelled

    def supersede(self, name: str, current: str | None = None) -> list[int]:
        """Cancel family `name`'s stability jobs that no worker has started and whose
        configuration is not `current` (the hash of its configuration now; computed when not
        given, None if it has none). Running jobs finish. The cancelled job ids."""
        if current is None:
            try:
                current = self.plan(name).config_hash
            except (SpecError, ValidationError):  # no stability to compute: none is current
                current = None
        with self.jobs.store.read() as conn, Session(bind=conn) as session:
            stale = [
                j.id
                for j in job_rows.queued_stability_jobs(session, name)
                if j.config_hash != current
            ]
        cancelled = [i for i in stale if self.jobs.cancel_queued(i, SUPERSEDED)]
        if cancelled:
            log.info("refit family %s changed: cancelled its queued jobs %s", name, cancelled)
            self.jobs.release_background()
        return cancelled

    def reconcile(self, reason: str) -> list[int]:
        """Queue (held, behind people's jobs) the stability of every family whose current
        configuration was never queued or stored, once the family has settled (unchanged for
        `family_settle_s`); cancel its queued jobs for configurations it no longer has. Called
        by `JobService.reconcile`, under its lock. Returns the new job ids."""
        moved = families.follow_registrations(self.jobs.store)
        if moved:
            log.info("refit families %s follow their members' new registrations", moved)
            if self.settle:  # an edit too: queued once it has settled
                self.jobs.reconcile_soon(self.settle.total_seconds() + 0.1)
        with self.jobs.store.read() as conn, Session(bind=conn) as session:
            edits = {f.family.name: f.edited_at for f in families.all_families(session)}
        queued = []
        for name, edited_at in edits.items():
            try:
                new = self.plan(name)
            except (SpecError, ValidationError) as exc:  # one family's, not every family's
                log.warning("refit family %s has no stability to compute: %s", name, exc)
                continue
            self.supersede(name, new.config_hash)
            if utcnow() - edited_at < self.settle:
                continue  # edited moments ago: the reconciliation due once it settles queues it
            with self.jobs.store.read() as conn, Session(bind=conn) as session:
                latest = job_rows.latest_for(session, new.config_hash, new.metric_version)
                stored = job_rows.succeeded_run(session, new.config_hash, new.metric_version)
            superseded = latest is not None and latest.error == SUPERSEDED
            known = (latest is not None and not superseded) or stored is not None
            if known or self._edited_since(name, edited_at):
                # an edit landed while this ran: `new` may be of the members before it, and the
                # reconciliation that edit scheduled queues the family once it has settled
                continue
            job, created = self.jobs.create(new, reason)
            # An edit between the check and the job: cancelled here, or by that edit's own
            # `supersede` (it runs after its members are written, and cancels what is queued)
            if created and job.state == "queued" and job.id not in self.supersede(name):
                queued.append(job.id)
        return queued

    def _edited_since(self, name: str, edited_at: datetime) -> bool:
        """Whether family `name` was edited (or deleted) after `edited_at`."""
        with self.jobs.store.read() as conn, Session(bind=conn) as session:
            try:
                return families.load(session, name).edited_at != edited_at
            except FamilyNotFoundError:
                return True
