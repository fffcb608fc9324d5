"""GET /metrics over HTTP (uvicorn serving the real app on a real DuckDB file, a real job
service), read with prometheus_client's own parser: requests by route and status with
latencies, jobs by state and queue, queue waits, progress, leases lost, workers and their
heartbeats' age, ingest rows and bytes, the database's size."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.jobs.board import Board
from service.jobs.service import JobService
from service.settings import ApiSettings, JobsSettings, Settings
from service.store import Store
from tests.integration.api_server import arrow_body, line
from tests.integration.test_rate_limits import serving

KEY = "metrics-key"
ARROW = "application/vnd.apache.arrow.stream"
WORKER = {"name": "w1@host", "device": "cpu", "dtype": "float32", "queues": ["gpu"],
          "host": "host", "pid": 1}


class Sent:
    def __init__(self) -> None:
        self.messages: list[tuple[int, int, str]] = []

    def send(self, job_id: int, dispatch: int, queue: str = "gpu") -> None:
        self.messages.append((job_id, dispatch, queue))


def scrape(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[httpx.Client, JobService, Path]]:
    from service.store.migrate import upgrade

    db = tmp_path / "metrics.duckdb"
    with Store.open(db, threads=1) as store:
        upgrade(store)
        settings = Settings(database=db, api_keys=KEY, data_dir=tmp_path / "state",
                            api=ApiSettings(read_rate_limit="1000/minute",
                                            write_rate_limit="4/minute"),
                            jobs=JobsSettings(reconcile=False))
        jobs = JobService(store, settings, Sent(), Board(lease_s=30.0))
        with serving(create_app(settings, store, jobs=jobs)) as url, \
                httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=60) as http:
            yield http, jobs, db


def test_metrics_cover_requests_jobs_workers_ingest_and_the_database(
        served: tuple[httpx.Client, JobService, Path]) -> None:
    http, jobs, db = served
    for _ in range(3):
        assert http.get("/api/v1/models").status_code == 200
    assert http.get("/api/v1/jobs/999").status_code == 404
    # ingest: a person's upload of a 4-layer run
    body = arrow_body(line(4))
    stored = http.post("/api/v1/runs/ingest", content=body, headers={"Content-Type": ARROW})
    assert stored.status_code == 201, stored.text
    summary = stored.json()
    rows = sum(summary[k] for k in ("results", "neurons", "neuron_tokens", "stage_boundaries",
                                    "sequence_means"))
    assert rows >= 4
    # two jobs: one claimed and running with progress, one whose worker is lost
    assert http.post("/api/v1/models", json={"source": "zoo:tiny-2l-s0"}).status_code in (200, 201)
    first = http.post("/api/v1/jobs", json={"model": "tiny-2l-s0", "n_sequences": 2,
                                            "seq_len": 16, "metrics": ["intervention"]}).json()
    second = http.post("/api/v1/jobs", json={"model": "tiny-2l-s0", "n_sequences": 3,
                                             "seq_len": 16, "metrics": ["intervention"]}).json()
    assert http.post("/api/v1/workers/heartbeat", json=WORKER).status_code == 204
    time.sleep(1.1)  # a measurable queue wait
    for job in (first, second):
        claimed = http.post(f"/api/v1/jobs/{job['id']}/claim",
                            json={"dispatch": 0, "worker": "w1@host", "device": "cpu"})
        assert claimed.status_code == 200, claimed.text
    beat = http.post(f"/api/v1/jobs/{first['id']}/heartbeat", json={
        "dispatch": 0, "worker": "w1@host", "done": 3, "total": 12, "tokens_per_s": 250.0,
        "elapsed_s": 1.0})
    assert beat.status_code == 200, beat.text
    jobs.board.lease_s = 0.0  # the second job's lease runs out: its worker is presumed lost
    jobs.board.start(second["id"], 0, "w1@host")
    jobs.requeue_lost()
    assert http.get(f"/api/v1/jobs/{second['id']}").json()["state"] == "queued"
    # a fifth write in a minute (ingest, model, two jobs before it): over the budget of 4
    refused = http.post("/api/v1/jobs", json={"model": "tiny-2l-s0"})
    assert refused.status_code == 429

    m = scrape(http)
    route = "/api/v1/models"
    assert value(m, "strata_http_requests_total", route=route, method="GET", status="200") == 3
    assert value(m, "strata_http_request_duration_seconds_count", route=route,
                 method="GET") == 3
    assert value(m, "strata_http_request_duration_seconds_sum", route=route, method="GET") > 0
    by_id = [k for k in m if k[0] == "strata_http_requests_total" and ("status", "404") in k[1]]
    assert [dict(k[1])["route"] for k in by_id] == ["/api/v1/jobs/{job_id}"]  # a template
    assert value(m, "strata_http_requests_total", route="/api/v1/jobs", method="POST",
                 status="429") == 1
    assert value(m, "strata_ingest_runs_total") == 1
    assert value(m, "strata_ingest_rows_total") == rows
    assert value(m, "strata_ingest_bytes_total") == len(body)
    assert value(m, "strata_jobs", state="running", queue="gpu") == 1
    assert value(m, "strata_jobs", state="queued", queue="gpu") == 1
    assert value(m, "strata_jobs", state="failed", queue="gpu") == 0
    assert value(m, "strata_job_queue_wait_seconds_count", queue="gpu") == 2
    assert value(m, "strata_job_queue_wait_seconds_sum", queue="gpu") >= 2.0
    assert value(m, "strata_job_queue_wait_seconds_bucket", queue="gpu", le="1.0") == 0
    assert value(m, "strata_job_queue_wait_seconds_bucket", queue="gpu", le="+Inf") == 2
    assert 0 <= value(m, "strata_jobs_oldest_queued_seconds", queue="gpu") < 60
    assert value(m, "strata_job_leases_lost_total") == 1
    assert value(m, "strata_job_progress_ratio", job_id=str(first["id"]),
                 worker="w1@host") == pytest.approx(0.25)
    assert value(m, "strata_job_tokens_per_second", job_id=str(first["id"]),
                 worker="w1@host") == 250.0
    assert value(m, "strata_workers", device="cpu") == 1
    age = value(m, "strata_worker_heartbeat_age_seconds", worker="w1@host", device="cpu",
                host="host")
    assert 1.0 <= age < 60
    size = value(m, "strata_database_bytes", file="database")
    assert size == db.stat().st_size
    assert size > 0
    # /metrics itself is never rate limited, and is counted like any route
    for _ in range(3):
        scrape(http)
    assert value(scrape(http), "strata_http_requests_total", route="/metrics", method="GET",
                 status="200") >= 4
