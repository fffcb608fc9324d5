"""Refit families computed as worker jobs, with real processes (`strata serve`, `strata worker`,
`strata beat`, Celery's filesystem broker, a real DuckDB file, HTTP between them): a family made,
grown and computed over HTTP, through `strata families` and through the Python client; a worker
SIGKILLed mid-stability, its job re-queued and finished by another worker, exactly one run
stored; beat recomputing a family when it gains a member."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from compute.zoo.paths import zoo_path
from tests.integration.jobs_harness import KEY, V1, Deployment, make_broker
from tests.serving import run_strata, wait_for

# Each deployment is the test's own: parallel runs deal the tests out one by one.
pytestmark = pytest.mark.spread

# A comparison of seconds; and one that runs long enough (tens of seconds, steady progress
# after every null model) for a worker to be killed in the middle of it.
SMALL = {"n_prompts": 4, "prompt_len": 16, "n_null": 1, "cka_tokens": 32}
LONG = {"n_prompts": 64, "prompt_len": 64, "n_null": 12}


def deployment(**env: str) -> Deployment:
    """API + one CPU worker; tiny-4l-s0, tiny-4l-s1 and a third refit (a copy of s1's
    checkpoint, tiny-4l-s2) registered."""
    d = Deployment(make_broker("filesystem"), env_extra=env)
    copy = d.tmp / "tiny-4l-s2"
    shutil.copytree(zoo_path("tiny-4l-s1"), copy)
    for source in ("zoo:tiny-4l-s0", "zoo:tiny-4l-s1", str(copy)):
        d.add_model(source)
    return d


@pytest.fixture
def running() -> Iterator[Deployment]:
    d = deployment()
    try:
        d.start_api(workers=1)
        yield d
    finally:
        d.close()


def stability_rows(d: Deployment, family: str) -> list[dict[str, Any]]:
    answer = d.client.get(f"{V1}/families/{family}/stability",
                          params={"metric": "heads.stability", "per_head": True})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["rows"])


def test_a_family_is_made_grown_and_computed_by_a_worker_over_http_cli_and_client(
        running: Deployment) -> None:
    from service.client import Client

    d = running
    # HTTP: made, computed by the worker
    made = d.client.post(f"{V1}/families", json={"name": "t4", "members": [
        "tiny-4l-s0", "tiny-4l-s1"], **SMALL})
    assert made.status_code == 201, made.text
    job = d.client.post(f"{V1}/families/t4/stability", json={}).json()
    done = d.wait_state(job["id"], "succeeded", "failed", timeout=180)
    assert done["state"] == "succeeded", done["error"]
    assert done["worker"]
    assert done["attempts"] == 1
    rows = stability_rows(d, "t4")
    assert len([r for r in rows if r["head"] is None]) == 4
    assert {r["n"] for r in rows if r["head"] is not None} == {1}  # one refit

    # the CLI: grown, then computed and watched to the end
    env = {"STRATA_API_URL": d.base, "STRATA_API_KEY": KEY}
    grown = run_strata(["families", "add", "t4", "tiny-4l-s2"], env)
    assert grown.exit_code == 0, grown.output
    assert "tiny-4l-s2: pending" in grown.output
    computed = run_strata(["families", "compute", "t4", "--watch"], env)
    assert computed.exit_code == 0, computed.output
    assert "succeeded" in computed.output
    listed = run_strata(["families", "list"], env)
    assert listed.exit_code == 0, listed.output
    assert "tiny-4l-s2: current" in listed.output, listed.output
    assert {r["n"] for r in stability_rows(d, "t4") if r["head"] is not None} == {2}
    refused = run_strata(["families", "create", "solo", "--member", "tiny-4l-s0"], env)
    assert refused.exit_code == 2
    assert "at least two distinct members" in refused.output

    # the Python client: another family of the same refits, computed and read
    with Client(d.base, api_key=KEY) as client:
        family = client.create_family("t4-b", ["tiny-4l-s1", "tiny-4l-s2"], **SMALL)
        assert family.anchor.name == "tiny-4l-s1"
        job = client.compute_stability("t4-b")
        finished = client.wait(job, timeout=180)
        assert finished.run_id is not None
        assert client.compute_stability("t4-b").id == job.id  # one job per configuration
        frame = client.stability("t4-b", "heads.stability")
        assert frame.height == 4
        assert {m.state for m in client.family("t4-b").member_states} == {"current"}
        assert sorted(f.name for f in client.families()) == ["t4", "t4-b"]


def test_a_worker_killed_mid_stability_the_job_is_requeued_and_completed(
        running: Deployment) -> None:
    d = running
    made = d.client.post(f"{V1}/families", json={"name": "t4-long", "members": [
        "tiny-4l-s0", "tiny-4l-s1"], **LONG})
    assert made.status_code == 201, made.text
    job = d.client.post(f"{V1}/families/t4-long/stability").json()
    seen = d.wait_progress(job["id"], at_least=0.1, timeout=180)
    assert seen["progress"]["total"] == 2 + 1 + LONG["n_null"]
    d.kill(d.workers[0])  # SIGKILL: no clean shutdown; the filesystem broker's message is gone
    d.start_worker()
    done = d.wait_state(job["id"], "succeeded", "failed", timeout=300)
    assert done["state"] == "succeeded", done["error"]
    assert done["attempts"] == 2, done
    runs = [r for r in d.runs() if r["config_hash"] == job["config_hash"]]
    assert [r["id"] for r in runs] == [done["run_id"]]
    rows = stability_rows(d, "t4-long")
    keys = [(r["layer"], r["head"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4 + 4 * 4  # each row stored once
    assert d.client.get(f"{V1}/families/t4-long").json()["stability_run_id"] == done["run_id"]


def test_beat_recomputes_a_family_when_it_gains_a_member() -> None:
    # edits settle in 1 s (not the default 10): this test is about beat, not the window
    d = deployment(STRATA_JOBS__RECONCILE="true", STRATA_JOBS__RECONCILE_INTERVAL_S="2",
                   STRATA_JOBS__FAMILY_SETTLE_S="1")
    try:
        d.start_api(workers=1)
        d.start_beat()
        made = d.client.post(f"{V1}/families", json={"name": "t4", "members": [
            "tiny-4l-s0", "tiny-4l-s1"], **SMALL})
        assert made.status_code == 201, made.text

        def family_job(members: int) -> dict[str, Any] | None:
            job = d.client.get(f"{V1}/families/t4").json()["job"]
            if job is None:
                return None
            full = d.job(job["id"])
            return full if len(full["config"]["members"]) == members else None

        first = wait_for("the family's stability to be queued", lambda: family_job(2), 120)
        assert first["reason"] == "reconcile"
        assert d.wait_state(first["id"], "succeeded", "failed", timeout=240)["state"] == \
            "succeeded"
        grown = d.client.post(f"{V1}/families/t4/members", json={"members": ["tiny-4l-s2"]})
        assert grown.status_code == 200, grown.text
        second = wait_for("the grown family's stability to be queued", lambda: family_job(3),
                          120)
        assert second["reason"] == "reconcile"
        assert second["id"] != first["id"]
        done = d.wait_state(second["id"], "succeeded", "failed", timeout=240)
        assert done["state"] == "succeeded", done["error"]
        family = d.client.get(f"{V1}/families/t4").json()
        assert family["stability_run_id"] == done["run_id"]
        assert {m["state"] for m in family["member_states"]} == {"current"}
        assert {r["n"] for r in stability_rows(d, "t4") if r["head"] is not None} == {2}
        # beat keeps asking (every 2 s); nothing more is queued for the family
        time.sleep(5)
        assert d.client.get(f"{V1}/families/t4").json()["job"]["id"] == second["id"]
    finally:
        d.close()
