"""Process lifetime with real processes: however `strata serve` ends, the worker and beat it
started (and their pool children) are gone 5 s later; a worker whose pool child dies replaces it
and leaves no zombie; `strata worker` on its own stops on SIGTERM within its warm-shutdown
budget, and the job it abandons is finished by another worker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.jobs_harness import LONG, SMALL, Deployment, make_broker
from tests.serving import wait_for

# Each test builds its own deployment: parallel runs deal them out one by one.
pytestmark = pytest.mark.spread

MODEL = "zoo:tiny-2l-s0"


def children(pid: int) -> list[int]:
    """Live (not zombie) direct children of `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z", "X")


def descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


WAYS = {
    "SIGINT": [(signal.SIGINT, 0.0)],
    "SIGTERM": [(signal.SIGTERM, 0.0)],
    "SIGKILL": [(signal.SIGKILL, 0.0)],
    "SIGTERM then SIGKILL 1 s later": [(signal.SIGTERM, 0.0), (signal.SIGKILL, 1.0)],
}


@pytest.mark.parametrize("way", list(WAYS))
def test_no_process_outlives_strata_serve(way: str) -> None:
    d = Deployment(make_broker("filesystem"))
    try:
        d.add_model(MODEL)
        d.start_api(local_worker=True)
        assert d.api is not None
        serve = d.api.pid
        job = d.submit("tiny-2l-s0", **LONG).json()
        d.wait_progress(job["id"], at_least=0.02, timeout=180)  # a pool child is computing

        def tree() -> set[int] | None:
            found = descendants(serve)
            cmds = " ".join(cmdline(p) for p in found)
            return found if "worker" in cmds and "beat" in cmds and len(found) >= 3 else None

        started = wait_for("the local worker, its pool child and beat", tree, timeout=30)
        for sig, delay in WAYS[way]:
            time.sleep(delay)
            if d.api.poll() is None:
                os.kill(serve, sig)
        d.api.wait(timeout=60)
        ended = time.monotonic()
        while time.monotonic() - ended < 5 and any(alive(p) for p in started):
            time.sleep(0.1)
        left = {p: cmdline(p) for p in started if alive(p)}
        assert not left, f"alive 5 s after strata serve ended ({way}): {left}"
    finally:
        d.close()


def pool_child(worker: int) -> int:
    return int(wait_for("the worker's pool child", lambda: children(worker), timeout=60)[0])


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_a_dead_pool_child_is_replaced_and_reaped(broker: str) -> None:
    # On the filesystem broker (the one-machine default) Celery runs billiard's blocking pool,
    # whose idle child waits for a job holding the pool's shared job-queue lock: SIGKILLed, it
    # used to leave the replacement blocked on that lock for good (jobs stayed queued).
    # `service/worker/pool.py` gives the lock back; on Redis each child has its own pipe.
    d = Deployment(make_broker(broker))
    try:
        d.add_model(MODEL)
        d.start_api(workers=1)
        worker = d.workers[0]
        first = pool_child(worker.pid)
        wait_for("the pool child to be warm", lambda: f"pool process {first} is warm"
                 in d.log("worker-0"), timeout=90)
        os.kill(first, signal.SIGKILL)  # an idle child dies
        new = wait_for("a new pool child", lambda: [c for c in children(worker.pid)
                                                     if c != first], timeout=30)
        assert new
        assert state(first) is None, "the dead pool child was reaped (no zombie)"
        assert worker.poll() is None
        # Warm, however long its warm-up took on a busy machine: the one new child, not
        # killed and replaced for being slow to report (Celery's default allowed it 4 s).
        wait_for("the new pool child to be warm", lambda: f"pool process {new[0]} is warm"
                 in d.log("worker-0"), timeout=90)
        assert "Timed out waiting for UP message" not in d.log("worker-0")
        assert children(worker.pid) == new
        if broker == "filesystem":  # the blocking pool: the dead child's lock was given back
            assert "held the job queue's lock: released" in d.log("worker-0")
        done = d.wait_state(d.submit("tiny-2l-s0", **SMALL).json()["id"], "succeeded", "failed")
        assert done["state"] == "succeeded", done["error"]
    finally:
        d.close()


def test_a_worker_alone_stops_on_sigterm_within_its_budget() -> None:
    d = Deployment(make_broker("filesystem"))
    try:
        d.add_model(MODEL)
        d.start_api()
        # idle (its pool child may still be warming up): a clean exit, within the budget
        idle = d._spawn("worker-0", ["worker", "--device", "cpu", "--warm-shutdown-s", "5"])
        d.workers.append(idle)
        wait_for("the worker to be ready", lambda: " ready." in d.log("worker-0"), timeout=90)
        start = time.monotonic()
        os.kill(idle.pid, signal.SIGTERM)
        assert idle.wait(timeout=5 + 20) == 0, d.log("worker-0")

        # busy: the job may finish for 1.5 s, then it is abandoned and the worker exits (a job
        # twice LONG's size, so that it cannot end within the budget on a fast machine)
        budget = 1.5
        proc = d._spawn("worker-1", ["worker", "--device", "cpu", "--warm-shutdown-s",
                                     str(budget)])
        d.workers.append(proc)
        job = d.submit("tiny-2l-s0", **{**LONG, "n_sequences": 96}).json()  # 2 x LONG
        d.wait_progress(job["id"], at_least=0.02, timeout=180)
        pool = children(proc.pid)
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=budget + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker ignored its warm-shutdown budget:\n{d.log('worker-1')}")
        assert proc.returncode == 0, d.log("worker-1")
        took = time.monotonic() - start
        assert took >= budget - 0.5, "the running job was given its budget"
        assert not [p for p in pool if alive(p)], "its pool child went with it"
        log = d.log("worker-1")
        assert "abandoning the running job" in log
        if "ForkPoolWorker-2" in log:  # billiard replaced the killed child while shutting down
            assert "started during shutdown: no warm-up" in log, log
        assert d.job(job["id"])["state"] in ("running", "queued")
        # nothing lost: the lease expires, another worker finishes the job, once
        d.start_worker()
        done = d.wait_state(job["id"], "succeeded", "failed", timeout=300)
        assert done["state"] == "succeeded", done["error"]
        assert done["attempts"] == 2
        runs = [r for r in d.runs() if r["id"] == done["run_id"]]
        assert len(runs) == 1
        assert len(d.runs()) == 1
    finally:
        d.close()
