"""Starting workers and beat, and keeping the one-machine default's processes alive.

- `strata worker --gpus 0,1` starts one Celery worker process per listed GPU, each seeing only
  its own device (`CUDA_VISIBLE_DEVICES`); `--device cpu` starts one on the CPU. Each process
  runs one job at a time (prefork pool of one child, recycled after `max_tasks_per_child` jobs
  or above `max_memory_mb`, which frees GPU memory; `service/worker/pool.py` releases the queue
  locks a child killed by a signal held, so its replacement takes jobs on every broker).
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
from collections.abc import Callable
from dataclasses import dataclass, field

from service.jobs.broker import COMPUTE_QUEUE, OPS_QUEUE

log = logging.getLogger("strata.worker")


def worker_argv(queues: list[str], name: str, loglevel: str = "INFO") -> list[str]:
    """Celery's own command line for one worker process of ours."""
    return [
        "worker",
        "--queues",
        ",".join(queues),
        "--concurrency",
        "1",
        "--pool",
        "prefork",  # the app's `worker_pool`: service/worker/pool.py's TaskPool
        "--hostname",
        name,
        "--loglevel",
        loglevel,
        "--without-gossip",
        "--without-mingle",
    ]


def beat_argv(name: str, loglevel: str = "INFO") -> list[str]:
    return [
        "worker",
        "--beat",
        "--queues",
        OPS_QUEUE,
        "--pool",
        "threads",
        "--concurrency",
        "2",
        "--hostname",
        name,
        "--loglevel",
        loglevel,
        "--without-gossip",
        "--without-mingle",
    ]


WARM_SHUTDOWN_S = 90.0  # below compose's stop_grace_period (2 min) and Kubernetes' (600 s)
PARENT_PID_ENV = "STRATA_PARENT_PID"  # set by `strata serve` for the processes it starts


def run_celery(argv: list[str], *, warm_shutdown_s: float = WARM_SHUTDOWN_S) -> None:
    """Run Celery in this process with the settings as they are now.

    Process lifetime, whatever happens around it:
    - started by `strata serve` (STRATA_PARENT_PID): a watchdog thread kills this process's
      whole group (the pool's children, an embedded beat) as soon as that parent is gone, even
      if it was SIGKILLed — Celery itself would sit out a warm shutdown instead;
    - each pool child and an embedded beat watch their own parent the same way, so none keeps
      computing after the worker process died;
    - SIGTERM starts Celery's warm shutdown (the running job may finish); after
      `warm_shutdown_s` a job still running is abandoned (cold shutdown; its lease expires and
      the API sends it again), and 15 s after that the group is killed.
    """
    from celery import signals

    from service.settings import get_settings

    get_settings.cache_clear()
    from service.worker.app import make_app

    parent = os.environ.pop(PARENT_PID_ENV, None)  # for this process only, not its children
    if parent and parent.isdigit():
        watch_parent(int(parent), _kill_own_group)
    signals.worker_process_init.connect(_watch_pool_parent, weak=False)
    signals.beat_init.connect(_watch_pool_parent, weak=False)

    def shutting_down(sig: str = "", how: str = "", exitcode: int = 0, **_: object) -> None:
        if how == "Warm":
            _deadline(warm_shutdown_s)

    signals.worker_shutting_down.connect(shutting_down, weak=False)
    app = make_app(get_settings(), create_broker_dir=True)
    app.worker_main(argv)


def watch_parent(expected: int, action: Callable[[], None], every: float = 0.25) -> None:
    """Call `action` (once) when this process's parent is no longer `expected` (it died and this
    process was handed to init or a subreaper)."""

    def loop() -> None:
        while os.getppid() == expected:
            time.sleep(every)
        action()

    threading.Thread(target=loop, name="strata-parent-watch", daemon=True).start()


def _watch_pool_parent(**_: object) -> None:
    """In a pool child (or an embedded beat) just forked: die with the worker process."""
    watch_parent(os.getppid(), lambda: os.kill(os.getpid(), signal.SIGKILL))


def _kill_own_group(why: str = "the process that started this one is gone") -> None:
    log.warning("%s: stopping now", why)
    if os.getpgrp() == os.getpid():  # leads its own group (strata serve starts it so)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def own_children() -> list[int]:
    """This process's direct children (Linux /proc; empty elsewhere)."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == me:
            found.append(int(entry))
    return found


def _deadline(warm_shutdown_s: float) -> None:
    """Bound a warm shutdown: after `warm_shutdown_s` the pool's children are killed (the job
    they run is abandoned: not acknowledged, so the broker or the API's lease sends it again) and
    Celery's warm shutdown then ends as usual; if it has not 15 s later, the group is killed."""

    def expire() -> None:
        time.sleep(warm_shutdown_s)
        log.warning(
            "warm shutdown still waiting after %.0f s: abandoning the running job "
            "(its lease expires and the API sends it again)",
            warm_shutdown_s,
        )
        for child in own_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        time.sleep(15)
        _kill_own_group("the warm shutdown did not end 15 s after its pool was stopped")

    threading.Thread(target=expire, name="strata-shutdown-deadline", daemon=True).start()


def gpu_children(
    gpus: list[int],
    queues: list[str],
    name: str | None,
    extra_env: dict[str, str],
    warm_shutdown_s: float = WARM_SHUTDOWN_S,
) -> int:
    """One `strata worker --device cuda` process per GPU; waits for them, stops them on
    SIGTERM/SIGINT. Returns the worst exit code."""
    host = socket.gethostname()
    procs = []
    for gpu in gpus:
        env = {
            **os.environ,
            **extra_env,
            "CUDA_VISIBLE_DEVICES": str(gpu),
            "STRATA_WORKER__DEVICE": "cuda",
            "STRATA_WORKER_NAME": f"{name or 'gpu'}{gpu}@{host}",
            PARENT_PID_ENV: str(os.getpid()),
        }  # each dies with this launcher
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "service.cli",
                    "worker",
                    "--device",
                    "cuda",
                    "--queues",
                    ",".join(queues),
                    "--warm-shutdown-s",
                    str(warm_shutdown_s),
                ],
                env=env,
            )
        )

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
            Child(
                "worker",
                [
                    *base,
                    "worker",
                    "--device",
                    self.device,
                    "--queues",
                    COMPUTE_QUEUE,
                    "--name",
                    "local",
                ],
            ),
            Child("beat", [*base, "beat"]),
        ]
        for child in self.children:
            self._spawn(child)
        self._thread = threading.Thread(
            target=self._watch, name="strata-local-workers", daemon=True
        )
        self._thread.start()

    def _spawn(self, child: Child) -> None:
        env = {
            **os.environ,
            "STRATA_API_URL": self.api_url,
            "STRATA_API_KEY": self.api_key,
            PARENT_PID_ENV: str(os.getpid()),
        }
        os.makedirs(self.log_dir, exist_ok=True)
        out = open(os.path.join(self.log_dir, f"{child.name}.log"), "ab")  # noqa: SIM115
        child.proc = subprocess.Popen(
            child.argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
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
                pause = min(2**child.restarts, 30) if child.restarts else 0
                log.warning(
                    "local %s exited (code %s); restarting in %s s", child.name, code, pause
                )
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
