"""Faults survived with nothing lost, with real processes (`strata serve`, `strata worker`, a
redis-server of the test's own, a real DuckDB file): the database's disk fills up, the broker
goes away mid-job, the API is killed and restarted while a worker delivers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.api_server import arrow_body
from tests.integration.jobs_harness import LONG, SMALL, V1, Deployment, make_broker
from tests.integration.synthetic import synthetic_result
from tests.serving import wait_for

# Each test builds its own deployment: parallel runs deal them out one by one.
pytestmark = pytest.mark.spread

MODEL = "zoo:tiny-2l-s0"
ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
# Leases long enough that a loaded machine's slow heartbeat never re-sends a job here: these
# tests count attempts, and lost workers are not what they are about.
LEASE = {"STRATA_JOBS__LEASE_S": "60"}


@contextlib.contextmanager
def small_disk(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted at `where` (needs root; skips with the reason if the
    mount is refused)."""
    where.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the disk-full test: {done.stderr.strip()} "
                    "(needs root or CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Fill `disk` up to `leave` bytes with one spacer file."""
    stat = os.statvfs(disk)
    spacer = disk / "spacer"
    with spacer.open("wb") as out:
        out.write(b"\0" * max(stat.f_bavail * stat.f_frsize - leave, 0))
    return spacer


def records(d: Deployment, run_id: int) -> dict[str, Any]:
    """A run and its intervention.kl and logit_lens.kl_to_final rows, as the API serves them."""
    out: dict[str, Any] = {"run": d.client.get(f"{V1}/runs/{run_id}").json()}
    for metric in ("intervention.kl", "logit_lens.kl_to_final"):
        answer = d.client.get(f"{V1}/models/tiny-2l-s0/metrics",
                              params={"metric": metric, "run_id": run_id})
        assert answer.status_code == 200, answer.text
        out[metric] = answer.json()["rows"]
    return out


def test_disk_full_refuses_with_507_keeps_what_is_stored_and_recovers(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 48) as disk:
        d = Deployment(make_broker("filesystem"),
                       env_extra={"STRATA_DATABASE": str(disk / "strata.duckdb"), **LEASE})
        try:
            d.add_model(MODEL)
            d.start_api(workers=1)
            first = d.wait_state(d.submit("tiny-2l-s0", **SMALL).json()["id"], "succeeded",
                                 "failed")
            assert first["state"] == "succeeded", first["error"]
            before = records(d, first["run_id"])

            job = d.submit("tiny-2l-s0", **LONG).json()
            d.wait_progress(job["id"], at_least=0.02, timeout=180)  # claimed: computing
            spacer = fill(disk, leave=8 * 1024)
            # an ingest that does not fit: a clear 507, nothing stored
            big = arrow_body(synthetic_result(6, 4000, name="too-big"))
            refused = d.client.post(f"{V1}/runs/ingest", content=big, headers=ARROW)
            assert refused.status_code == 507, refused.text
            assert "disk is full" in refused.json()["detail"]
            # the worker's delivery is refused the same way, and it keeps retrying
            wait_for("the worker's delivery to be refused for the full disk",
                     lambda: "HTTP 507" in d.log("worker-0"), timeout=300, every=1)
            assert d.job(job["id"])["state"] == "running"
            # everything stored before is intact and readable
            assert records(d, first["run_id"]) == before
            assert [r["id"] for r in d.runs()] == [first["run_id"]]
            assert d.client.get(f"{V1}/ready").status_code == 200

            spacer.unlink()
            done = d.wait_state(job["id"], "succeeded", "failed", timeout=120)
            assert done["state"] == "succeeded", done["error"]
            assert done["attempts"] == 1, "delivered by the same worker, not computed again"
            assert sorted(r["id"] for r in d.runs()) == sorted([first["run_id"],
                                                                 done["run_id"]])
            assert records(d, first["run_id"]) == before
            assert d.client.post(f"{V1}/runs/ingest", content=big,
                                 headers=ARROW).status_code == 201
        finally:
            d.close()


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_broker_lost_mid_job_the_job_still_succeeds_once(broker: str) -> None:
    d = Deployment(make_broker(broker), env_extra=LEASE)
    try:
        d.add_model(MODEL)
        d.start_api(workers=1)
        worker = d.workers[0]
        job = d.submit("tiny-2l-s0", **LONG).json()
        d.wait_progress(job["id"], at_least=0.02, timeout=180)
        d.broker.down()
        # submissions while it is down: 503, and nothing is queued, not even half
        for n in (3, 4):
            refused = d.submit("tiny-2l-s0", **{**SMALL, "n_sequences": n})
            assert refused.status_code == 503, refused.text
        listed = d.client.get(f"{V1}/jobs").json()
        assert listed["total"] == 1
        assert [j["id"] for j in listed["items"]] == [job["id"]]
        time.sleep(3)  # the worker notices the broker is gone, while it computes
        d.broker.up()
        done = d.wait_state(job["id"], "succeeded", "failed", timeout=300)
        assert done["state"] == "succeeded", done["error"]
        assert done["attempts"] == 1, d.log("worker-0")[-6000:] + d.log("api")[-3000:]
        assert [r["id"] for r in d.runs()] == [done["run_id"]]
        assert worker.poll() is None, "the worker reconnected instead of dying"
        # the refused submissions were not queued behind anyone's back, and new ones work
        again = d.wait_state(d.submit("tiny-2l-s0", **SMALL).json()["id"], "succeeded",
                             "failed", timeout=180)
        assert again["state"] == "succeeded", again["error"]
        assert d.client.get(f"{V1}/jobs").json()["total"] == 2
        assert len(d.runs()) == 2
    finally:
        d.close()


def test_api_killed_and_restarted_while_a_worker_delivers_lands_once() -> None:
    d = Deployment(make_broker("filesystem"), env_extra=LEASE)
    try:
        d.add_model(MODEL)
        d.start_api(workers=1)
        job = d.submit("tiny-2l-s0", **LONG).json()
        # Kill the API mid-job and keep it down until the worker's delivery has met the dead
        # API (its retries are logged), then restart it: the retried delivery must land once.
        # (Waiting for a late progress figure instead raced the job's end on a fast machine.)
        d.wait_progress(job["id"], at_least=0.3, timeout=300)
        assert d.api is not None
        d.api.send_signal(signal.SIGKILL)
        d.api.wait()
        wait_for("the worker's delivery to meet the dead API",
                 lambda: "/api/v1/runs/ingest not answered" in d.log("worker-0"),
                 timeout=300, every=0.5)
        d.start_api()
        done = d.wait_state(job["id"], "succeeded", "failed", timeout=300)
        assert done["state"] == "succeeded", done["error"]
        assert done["attempts"] == 1, "delivered, not computed again: the restarted API " \
            "gave the running job a fresh lease"
        runs = d.runs()
        assert [r["id"] for r in runs] == [done["run_id"]], "exactly one run"
        # no duplicated rows: one row per (metric, layer, component) of the run
        for metric in ("intervention.kl", "logit_lens.kl_to_final"):
            rows = d.client.get(f"{V1}/models/tiny-2l-s0/metrics",
                                params={"metric": metric, "run_id": done["run_id"]}
                                ).json()["rows"]
            keys = [(r["layer"], r.get("component")) for r in rows]
            assert keys
            assert len(keys) == len(set(keys)), metric
        with httpx.Client(base_url=d.base, timeout=30) as client:
            assert client.get(f"{V1}/jobs/{job['id']}").json()["run_id"] == done["run_id"]
    finally:
        d.close()
