"""Starting workers and beat, and keeping the one-machine default's processes alive.

- `strata worker --gpus 0,1` starts one Celery worker process per listed GPU, each seeing only
  its own device (`CUDA_VISIBLE_DEVICES`); `--device cpu` starts one on the CPU. Each process
  runs one job at a time (prefork pool of one child, recycled after `max_tasks_per_child` jobs
  or above `max_memory_mb`, which frees GPU memory).
- `strata beat` is the one scheduler of a deployment; it also consumes the light `ops` queue
  (reconciliation), so bookkeeping never waits behind a computation.
- `LocalProcesses` is what `strata serve` runs when no broker is configured: one worker and
  beat on the filesystem broker, restarted if they die, stopped with the service.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from service.jobs.broker import COMPUTE_QUEUE, OPS_QUEUE

log = logging.getLogger("strata.worker")


def worker_argv(queues: list[str], name: str, loglevel: str = "INFO") -> list[str]:
    """Celery's own command line for one worker process of ours."""
    return ["worker", "--queues", ",".join(queues), "--concurrency", "1", "--pool", "prefork",
            "--hostname", name, "--loglevel", loglevel, "--without-gossip", "--without-mingle"]


def beat_argv(name: str, loglevel: str = "INFO") -> list[str]:
    return ["worker", "--beat", "--queues", OPS_QUEUE, "--pool", "threads", "--concurrency",
            "2", "--hostname", name, "--loglevel", loglevel, "--without-gossip",
            "--without-mingle"]


def run_celery(argv: list[str]) -> None:
    """Run Celery in this process with the settings as they are now."""
    from service.settings import get_settings

    get_settings.cache_clear()
    from service.worker.app import make_app

    app = make_app(get_settings(), create_broker_dir=True)
    app.worker_main(argv)


def gpu_children(gpus: list[int], queues: list[str], name: str | None,
                 extra_env: dict[str, str]) -> int:
    """One `strata worker --device cuda` process per GPU; waits for them, stops them on
    SIGTERM/SIGINT. Returns the worst exit code."""
    host = socket.gethostname()
    procs = []
    for gpu in gpus:
        env = {**os.environ, **extra_env, "CUDA_VISIBLE_DEVICES": str(gpu),
               "STRATA_WORKER__DEVICE": "cuda",
               "STRATA_WORKER_NAME": f"{name or 'gpu'}{gpu}@{host}"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "service.cli", "worker", "--device", "cuda", "--queues",
             ",".join(queues)], env=env))

    def stop(*_: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return max(proc.wait() for proc in procs)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started: float = 0.0


@dataclass
class LocalProcesses:
    """The local worker and beat of the one-machine default, supervised: a process that dies is
    started again (after a pause that grows while it keeps dying), all stop with the service."""

    api_url: str
    api_key: str
    device: str
    log_dir: str
    children: list[Child] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        base = [sys.executable, "-m", "service.cli"]
        self.children = [
            Child("worker", [*base, "worker", "--device", self.device, "--queues",
                             COMPUTE_QUEUE, "--name", "local"]),
            Child("beat", [*base, "beat"]),
        ]
        for child in self.children:
            self._spawn(child)
        self._thread = threading.Thread(target=self._watch, name="strata-local-workers",
                                        daemon=True)
        self._thread.start()

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, "STRATA_API_URL": self.api_url, "STRATA_API_KEY": self.api_key}
        os.makedirs(self.log_dir, exist_ok=True)
        out = open(os.path.join(self.log_dir, f"{child.name}.log"), "ab")  # noqa: SIM115
        child.proc = subprocess.Popen(child.argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        child.started = time.monotonic()
        log.info("started local %s (pid %s)", child.name, child.proc.pid)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            for child in self.children:
                if child.proc is None or child.proc.poll() is None:
                    continue
                code = child.proc.returncode
                lived = time.monotonic() - child.started
                child.restarts = 0 if lived > 60 else child.restarts + 1
                pause = min(2 ** child.restarts, 30) if child.restarts else 0
                log.warning("local %s exited (code %s); restarting in %s s", child.name, code,
                            pause)
                if self._stop.wait(pause):
                    return
                self._spawn(child)

    def pids(self) -> dict[str, int]:
        return {c.name: c.proc.pid for c in self.children if c.proc is not None}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                _signal_group(child.proc, signal.SIGTERM)
        end = time.monotonic() + 15
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait()


def _die_with_parent() -> None:
    """In the child, before exec: Linux sends it SIGTERM when the service dies, even by
    SIGKILL, so no local worker outlives the service that started it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the service's shutdown hook still stops it
        pass


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
