"""Starting a real `strata serve` for the tests and the benchmarks, in one place: spawn it with
an environment, wait until it answers, stop it. (Not a test module: pytest collects only
`test_*.py`.)

>>> served = start_service({"STRATA_DATABASE": "/tmp/x.duckdb"}, log=Path("/tmp/serve.log"))
... # doctest: +SKIP
>>> served.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.launcher import ROOT, Forked, start

Proc = subprocess.Popen[bytes] | Forked  # a process the harness started, by exec or by fork

if TYPE_CHECKING:  # annotations only: the helpers below import the service when called
    from service.settings import Settings

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, every: float = 0.2
             ) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`.
    A connection that fails counts as "not yet"."""
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = check()
        except (httpx.TransportError, OSError) as exc:  # not up yet: try again
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@dataclass
class Served:
    """A running `strata serve`: its URL, process and console log."""

    base: str
    port: int
    proc: Proc
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGINT, timeout: float = 20) -> int:
        """Stop it as Ctrl-C does (or with `sig`); killed if it takes over `timeout` s."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def spawn_service(env: Mapping[str, str], *, log: Path, args: Sequence[str] = (),
                  port: int | None = None, inherit: bool = True,
                  new_session: bool = False, forked: bool = False) -> Served:
    """Spawn `python -m service.cli serve --port PORT *args` with `os.environ` updated by
    `env` (or `env` alone, without `inherit`) and the hub kept offline; do not wait for it
    (`wait_healthy`). `forked`: by the session's zygote (tests/launcher.py, in a
    session of its own) rather than a new interpreter; the benchmarks measure the real start."""
    port = free_port() if port is None else port
    merged = {**(os.environ if inherit else {}), **OFFLINE, **env}
    proc = start(["serve", "--port", str(port), *args], merged, log=log, cwd=ROOT,
                 forked=forked, new_session=new_session)
    return Served(f"http://127.0.0.1:{port}", port, proc, log)


def wait_healthy(served: Served, timeout: float = 120) -> Served:
    """Return once GET /api/v1/health answers 200. Raises RuntimeError with the console log if
    the process exits or does not answer within `timeout` s."""
    proc = served.proc
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"strata serve exited ({proc.returncode}):\n{served.log_text()}")
        try:
            with urllib.request.urlopen(f"{served.base}/api/v1/health", timeout=5) as answer:
                if answer.status == 200:
                    return served
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            served.stop()
            raise RuntimeError(f"strata serve did not answer in {timeout} s:\n"
                               f"{served.log_text()}")
        time.sleep(0.2)


def start_service(env: Mapping[str, str], *, log: Path, args: Sequence[str] = (),
                  port: int | None = None, timeout: float = 120, inherit: bool = True,
                  new_session: bool = False, forked: bool = False) -> Served:
    """`spawn_service`, then `wait_healthy`: a `strata serve` that answers."""
    served = spawn_service(env, log=log, args=args, port=port, inherit=inherit,
                           new_session=new_session, forked=forked)
    return wait_healthy(served, timeout)


def run_strata(args: Sequence[str], env: Mapping[str, str]) -> Any:
    """A `strata` command run in this process (click's runner) with `env` added to its
    environment, and its result (`exit_code`, `output`). The settings are read afresh for it
    and again after it, so neither it nor the tests after it see another command's settings.
    A command of its own process would only add another torch import."""
    from click.testing import CliRunner

    from service.cli import main
    from service.settings import get_settings

    get_settings.cache_clear()
    try:
        return CliRunner().invoke(main, list(args), env=dict(env))
    finally:
        get_settings.cache_clear()


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """The `Settings` a process with exactly this environment reads (so a test that needs both
    writes its configuration once, as an environment)."""
    from unittest import mock

    from service.settings import Settings

    with mock.patch.dict(os.environ, dict(env), clear=True):
        return Settings()
