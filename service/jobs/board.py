"""The job system's fast-changing state, kept in the API process's memory.

Progress and leases change every few seconds per running job; storing them would turn every
heartbeat into a database write (and invalidate the API's caches). They are rebuilt from the
workers' next heartbeats after a restart: `Board.grace` gives every running job a fresh lease
when the API starts, so a job is never presumed lost because the API itself was down.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Live:
    """A running job as its worker last reported it."""

    dispatch: int
    worker: str
    lease_until: float
    done: int = 0
    total: int = 0
    tokens_per_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def eta_s(self) -> float | None:
        if self.done <= 0 or self.total <= 0 or self.elapsed_s <= 0:
            return None
        return max(self.elapsed_s * (self.total - self.done) / self.done, 0.0)


@dataclass
class WorkerSeen:
    """A worker as its last heartbeat described it."""

    name: str
    device: str
    dtype: str
    queues: list[str]
    host: str
    pid: int
    last_seen: float = field(default_factory=time.monotonic)
    last_seen_wall: float = field(default_factory=time.time)


class Board:
    """Progress, leases and workers; thread-safe."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._lock = threading.Lock()
        self._live: dict[int, Live] = {}
        self._workers: dict[str, WorkerSeen] = {}

    def start(self, job_id: int, dispatch: int, worker: str) -> None:
        with self._lock:
            self._live[job_id] = Live(dispatch, worker, time.monotonic() + self.lease_s)

    def beat(
        self,
        job_id: int,
        dispatch: int,
        worker: str,
        *,
        done: int,
        total: int,
        tokens_per_s: float,
        elapsed_s: float,
    ) -> None:
        with self._lock:
            live = self._live.get(job_id)
            if live is None or live.dispatch != dispatch:
                live = self._live[job_id] = Live(dispatch, worker, 0.0)
            live.lease_until = time.monotonic() + self.lease_s
            live.worker = worker
            if total > 0:
                live.done, live.total = done, total
                live.tokens_per_s, live.elapsed_s = tokens_per_s, elapsed_s

    def grace(self, job_ids: list[tuple[int, int, str]]) -> None:
        """A fresh lease for running jobs (id, dispatch, worker) this process knows nothing of."""
        with self._lock:
            for job_id, dispatch, worker in job_ids:
                if job_id not in self._live:
                    self._live[job_id] = Live(dispatch, worker, time.monotonic() + self.lease_s)

    def live(self, job_id: int) -> Live | None:
        with self._lock:
            return self._live.get(job_id)

    def running(self) -> list[tuple[int, Live]]:
        """(job id, a copy of its progress) of every job with a live lease or progress."""
        from dataclasses import replace

        with self._lock:
            return [(j, replace(live)) for j, live in sorted(self._live.items())]

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._live.pop(job_id, None)

    def expired(self) -> list[tuple[int, int]]:
        """(job id, dispatch) of running jobs whose lease ran out."""
        now = time.monotonic()
        with self._lock:
            return [(j, live.dispatch) for j, live in self._live.items() if live.lease_until < now]

    def worker_seen(self, seen: WorkerSeen) -> None:
        with self._lock:
            self._workers[seen.name] = seen

    def workers(self, within_s: float) -> list[WorkerSeen]:
        """Workers heard from in the last `within_s` seconds."""
        cutoff = time.monotonic() - within_s
        with self._lock:
            return sorted(
                (w for w in self._workers.values() if w.last_seen >= cutoff), key=lambda w: w.name
            )
