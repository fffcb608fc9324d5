"""Starting `strata` command processes for the tests from a warm interpreter (not collected).

A `strata worker` begins by importing torch, transformers and TransformerLens (about 7 CPU-s on
this project's 2-core CI machine); a `strata serve`, the API's stack (about 3 CPU-s). The
deployments of the job, fault and lifetime tests start some fifty such processes, and those
imports were a third of the suite's CPU. So the harnesses start them through multiprocessing's
fork server instead: one server per test process, started on first use, imports the libraries
once (imports only: no torch operation runs there, so no thread pool is forked) and forks one
child per command. The child is the real command: `service.cli.main` with the arguments,
environment, working folder and log it would have had as `python -m service.cli ...`, in a
session of its own, exiting as that interpreter would (non-daemon threads joined, atexit
handlers run, the exit code or the killing signal reported). What is skipped is only the new
interpreter's start-up. The one path that must show that start-up works, the README's first
command, is still started by exec (test_first_run.py), and so are the processes that
`strata serve` itself starts.

`STRATA_TEST_LAUNCH=exec` makes every harness start its processes by exec, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

# What the fork server imports before it forks: the heavy libraries and the project's modules
# that read no settings when imported (`service.worker.app` builds its Celery app from the
# settings at import, so it is left to each child).
PRELOAD = ["tests.launcher_preload"]

_context: ForkServerContext | None = None
_lock = threading.Lock()
LAUNCHED: list[Forked] = []  # every process started here, for the session's last clean-up


def forking() -> bool:
    """Whether the harnesses fork their processes (the default) or exec them."""
    return os.environ.get("STRATA_TEST_LAUNCH", "fork") != "exec"


def _fork_server() -> ForkServerContext:
    global _context
    with _lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _context = context
        return _context


class Forked:
    """A command process started by the fork server, with the part of `subprocess.Popen` the
    tests use: `pid`, `returncode`, `poll`, `wait`, `send_signal`, `terminate`, `kill`."""

    def __init__(self, process: Any, argv: Sequence[str]) -> None:
        self._process = process
        self.args = list(argv)
        self.pid: int = process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode  # None while it runs
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter makes of an uncaught SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_command(argv: list[str], env: dict[str, str], cwd: str, log: str, err: str) -> None:
    """In the forked child: become `python -m service.cli *argv` and never return."""
    os.setsid()
    for fd, path in ((1, log), (2, err)):
        sink = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(sink, fd)
        os.close(sink)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [str(Path(cwd) / "service" / "cli" / "__main__.py"), *argv]
    code = 1
    try:
        from service.cli import main
        from service.settings import get_settings

        get_settings.cache_clear()  # read from this environment, as a new process would
        main.main(args=argv, prog_name="strata")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
    try:  # an interpreter's exit: non-daemon threads, then atexit, then the streams
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def launch(argv: Sequence[str], env: Mapping[str, str], *, log: Path, cwd: Path,
           stderr: Path | None = None) -> Forked:
    """Start `strata *argv` (forked from the warm server) with exactly `env`, its output
    appended to `log` (its standard error to `stderr`, if given), in a session of its own; do
    not wait for it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    process = _fork_server().Process(
        target=_run_command, name=f"strata {argv[0]}",
        args=(list(argv), dict(env), str(cwd), str(log), str(stderr or log)))
    process.start()
    forked = Forked(process, argv)
    LAUNCHED.append(forked)
    return forked


def run(argv: Sequence[str], env: Mapping[str, str], *, cwd: Path,
        timeout: float) -> subprocess.CompletedProcess[str]:
    """`strata *argv` run to its end, as `subprocess.run(..., capture_output=True,
    text=True)` runs `python -m service.cli *argv` (by exec with STRATA_TEST_LAUNCH=exec)."""
    if not forking():
        return subprocess.run([sys.executable, "-m", "service.cli", *argv], env=dict(env),
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="strata-run-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        forked = launch(argv, env, log=out, stderr=err, cwd=cwd)
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(forked.pid, signal.SIGKILL)
            forked.wait()
            raise
        return subprocess.CompletedProcess(forked.args, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def kill_leftovers() -> None:
    """SIGKILL the session (process group) of every launched process still running: a test
    that failed before its clean-up must not leave a worker computing after the suite."""
    for forked in LAUNCHED:
        if forked.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(forked.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                forked.wait(timeout=10)
    LAUNCHED.clear()
