"""Prometheus metrics of the service (`GET /metrics`, the official `prometheus-client`).

Two kinds, both in the API process:
- **counted as they happen** (`ServiceMetrics`): HTTP requests by route, method and status
  with a latency histogram; ingested runs, rows and bytes. The API is one process (the
  database's one writer), so in-process counters are complete; they restart from zero with
  it, which Prometheus's `rate()` and `increase()` handle.
- **read at scrape time** (`StoreCollector`): jobs by state and queue, the age of the oldest
  queued job, the queue wait of every job that started (a histogram), leases lost, running
  jobs' progress, workers and the age of each one's last heartbeat, the database file's size.
  Jobs live in the database and progress and workers on the job board, both in this process:
  whatever process a worker runs in, a scrape sees the one truth, and nothing is lost when a
  worker or the API restarts.

Each app has its own registry (tests build several apps in one process).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from service.store.tables import JOB_STATES, JobRow

if TYPE_CHECKING:
    from service.jobs.service import JobService
    from service.store import Store

log = logging.getLogger("strata.api")

# Seconds; requests span a cached read (~0.2 ms) to a large ingest (seconds).
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Seconds a job waited between being queued and a worker starting it.
WAIT_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    21600.0,
    86400.0,
)


class ServiceMetrics:
    """The registry of one app, with its in-process counters."""

    def __init__(self, store: Store, jobs: JobService | None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "strata_http_requests",
            "HTTP requests answered",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "strata_http_request_duration_seconds",
            "time to answer an HTTP request",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ingested_runs = Counter(
            "strata_ingest_runs",
            "runs stored through the ingest endpoint (a worker's delivery or a person's upload)",
            registry=self.registry,
        )
        self.ingested_rows = Counter(
            "strata_ingest_rows",
            "rows stored by ingests (records, "
            "neurons, neuron tokens, stage boundaries, sequence "
            "means)",
            registry=self.registry,
        )
        self.ingested_bytes = Counter(
            "strata_ingest_bytes", "bytes of ingest bodies stored", registry=self.registry
        )
        self.registry.register(StoreCollector(store, jobs))

    def ingested(self, rows: int, body_bytes: int) -> None:
        self.ingested_runs.inc()
        self.ingested_rows.inc(rows)
        self.ingested_bytes.inc(body_bytes)


class RequestMetricsMiddleware(ASGIMiddleware):
    """Counts each answered request under its route template (`/api/v1/jobs/{job_id:int}`,
    never the raw path: labels stay few) and times it. An exception from an inner middleware
    (a 429 of the rate limiter) is counted with its status, then passed on to be answered."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        began = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await next_app(scope, receive, sending)
        except Exception as exc:
            status = int(getattr(exc, "status_code", 0) or getattr(exc, "status", 500))
            raise
        finally:
            route = scope.get("path_template") or "unmatched"
            method = str(scope.get("method", "GET"))
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.latency.labels(route, method).observe(time.perf_counter() - began)


class StoreCollector(Collector):
    """Gauges and counters computed at each scrape from the database and the job board."""

    def __init__(self, store: Store, jobs: JobService | None) -> None:
        self.store = store
        self.jobs = jobs

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield self._database_size()
        try:
            yield from self._jobs()
        except Exception:  # a scrape never fails for this; the rest is still worth having
            log.exception("job metrics could not be read")
        if self.jobs is not None:
            yield from self._board(self.jobs)

    def _database_size(self) -> Metric:
        size = GaugeMetricFamily(
            "strata_database_bytes",
            "size of the DuckDB file and its write-ahead log",
            labels=["file"],
        )
        path = self.store.path
        for name, file in (("database", path), ("wal", path.with_name(path.name + ".wal"))):
            try:
                size.add_metric([name], float(file.stat().st_size))
            except OSError:
                size.add_metric([name], 0.0)
        return size

    def _jobs(self) -> Iterator[Metric]:
        now = time.time()
        with self.store.read() as conn:
            by_state = conn.execute(
                sa.select(JobRow.state, JobRow.queue, sa.func.count()).group_by(
                    JobRow.state, JobRow.queue
                )
            ).all()
            oldest = conn.execute(
                sa.select(JobRow.queue, sa.func.min(JobRow.created_at))
                .where(JobRow.state == "queued")
                .group_by(JobRow.queue)
            ).all()
            waits = conn.execute(
                sa.select(JobRow.queue, JobRow.created_at, JobRow.started_at).where(
                    JobRow.started_at.is_not(None)
                )
            ).all()
            lost = conn.scalar(sa.select(sa.func.coalesce(sa.func.sum(JobRow.dispatch), 0)))
            gave_up = conn.execute(
                sa.select(sa.func.count())
                .select_from(JobRow)
                .where(JobRow.state == "failed", JobRow.error.like("the worker was lost%"))
            ).scalar()
        jobs = GaugeMetricFamily(
            "strata_jobs", "jobs by state and queue", labels=["state", "queue"]
        )
        queues = sorted({q for _, q, _ in by_state})
        counts = {(s, q): n for s, q, n in by_state}
        for queue in queues:
            for state in JOB_STATES:
                jobs.add_metric([state, queue], float(counts.get((state, queue), 0)))
        yield jobs
        age = GaugeMetricFamily(
            "strata_jobs_oldest_queued_seconds",
            "how long the oldest queued job of a queue has waited",
            labels=["queue"],
        )
        for queue, created in oldest:
            age.add_metric([queue], max(now - _epoch(created), 0.0))
        yield age
        yield _wait_histogram(waits)
        leases = CounterMetricFamily(
            "strata_job_leases_lost",
            "running jobs whose worker stopped sending heartbeats (re-queued or given up)",
        )
        leases.add_metric([], float(int(lost or 0) + int(gave_up or 0)))
        yield leases

    def _board(self, jobs: JobService) -> Iterator[Metric]:
        progress = GaugeMetricFamily(
            "strata_job_progress_ratio",
            "fraction of a running job's work done",
            labels=["job_id", "worker"],
        )
        speed = GaugeMetricFamily(
            "strata_job_tokens_per_second", "a running job's speed", labels=["job_id", "worker"]
        )
        for job_id, live in jobs.board.running():
            labels = [str(job_id), live.worker]
            progress.add_metric(labels, live.done / live.total if live.total else 0.0)
            speed.add_metric(labels, live.tokens_per_s)
        yield progress
        yield speed
        now = time.monotonic()
        seen = GaugeMetricFamily(
            "strata_workers",
            "workers whose heartbeat arrived within the "
            "last minute (STRATA_WORKER__HEARTBEAT_S x 6, at least 60 s)",
            labels=["device"],
        )
        age = GaugeMetricFamily(
            "strata_worker_heartbeat_age_seconds",
            "seconds since each "
            "worker's last heartbeat (every worker heard from since the "
            "API started)",
            labels=["worker", "device", "host"],
        )
        window = jobs.worker_window()
        devices: dict[str, int] = {}
        for worker in jobs.board.workers(within_s=float("inf")):
            waited = now - worker.last_seen
            age.add_metric([worker.name, worker.device, worker.host], waited)
            if waited <= window:
                devices[worker.device] = devices.get(worker.device, 0) + 1
        for device, n in sorted(devices.items()):
            seen.add_metric([device], float(n))
        yield seen
        yield age


def _epoch(value: Any) -> float:
    """Seconds since the epoch of a stored timestamp (naive ones are UTC, as stored)."""
    from datetime import UTC

    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


def _wait_histogram(rows: Sequence[Any]) -> Metric:
    family = HistogramMetricFamily(
        "strata_job_queue_wait_seconds",
        "time from queued to started, of every job that started",
        labels=["queue"],
    )
    by_queue: dict[str, list[float]] = {}
    for queue, created, started in rows:
        by_queue.setdefault(queue, []).append(max(_epoch(started) - _epoch(created), 0.0))
    for queue, waits in sorted(by_queue.items()):
        buckets = [(str(b), float(sum(w <= b for w in waits))) for b in WAIT_BUCKETS]
        buckets.append(("+Inf", float(len(waits))))
        family.add_metric([queue], buckets, sum_value=sum(waits))
    return family
