"""Starting `strata` command processes for the tests from a warm interpreter (not collected).

A `strata worker` begins by importing torch, transformers and TransformerLens (about 7 CPU-s on
this project's 2-core CI machine); a `strata serve`, the API's stack (about 3 CPU-s). The
deployments of the job, fault and lifetime tests start some fifty such processes, and those
imports were a third of the suite's CPU. So the harnesses start them from a fork server (a
"zygote"): one per test session, started by the session's first process (`start_zygote`, from
tests/conftest.py) while the tests are collected, imports the libraries once (imports only: no
torch operation runs there, so no thread pool is forked) and forks one child per command. The
child is the real command: `service.cli.main` with the arguments, environment, working folder
and output files it would have had as `python -m service.cli ...`, in a session of its own,
exiting as that interpreter would (non-daemon threads joined, atexit handlers run; its exit code,
or minus the signal that killed it, is reported to whoever asked for it). What is skipped is only
the new interpreter's start-up. The one path that must show that start-up works, the README's
first command, is still started by exec (test_first_run.py), and so are the processes that
`strata serve` itself starts.

Protocol (a Unix socket, one connection per command): the client sends the command as one JSON
line; the zygote forks and answers the child's pid as a line, then, when the child has ended, its
exit code as a line, and closes the connection.

`PYTEST_STRATA_LAUNCH=exec` makes every harness start its processes by exec instead.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOCKET_ENV = "PYTEST_STRATA_ZYGOTE"  # the zygote's socket, for every process of the session
LAUNCHED: list[Forked] = []  # every process this test process started, for its last clean-up


def forking() -> bool:
    """Whether the harnesses fork their processes (the default) or exec them."""
    return os.environ.get("PYTEST_STRATA_LAUNCH", "fork") != "exec"


# --------------------------------------------------------------------------- the client side
def _zygote_log() -> str:
    socket_path = os.environ.get(SOCKET_ENV)
    log = Path(socket_path).with_name("zygote.log") if socket_path else None
    return log.read_text(errors="replace")[-3000:] if log and log.is_file() else "(none)"


class Forked:
    """A command process forked by the zygote, with the part of `subprocess.Popen` the tests
    use: `pid`, `returncode`, `poll`, `wait`, `send_signal`, `terminate`, `kill`."""

    def __init__(self, conn: socket.socket, argv: Sequence[str]) -> None:
        self._conn = conn
        self._answers = conn.makefile("rb")
        self.args = list(argv)
        self.pid = int(self._line("its pid"))
        self.returncode: int | None = None

    def _line(self, what: str) -> str:
        line = self._answers.readline()
        if not line:
            raise RuntimeError(f"the tests' zygote (tests/launcher.py) closed before sending "
                               f"{what} of `strata {' '.join(self.args)}`; its log:\n"
                               f"{_zygote_log()}")
        return line.decode().strip()

    def _ended(self, timeout: float | None) -> bool:
        if self.returncode is None:
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                return False
            self.returncode = int(self._line("the exit code"))
            self._answers.close()
            self._conn.close()
        return True

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
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


def launch(argv: Sequence[str], env: Mapping[str, str], *, log: Path | None, cwd: Path = ROOT,
           stderr: Path | None = None, timeout: float = 120,
           streams: tuple[int, int, int] | None = None) -> Forked:
    """Start `strata *argv` (forked by the zygote) with exactly `env`, its output appended to
    `log` (its standard error to `stderr`, if given), in a session of its own; do not wait for
    it to end. With `streams` (three open descriptors) the child's standard input, output and
    error are those, passed over the socket, instead of the files."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        raise RuntimeError(f"{SOCKET_ENV} is not set: the session's zygote was not started "
                           "(tests/conftest.py starts it; PYTEST_STRATA_LAUNCH=exec does without)")
    if streams is None:
        assert log is not None
        log.parent.mkdir(parents=True, exist_ok=True)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout
    while True:  # the zygote binds its socket a moment after it starts
        try:
            conn.connect(path)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        except ConnectionRefusedError:  # bound once, listening no more: it is gone
            raise RuntimeError(f"the tests' zygote (tests/launcher.py) is gone; its log:\n"
                               f"{_zygote_log()}") from None
    request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "out": str(log),
               "err": str(stderr or log), "streams": streams is not None}
    line = json.dumps(request).encode() + b"\n"
    if streams is not None:  # the descriptors travel with the request's first bytes
        sent = socket.send_fds(conn, [line], list(streams))
        line = line[sent:]
    conn.sendall(line)
    forked = Forked(conn, argv)
    LAUNCHED.append(forked)
    return forked


def start(argv: Sequence[str], env: Mapping[str, str], *, log: Path, cwd: Path = ROOT,
          forked: bool = True, new_session: bool = True) -> subprocess.Popen[bytes] | Forked:
    """Start `strata *argv` with exactly `env`, its output appended to `log`: forked by the
    zygote (always in a session of its own), or, with `forked=False` or
    PYTEST_STRATA_LAUNCH=exec, as `python -m service.cli *argv` (in a session of its own with
    `new_session`)."""
    if forked and forking():
        return launch(argv, env, log=log, cwd=cwd)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "service.cli", *argv], cwd=cwd,
                                env=dict(env), stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=new_session)


def run(argv: Sequence[str], env: Mapping[str, str], *, cwd: Path = ROOT,
        timeout: float) -> subprocess.CompletedProcess[str]:
    """`strata *argv` run to its end, as `subprocess.run(..., capture_output=True,
    text=True)` runs `python -m service.cli *argv` (by exec with PYTEST_STRATA_LAUNCH=exec)."""
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


def write_command(path: Path) -> Path:
    """Write an executable `strata` at `path` that runs its command in a process forked by the
    session's zygote, with this command's arguments, environment, working folder and standard
    streams, and exits as that process did (128 + the signal that killed it, as a shell says).
    It is a few standard-library lines, interpreted without site-packages: what it saves is the
    new interpreter's imports of torch and TransformerLens, not what the command does."""
    path.write_text(f"#!{sys.executable} -S\n"
                    f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    "from tests.launcher import command_main\ncommand_main()\n")
    path.chmod(0o755)
    return path


def command_main() -> None:
    """The body of `write_command`'s `strata`: SIGINT and SIGTERM are passed on to the
    command's session."""
    forked = launch(sys.argv[1:], dict(os.environ), log=None, cwd=Path.cwd(),
                    streams=(0, 1, 2))

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(forked.pid, sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    code = forked.wait()
    sys.exit(128 - code if code < 0 else code)


def kill_leftovers() -> None:
    """SIGKILL the session (process group) of every process this test process launched that
    still runs: a test that failed before its clean-up must not leave a worker computing."""
    for forked in LAUNCHED:
        try:
            running = forked.poll() is None
        except RuntimeError:  # the zygote is gone: whether it ended is unknown, so kill it
            running = True
        if running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(forked.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, RuntimeError):
                forked.wait(timeout=10)
    LAUNCHED.clear()


def start_zygote() -> subprocess.Popen[bytes]:
    """Start the session's zygote (`python -m tests.launcher SOCKET`, its socket and log in a
    new temporary folder) and publish its socket in this process's environment (the test
    processes that pytest-xdist starts inherit it). It starts without OMP_NUM_THREADS, so torch
    keeps its default thread count, and each child sets its own from its environment. It stops
    when this process does (`stop_zygote`, or by itself once this process is gone)."""
    path = Path(tempfile.mkdtemp(prefix="strata-zygote-")) / "socket"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with path.with_name("zygote.log").open("ab") as sink:
        # a session of its own: Ctrl-C on pytest reaches pytest, which stops it at the end
        proc = subprocess.Popen([sys.executable, "-m", "tests.launcher", str(path)], cwd=ROOT,
                                env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    os.environ[SOCKET_ENV] = str(path)
    return proc


def stop_zygote(proc: subprocess.Popen[bytes]) -> None:
    """Stop the zygote `start_zygote` started (it kills what it forked that still runs), and
    remove its folder."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    folder = Path(os.environ.pop(SOCKET_ENV, "")).parent
    if folder.name.startswith("strata-zygote-"):
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the zygote
def _exit_code(exc: SystemExit) -> int:
    """What the interpreter makes of an uncaught SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _become(request: dict[str, Any], streams: list[int]) -> None:
    """In the forked child: become `python -m service.cli *argv` and never return."""
    os.setsid()
    if request.get("streams"):
        for fd, passed in enumerate(streams):
            os.dup2(passed, fd)
            os.close(passed)
    else:
        for fd, path in ((1, request["out"]), (2, request["err"])):
            sink = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(sink, fd)
            os.close(sink)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = list(request["argv"])
    sys.argv = [str(ROOT / "service" / "cli" / "__main__.py"), *argv]
    code = 1
    try:
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit():  # torch read it when the zygote (started without it) imported it
            import torch

            torch.set_num_threads(int(threads))
        from service.cli import main

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


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request, and the descriptors that came with it (its standard streams, if any)."""
    data, streams = b"", []
    try:
        while not data.endswith(b"\n"):
            chunk, fds, _, _ = socket.recv_fds(conn, 65536, 3)
            streams += fds
            if not chunk:
                raise ConnectionError("the client went away before its request ended")
            data += chunk
        request = dict(json.loads(data))
        if request.get("streams") and len(streams) != 3:
            raise ValueError(f"three standard streams expected, {len(streams)} came")
    except BaseException:
        for fd in streams:
            os.close(fd)
        raise
    return request, streams


def serve(path: str) -> None:
    """The zygote's loop: fork a command per connection, report each child's end. It ends when
    the process that started it is gone or on SIGTERM, and kills (with their sessions) the
    children still running then: none outlives the test session."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # clients wait in the backlog while the libraries are imported
    import tests.launcher_preload  # noqa: F401

    gc.freeze()  # the children's collections skip what every one of them inherits
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _loop(listener, selector, wake_r, wake_w, waiting, parent)
    finally:
        for pid in waiting:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _loop(listener: socket.socket, selector: selectors.BaseSelector, wake_r: int, wake_w: int,
          waiting: dict[int, socket.socket], parent: int) -> None:
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                streams: list[int] = []
                try:
                    request, streams = _read_request(conn)
                except (OSError, ValueError) as exc:
                    print(f"zygote: bad request: {exc}", file=sys.stderr, flush=True)
                    conn.close()
                    continue
                for stream in (sys.stdout, sys.stderr):  # nothing buffered is copied into it
                    stream.flush()
                try:
                    pid = os.fork()
                except OSError as exc:  # out of memory or processes: that command fails
                    print(f"zygote: fork failed: {exc}", file=sys.stderr, flush=True)
                    conn.close()  # the client is told the zygote closed, with this log
                    continue
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other in waiting.values():
                        other.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    try:
                        conn.close()
                        _become(request, streams)
                    finally:
                        os._exit(1)
                for passed in streams:  # the child has its copies
                    os.close(passed)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{pid}\n".encode())
                waiting[pid] = conn
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
        while True:  # reap every ended child, and tell its client how it ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
