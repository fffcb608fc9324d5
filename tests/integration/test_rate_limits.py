"""Rate limits on a real app and store, served over HTTP by uvicorn: reads per client address,
writes per API key, 429 with Retry-After, the workers' protocol never limited; the Python
client and `strata jobs` wait out a Retry-After (bounded) and then succeed."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from litestar import Litestar

from service.api.app import create_app
from service.client import Client, RateLimitedError, UnprocessableError
from service.jobs.board import Board
from service.jobs.service import JobService
from service.settings import ApiSettings, Settings
from service.store import Store
from tests.serving import free_port

KEY, OTHER = "rate-key", "other-key"
ARROW = "application/vnd.apache.arrow.stream"


class NoBroker:
    def send(self, job_id: int, dispatch: int, queue: str = "gpu") -> None:
        raise AssertionError("nothing is sent in these tests")


@contextlib.contextmanager
def serving(app: Litestar) -> Iterator[str]:
    """`app` served by uvicorn on a free port in this process; its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped"
        assert time.monotonic() < end, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def service(tmp_path: Path, **api: str) -> Iterator[str]:
    from service.store.migrate import upgrade

    db = tmp_path / "limits.duckdb"
    with Store.open(db, threads=1) as store:
        upgrade(store)
        settings = Settings(database=db, api_keys=f"{KEY},{OTHER}", data_dir=tmp_path / "state",
                            api=ApiSettings(**api))
        jobs = JobService(store, settings, NoBroker(), Board(30.0))
        with serving(create_app(settings, store, jobs=jobs)) as url:
            yield url


def test_reads_are_limited_per_address_with_retry_after(tmp_path: Path) -> None:
    with service(tmp_path, read_rate_limit="5/minute", write_rate_limit="") as url, \
            httpx.Client(base_url=url) as http:
        answers = [http.get("/api/v1/models") for _ in range(5)]
        assert [a.status_code for a in answers] == [200] * 5
        refused = http.get("/api/v1/runs")
        assert refused.status_code == 429
        assert refused.json()["error"] == "too_many_requests"
        assert "5 per minute" in refused.json()["detail"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        # liveness and readiness stay open (probes); writes have their own budget (none here)
        assert http.get("/api/v1/health").status_code == 200
        assert http.get("/api/v1/ready").status_code == 200
        written = http.post("/api/v1/models", json={"source": "zoo:no-such-model"},
                            headers={"X-API-Key": KEY})
        assert written.status_code == 422, written.text


def test_writes_are_limited_per_key_and_the_workers_protocol_never(tmp_path: Path) -> None:
    with service(tmp_path, read_rate_limit="", write_rate_limit="3/hour") as url, \
            httpx.Client(base_url=url) as http:
        body = {"source": "zoo:no-such-model"}
        mine = [http.post("/api/v1/models", json=body, headers={"X-API-Key": KEY})
                for _ in range(4)]
        assert [a.status_code for a in mine] == [422, 422, 422, 429]
        assert int(mine[-1].headers["Retry-After"]) > 60  # the hour's window
        assert "API key" in mine[-1].json()["detail"]
        # another key has its own budget; so has a caller without a (valid) key: its address
        assert http.post("/api/v1/models", json=body,
                         headers={"X-API-Key": OTHER}).status_code == 422
        guesses = [http.post("/api/v1/models", json=body, headers={"X-API-Key": f"guess{i}"})
                   .status_code for i in range(4)]
        assert guesses == [401, 401, 401, 429]
        # reads are not limited here; nor, ever, what a worker sends with the exhausted key
        assert http.get("/api/v1/models").status_code == 200
        beat = {"name": "w1", "device": "cpu", "dtype": "float32", "queues": ["gpu"],
                "host": "h", "pid": 1}
        worker = {"X-API-Key": KEY}
        for _ in range(10):
            assert http.post("/api/v1/workers/heartbeat", json=beat,
                             headers=worker).status_code == 204
            assert http.post("/api/v1/jobs/7/heartbeat", json={"dispatch": 0, "worker": "w1"},
                             headers=worker).status_code == 404  # no such job: not 429
            assert http.post("/api/v1/jobs/7/claim", json={
                "dispatch": 0, "worker": "w1", "device": "cpu"},
                headers=worker).status_code == 404
            assert http.post("/api/v1/jobs/7/fail", json={
                "dispatch": 0, "worker": "w1", "error": "x"}, headers=worker).status_code == 404
            delivered = http.post("/api/v1/runs/ingest", params={"job_id": 7},
                                  content=b"not arrow", headers={**worker, "Content-Type": ARROW})
            assert delivered.status_code in (400, 404, 422), delivered.text
            assert http.post("/api/v1/jobs/reconcile", headers=worker).status_code == 200
        # the same ingest without job_id is a person's write: limited
        assert http.post("/api/v1/runs/ingest", content=b"x", headers={
            **worker, "Content-Type": ARROW}).status_code == 429


def test_the_client_waits_out_retry_after_then_succeeds(tmp_path: Path) -> None:
    with service(tmp_path, read_rate_limit="2/second", write_rate_limit="1/hour") as url:
        client = Client(url, api_key=KEY)
        began = time.monotonic()
        for _ in range(6):  # 2 per second: the 3rd and 5th calls wait for the next window
            assert client.health()
            assert client.models().height == 0
        assert time.monotonic() - began >= 1.0
        # a wait longer than the client's bound is not waited: raised at once, with the wait
        with pytest.raises(UnprocessableError):  # the one allowed write: no such model
            client.register("x", "zoo:no-such-model")
        began = time.monotonic()
        with pytest.raises(RateLimitedError) as refused:
            client.register("x", "zoo:no-such-model")
        assert time.monotonic() - began < 5
        assert refused.value.status == 429
        assert refused.value.retry_after is not None
        assert refused.value.retry_after > 60
        client.close()


def test_strata_jobs_waits_out_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    from service.cli import main
    from service.settings import get_settings

    with service(tmp_path, read_rate_limit="1/second", write_rate_limit="") as url:
        monkeypatch.setenv("STRATA_API_URL", url)
        monkeypatch.setenv("STRATA_API_KEY", KEY)
        get_settings.cache_clear()
        try:
            began = time.monotonic()
            outputs = [CliRunner().invoke(main, ["jobs", "list"]) for _ in range(3)]
            assert [o.exit_code for o in outputs] == [0, 0, 0], [o.output for o in outputs]
            assert time.monotonic() - began >= 1.0
            assert any("rate limited by the service; retrying in" in o.output for o in outputs)
        finally:
            get_settings.cache_clear()
