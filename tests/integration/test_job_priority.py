"""People's jobs first: with ten reconciliation jobs queued behind a busy worker, a job a person
submits is the next one the worker starts, and the reconciliation job that was running is not
interrupted. Real processes (`strata serve`, `strata worker`) on each broker: Celery's
filesystem transport, Redis and RabbitMQ."""

from __future__ import annotations

import shutil
from datetime import datetime

import pytest

from tests.integration.jobs_harness import SMALL, V1, Deployment, make_broker
from tests.serving import wait_for

# Each test builds its own deployment: parallel runs deal them out one by one.
pytestmark = pytest.mark.spread

N_BACKGROUND = 10


def started(job: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(job["started_at"]).replace("Z", "+00:00"))


@pytest.mark.parametrize("broker_kind", ["filesystem", "redis", "rabbitmq"])
def test_a_persons_job_runs_before_queued_reconciliation_jobs(broker_kind: str) -> None:
    # Default runs big enough (a few seconds each) that most are still queued when the person
    # submits; reconciliation on, with beat's schedule out of the way.
    d = Deployment(make_broker(broker_kind), env_extra={
        "STRATA_JOBS__RECONCILE": "true", "STRATA_JOBS__RECONCILE_INTERVAL_S": "3600",
        "STRATA_JOBS__N_SEQUENCES": "4", "STRATA_JOBS__SEQ_LEN": "32"})
    try:
        from compute.zoo.paths import zoo_path

        d.start_api()
        # Ten models (copies of one checkpoint under ten names): ten reconciliation jobs,
        # queued while no worker runs.
        for i in range(N_BACKGROUND):
            folder = d.tmp / f"model-{i}"
            shutil.copytree(zoo_path("tiny-2l-s0"), folder)
            d.register(str(folder), name=f"model-{i}")

        def all_queued() -> list[dict[str, object]] | None:
            items = d.client.get(f"{V1}/jobs", params={"limit": 100}).json()["items"]
            return items if len(items) == N_BACKGROUND else None

        background = wait_for("ten reconciliation jobs", all_queued, timeout=60)
        assert {j["reason"] for j in background} == {"reconcile"}
        assert {j["state"] for j in background} == {"queued"}

        d.start_worker()
        busy = wait_for("a reconciliation job to run", lambda: d.client.get(
            f"{V1}/jobs", params={"state": "running"}).json()["items"], timeout=120)[0]

        submitted = d.submit("model-5", **SMALL)
        assert submitted.status_code == 202, submitted.text
        mine = submitted.json()
        assert mine["reason"] == "api"
        behind = {j["id"] for j in d.client.get(
            f"{V1}/jobs", params={"state": "queued", "limit": 100}).json()["items"]} - {mine["id"]}
        assert len(behind) >= N_BACKGROUND - 3, behind  # most were still waiting

        done = d.wait_state(mine["id"], "succeeded", "failed", timeout=180)
        assert done["state"] == "succeeded", done["error"]
        # The reconciliation job that was running when the person submitted was not interrupted.
        previous = d.wait_state(busy["id"], "succeeded", "failed", timeout=120)
        assert previous["state"] == "succeeded", previous["error"]
        assert previous["attempts"] == 1
        assert started(previous) < started(done)
        # No reconciliation job still queued at submission started before the person's job;
        # they are released one by one afterwards (the next one runs to its end).
        d.wait_state(min(behind), "succeeded", "failed", timeout=120)
        jobs = {j["id"]: j for j in d.client.get(f"{V1}/jobs", params={"limit": 100}
                                                 ).json()["items"]}
        later = [jobs[i] for i in behind if jobs[i]["started_at"] is not None]
        assert later
        assert min(started(j) for j in later) > started(done), (done, later)
        assert jobs[min(behind)]["state"] == "succeeded", jobs[min(behind)]
    finally:
        d.close()
