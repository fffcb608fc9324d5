"""The worker's process pool: Celery's prefork pool, with a dead child's queue locks given back.

With a transport Celery cannot poll in its event loop (the filesystem broker, the one-machine
default) the worker runs billiard's blocking pool: the children take jobs from one shared pipe
behind one lock and write results to another behind a second. An idle child waits for a job
while holding the first lock; killed by a signal then (an OOM kill, say), it never releases it,
and the child that replaces it would wait on that lock forever: the worker looks alive and
never claims a job again. With Redis or RabbitMQ Celery's asynchronous pool gives each child
its own pipes, and this does not arise.

`TaskPool` is Celery's prefork pool whose blocking pool, once every child is gone after one
died of a signal, releases the locks only a child can hold (the job pipe's read lock and the
result pipe's write lock) before the replacement is forked. With every child gone no live
process can be holding them, so a released lock is always a dead child's. A worker runs one
child (`--concurrency 1`), so this covers every death; a job that child was given is counted
lost by Celery as before, and its lease re-queues it.
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.pool import Pool
from celery.concurrency.prefork import TaskPool as PreforkTaskPool

log = logging.getLogger("strata.worker")


def _give_back(lock: Any, what: str) -> None:
    """Release `lock` if someone holds it (a POSIX semaphore: any process may post it)."""
    if lock is None:
        return
    if lock.acquire(False):  # free: leave it so
        lock.release()
        return
    lock.release()
    log.warning("the pool child that died held the %s: released", what)


class BlockingPool(Pool):
    def _join_exited_workers(self, shutdown: bool = False) -> list[Any]:
        exitcodes: list[Any] = super()._join_exited_workers(shutdown)
        killed = any(code is not None and code < 0 for code in exitcodes)
        if killed and not shutdown and not self._pool:
            _give_back(self._inqueue._rlock, "job queue's lock")
            _give_back(getattr(self._outqueue, "_wlock", None), "result queue's lock")
        return exitcodes


class TaskPool(PreforkTaskPool):
    """Celery's prefork pool (`strata worker` passes `--pool service.worker.pool:TaskPool`)."""

    BlockingPool = BlockingPool
