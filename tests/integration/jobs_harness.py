"""The job system under test: real `strata serve`, `strata worker` and `strata beat` processes
on a real DuckDB file and a real broker — Celery's filesystem transport, a Redis server of the
test's own (started on a free port, so it can be stopped and started again), or the machine's
RabbitMQ (its queues purged first).

`Deployment` starts and stops each process on its own, so a test can SIGKILL a worker, stop the
API while a worker computes, or take the broker away, and watch what the system does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.launcher import start
from tests.serving import Proc, Served, free_port, spawn_service, wait_for, wait_healthy

KEY = "jobs-test-key"
V1 = "/api/v1"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
# A small job: two families on a 2-layer zoo model, a few short sequences (~1 s of compute).
SMALL = {"metrics": ["intervention", "logit_lens"], "n_sequences": 2, "seq_len": 16}
# A job that runs for several seconds with steady progress (kill / cancel / API-down tests).
LONG = {"metrics": ["intervention", "logit_lens", "heads", "attention"], "n_sequences": 48,
        "seq_len": 96}


class Broker:
    """The broker of a deployment: its URL, and a way to take it down and bring it back."""

    url = ""
    name = "filesystem"

    def prepare(self, data_dir: Path) -> None: ...

    def down(self) -> None:
        raise NotImplementedError

    def up(self) -> None:
        raise NotImplementedError

    def close(self) -> None: ...


@dataclass
class FilesystemBroker(Broker):
    """Celery's filesystem transport. "Down" is its queue folder replaced by a file (the
    transport's writes then fail as they would on a lost mount)."""

    data_dir: Path | None = None
    name: str = "filesystem"

    def prepare(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    @property
    def queue(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "broker" / "queue"

    def down(self) -> None:
        aside = self.queue.with_name("queue.away")
        self.queue.rename(aside)
        self.queue.write_text("the broker is gone")

    def up(self) -> None:
        self.queue.unlink()
        self.queue.with_name("queue.away").rename(self.queue)


@dataclass
class RedisBroker(Broker):
    """A redis-server of this test's own, on a free port (no persistence)."""

    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    name: str = "redis"

    @property
    def url(self) -> str:  # type: ignore[override]
        return f"redis://127.0.0.1:{self.port}/0"

    def prepare(self, data_dir: Path) -> None:
        self.up()

    def up(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket

        def accepting() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for("redis-server", accepting, timeout=20)

    def down(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.down()


@dataclass
class RabbitBroker(Broker):
    """The machine's RabbitMQ; Strata's queues are purged before the test."""

    name: str = "rabbitmq"
    url: str = AMQP_URL

    def prepare(self, data_dir: Path) -> None:
        from kombu import Connection

        with Connection(self.url, connect_timeout=5) as conn:
            channel = conn.channel()
            for queue in ("gpu", "ops"):
                try:
                    channel.queue_purge(queue)
                except Exception:  # not declared yet: nothing to purge
                    channel = conn.channel()

    def down(self) -> None:
        """The RabbitMQ application stopped (its node stays up): every connection is closed
        and the port refuses new ones, as when the broker host goes away."""
        subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True,
                       timeout=120)

    def up(self) -> None:
        subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True,
                       timeout=120)
        subprocess.run(["rabbitmqctl", "await_startup"], check=True, capture_output=True,
                       timeout=120)

    def close(self) -> None:
        """Never leave the machine's RabbitMQ stopped (a test that failed while it was down)."""
        subprocess.run(["rabbitmqctl", "start_app"], capture_output=True, timeout=120)


def make_broker(kind: str) -> Broker:
    return {"filesystem": FilesystemBroker, "redis": RedisBroker, "rabbitmq": RabbitBroker}[kind]()


@dataclass
class Deployment:
    """One Strata deployment in a temporary folder: API, workers and beat as separate
    processes, started and stopped by the test."""

    broker: Broker
    env_extra: dict[str, str] = field(default_factory=dict)
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="strata-jobs-")))
    port: int = field(default_factory=free_port)
    api: Proc | None = None
    workers: list[Proc] = field(default_factory=list)
    beat: Proc | None = None
    served: Served | None = None
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.base, timeout=60,
                                   headers={"X-API-Key": KEY})
        (self.tmp / "logs").mkdir()
        self.broker.prepare(self.tmp / "state")

    @property
    def db(self) -> Path:
        return Path(self.env_extra.get("STRATA_DATABASE") or self.tmp / "strata.duckdb")

    def env(self) -> dict[str, str]:
        """The deployment's environment; a key set to "" in `env_extra` is removed."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": "1", "STRATA_DATABASE": str(self.db),
                "STRATA_DATA_DIR": str(self.tmp / "state"), "STRATA_API_KEYS": KEY,
                "STRATA_API_KEY": KEY, "STRATA_API_URL": self.base,
                "STRATA_BROKER_URL": self.broker.url,
                "STRATA_WORKER__HEARTBEAT_S": "0.5", "STRATA_JOBS__LEASE_S": "4",
                "STRATA_JOBS__MAINTENANCE_INTERVAL_S": "0.5",
                "STRATA_JOBS__RECONCILE": "false", "STRATA_JOBS__REGISTER_ZOO": "false",
                "STRATA_JOBS__FAMILIES": '["intervention", "logit_lens"]',
                "STRATA_JOBS__N_SEQUENCES": "2", "STRATA_JOBS__SEQ_LEN": "16",
                "STRATA_API__CHECKPOINT_ROOTS": f'["{self.tmp}"]',
                **self.env_extra}
        return {k: v for k, v in env.items() if v != ""}

    def _spawn(self, name: str, argv: list[str]) -> Proc:
        """`strata *argv` in a session of its own, its output in logs/<name>.log: forked by the
        session's zygote (tests/launcher.py), or exec'd with PYTEST_STRATA_LAUNCH=exec."""
        return start(argv, self.env(), log=self.tmp / "logs" / f"{name}.log")

    def log(self, name: str) -> str:
        path = self.tmp / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---------------------------------------------------------------- processes
    def start_api(self, *, local_worker: bool = False, workers: int = 0) -> None:
        """Start the API; with `workers`, start that many workers while it comes up (they
        keep telling the API they are alive until it answers), and wait for them too."""
        self.served = spawn_service(
            self.env(), inherit=False, log=self.tmp / "logs" / "api.log", port=self.port,
            args=["--local-worker" if local_worker else "--no-local-worker"],
            new_session=True, forked=True)
        self.api = self.served.proc
        started = [self.start_worker(wait=False) for _ in range(workers)]
        wait_healthy(self.served, timeout=90)
        for proc in started:
            self.wait_worker(proc)

    def stop_api(self) -> None:
        if self.api is not None and self.api.poll() is None:
            self.api.send_signal(signal.SIGTERM)
            self.api.wait(timeout=60)

    def start_worker(self, *, wait: bool = True) -> Proc:
        proc = self._spawn(f"worker-{len(self.workers)}", ["worker", "--device", "cpu"])
        self.workers.append(proc)
        if wait:
            self.wait_worker(proc)
        return proc

    def wait_worker(self, proc: Proc) -> None:
        """Until the API has heard from the worker `proc`."""
        wait_for("a worker heartbeat", lambda: any(
            w["pid"] for w in self.client.get(f"{V1}/workers").json()
            if w["pid"] == proc.pid), timeout=90)

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", ["beat"])

    def kill(self, proc: Proc) -> None:
        """SIGKILL a process and everything in its session (a prefork worker's children)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        # Cleanup, not a shutdown under test (test_lifetime.py checks those): every process
        # is killed with its session (its pool children too), and the folder removed.
        for proc in [*self.workers, *([self.beat] if self.beat else []),
                     *([self.api] if self.api else [])]:
            self.kill(proc)
        # The processes' last words, on the test's stdout: pytest shows them if it failed.
        for path in sorted((self.tmp / "logs").glob("*.log")):
            print(f"--- {path.name} (last 4000 characters)\n"
                  f"{path.read_text(errors='replace')[-4000:]}")
        self.client.close()
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---------------------------------------------------------------- API helpers
    def add_model(self, source: str) -> None:
        """Register a model into the database file before the API starts, as `strata models
        add` does with no service running (`service.store.registration.register`, the same
        operation as `POST /models`). Done here, in the test's process: the API then never
        loads a model, which spares each deployment a TransformerLens import."""
        from service.store import Store
        from service.store.migrate import upgrade
        from service.store.registration import Registration, register

        assert self.api is None, "add_model registers into the file: call it before start_api"
        with Store.open(self.db, threads=1) as store:
            upgrade(store)
            register(store, Registration(source), checkpoint_roots=[self.tmp],
                     load_max_mb=1024)

    def register(self, source: str, name: str | None = None) -> dict[str, Any]:
        body = {"source": source, **({"name": name} if name else {})}
        answer = self.client.post(f"{V1}/models", json=body)
        assert answer.status_code in (200, 201), answer.text
        return dict(answer.json())

    def submit(self, model: str, **fields: Any) -> httpx.Response:
        return self.client.post(f"{V1}/jobs", json={"model": model, **fields})

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.client.get(f"{V1}/jobs/{job_id}").json())

    def wait_state(self, job_id: int, *states: str, timeout: float = 120) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] in states else None

        try:
            # every 0.5 s: each poll costs the API ~10 ms of CPU, taken from the processes
            # under test
            return dict(wait_for(f"job {job_id} to be {'/'.join(states)}", reached, timeout,
                                 every=0.5))
        except AssertionError:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                             for p in sorted((self.tmp / "logs").glob("*.log")))
            raise AssertionError(f"job {job_id}: {self.job(job_id)}\n{logs}") from None

    def wait_progress(self, job_id: int, at_least: float = 0.05, timeout: float = 120
                      ) -> dict[str, Any]:
        def moving() -> dict[str, Any] | None:
            job = self.job(job_id)
            if job["state"] in ("succeeded", "failed", "cancelled"):
                raise AssertionError(f"job {job_id} ended ({job['state']}) before its progress "
                                     f"was seen at {at_least}: the test's moment was missed")
            p = job.get("progress")
            return job if job["state"] == "running" and p and p["fraction"] >= at_least \
                else None

        return dict(wait_for(f"job {job_id} to make progress", moving, timeout, every=0.25))

    def runs(self) -> list[dict[str, Any]]:
        return list(self.client.get(f"{V1}/runs", params={"limit": 500}).json()["items"])
