"""The job system end to end, with real processes: `strata serve`, `strata worker` and
`strata beat`, a real broker (filesystem, Redis; the main path also RabbitMQ), a real DuckDB file,
HTTP between them. No `task_always_eager`: a job here travels HTTP -> broker -> worker -> HTTP
ingest -> DuckDB -> HTTP, as in production."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import psutil
import pytest

from compute.run import METRIC_VERSION
from tests import launcher
from tests.integration.jobs_harness import LONG, SMALL, V1, Deployment, make_broker
from tests.integration.synthetic import old_version_body
from tests.serving import wait_for

# Each test builds its own deployment: parallel runs deal them out one by one.
pytestmark = pytest.mark.spread

BROKERS = ["filesystem", "redis"]
MODEL = "zoo:tiny-2l-s0"


def deploy(kind: str, **env: str) -> Deployment:
    return Deployment(make_broker(kind), env_extra=env)


def started(broker_kind: str) -> Iterator[Deployment]:
    """API + one CPU worker on `broker_kind`, with tiny-2l-s0 registered (no reconciliation)."""
    d = deploy(broker_kind)
    try:
        d.add_model(MODEL)
        d.start_api(workers=1)
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module", params=BROKERS)
def running(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """`started` on each broker, shared by the two tests that use it (in one process:
    `RUNNING`): the main path first, then the worker killed mid-job, which ends its use."""
    yield from started(str(request.param))


@pytest.fixture
def running_alone(broker_kind: str) -> Iterator[Deployment]:
    """`started` for one test alone."""
    yield from started(broker_kind)


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
    """What `strata compute` writes for the same configuration (the command run in this
    process: its own process would only add another TransformerLens import)."""
    from click.testing import CliRunner

    from service.cli import main

    out = d.tmp / "cli.parquet"
    metrics = ",".join(job["metrics"])  # type: ignore[call-overload]
    result = CliRunner().invoke(main, [
        "compute", "--model", MODEL, "--metrics", metrics, "--n-sequences",
        str(job["n_sequences"]), "--seq-len", str(job["seq_len"]), "--out", str(out),
        "--quiet"])
    assert result.exit_code == 0, result.output
    return pl.read_parquet(out)


KEYS = ["metric", "layer", "component"]


def assert_same_records(served: pl.DataFrame, cli: pl.DataFrame) -> None:
    left = served.select([*KEYS, "value", "n"]).sort(KEYS, nulls_last=True)
    right = cli.select([*KEYS, "value", "n"]).sort(KEYS, nulls_last=True)
    assert left.height == right.height > 0
    assert left.select(KEYS).equals(right.select(KEYS))
    assert (left["n"] == right["n"]).all()
    diff = (left["value"] - right["value"]).abs().max()
    assert diff is not None
    assert diff < 1e-9


def run_main_path(d: Deployment) -> None:
    submitted = d.submit("tiny-2l-s0", **SMALL)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert job["state"] in ("queued", "running")
    assert job["run_id"] is None
    done = d.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", done["error"]
    assert done["worker"]
    assert done["attempts"] == 1
    assert done["wall_s"] > 0
    cli = cli_records(d, **SMALL)
    served = served_records(d, "tiny-2l-s0", done["run_id"], cli["metric"].unique().to_list())
    assert_same_records(served, cli)
    # One job, one run: the same configuration again is the same job.
    again = d.submit("tiny-2l-s0", **SMALL)
    assert again.status_code == 200
    assert again.json()["id"] == job["id"]
    assert [r["id"] for r in d.runs()] == [done["run_id"]]
    # where the worker's time went and the peak memory it reached, stored with the run
    resources = d.runs()[0]["resources"]
    assert set(resources["timings_s"]) >= {"load", "clean_pass", *SMALL["metrics"]}
    assert sum(resources["timings_s"].values()) <= done["wall_s"]
    # a worker process holding torch and a model is hundreds of MiB, and within this machine
    assert 100 < resources["host_peak_rss_mib"] < psutil.virtual_memory().total / 2**20
    assert resources["host_peak_scope"] == "run"  # Linux: restarted at the run's start
    assert resources["device_peak_allocated_mib"] is None  # a CPU worker


RUNNING = pytest.mark.xdist_group("test_jobs-running")


@RUNNING
def test_submit_compute_query_equals_cli(running: Deployment) -> None:
    run_main_path(running)
    # force: a second job, which replaces the one run (still one run, same rows)
    forced = running.submit("tiny-2l-s0", **SMALL, force=True)
    assert forced.status_code == 202
    second = running.wait_state(forced.json()["id"], "succeeded", "failed")
    assert second["state"] == "succeeded"
    assert second["forced"]
    assert len(running.runs()) == 1
    assert second["run_id"] == running.runs()[0]["id"]


def test_main_path_on_rabbitmq() -> None:
    d = deploy("rabbitmq")
    try:
        d.add_model(MODEL)
        d.start_api(workers=1)
        run_main_path(d)
    finally:
        d.close()


# ---------------------------------------------------------------- a worker dies mid-job
def assert_one_complete_run(d: Deployment, job: dict[str, object]) -> None:
    """Exactly one run for the job's configuration, its records each stored once."""
    runs = [r for r in d.runs() if r["config_hash"] == job["config_hash"]]
    assert len(runs) == 1
    assert runs[0]["id"] == job["run_id"]
    assert runs[0]["status"] == "succeeded"
    for metric in ("intervention.kl", "logit_lens.kl_to_final"):
        rows = d.client.get(f"{V1}/models/{job['model']}/metrics",
                            params={"metric": metric, "run_id": job["run_id"]}).json()["rows"]
        keys = [(r["layer"], r.get("component")) for r in rows]
        assert keys, f"{metric}: no rows"
        assert len(keys) == len(set(keys)), f"{metric}: duplicated rows"


@RUNNING
def test_worker_killed_mid_job_is_finished_by_another(running: Deployment) -> None:
    d = running
    job = d.submit("tiny-2l-s0", **LONG).json()
    seen = d.wait_progress(job["id"])
    first_worker = seen["worker"]
    d.kill(d.workers[0])  # SIGKILL: no clean shutdown, the broker's message is gone or unacked
    d.start_worker()
    done = d.wait_state(job["id"], "succeeded", "failed", timeout=240)
    assert done["state"] == "succeeded", done["error"]
    assert done["attempts"] == 2, done
    assert done["worker"] != first_worker or d.workers[1].pid != d.workers[0].pid
    assert_one_complete_run(d, done)


# ---------------------------------------------------------------- the broker is down
@pytest.mark.parametrize("broker_kind", ["filesystem"])  # Redis: test_faults.py
def test_broker_down_refuses_submissions_and_recovers(broker_kind: str) -> None:
    d = deploy(broker_kind)
    try:
        d.add_model(MODEL)
        d.start_api(workers=1)
        first = d.wait_state(d.submit("tiny-2l-s0", **SMALL).json()["id"], "succeeded")
        d.broker.down()
        refused = d.submit("tiny-2l-s0", **{**SMALL, "n_sequences": 3})
        assert refused.status_code == 503, refused.text
        assert "broker" in refused.json()["detail"]
        # nothing was queued, and reads keep working
        assert d.client.get(f"{V1}/jobs").json()["total"] == 1
        rows = d.client.get(f"{V1}/models/tiny-2l-s0/metrics",
                            params={"metric": "intervention.kl"})
        assert rows.status_code == 200
        assert rows.json()["rows"]
        assert d.client.get(f"{V1}/runs/{first['run_id']}").status_code == 200
        time.sleep(2)  # the worker polls the broker meanwhile, and loses it
        d.broker.up()

        def accepted() -> dict[str, object] | None:
            answer = d.submit("tiny-2l-s0", **{**SMALL, "n_sequences": 3})
            return answer.json() if answer.status_code == 202 else None

        job = wait_for("a submission after the broker returned", accepted, timeout=60, every=1)
        done = d.wait_state(int(job["id"]), "succeeded", "failed", timeout=180)  # type: ignore[call-overload]
        assert done["state"] == "succeeded", done["error"]
        assert d.workers[0].poll() is None  # the same worker: it reconnected, it did not die
    finally:
        d.close()


# ---------------------------------------------------------------- failing jobs
def checkpoint_copy(d: Deployment, name: str) -> Path:
    from compute.zoo.paths import zoo_path

    folder = d.tmp / name
    shutil.copytree(zoo_path("tiny-2l-s0"), folder)
    return folder


@pytest.mark.parametrize("broker_kind", ["filesystem"])  # the broker plays no part
def test_unloadable_and_nan_models_fail_with_the_reason_and_store_nothing(
        running_alone: Deployment) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    d = running_alone
    broken = checkpoint_copy(d, "broken")
    d.register(str(broken))
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")  # after registration
    poisoned = checkpoint_copy(d, "poisoned")
    weights = load_file(poisoned / "model.safetensors")
    key = next(k for k in weights if "wte" in k or "embed" in k)
    weights[key] = torch.full_like(weights[key], float("nan"))
    save_file(weights, poisoned / "model.safetensors", metadata={"format": "pt"})
    d.register(str(poisoned))

    unloadable = d.wait_state(d.submit("broken", **SMALL).json()["id"], "succeeded", "failed")
    assert unloadable["state"] == "failed"
    assert "ModelLoadError" in unloadable["error"]
    assert "broken" in unloadable["error"]
    nan = d.wait_state(d.submit("poisoned", **SMALL).json()["id"], "succeeded", "failed")
    assert nan["state"] == "failed"
    assert "ComputeError" in nan["error"]
    assert ("nan" in nan["error"].lower()
                                               or "finite" in nan["error"])
    assert d.runs() == []  # nothing stored for either
    # the worker is still there and computes the next job
    ok = d.wait_state(d.submit("tiny-2l-s0", **SMALL).json()["id"], "succeeded", "failed")
    assert ok["state"] == "succeeded"


# ---------------------------------------------------------------- cancel
@pytest.mark.parametrize("broker_kind", ["filesystem"])  # transitions: test_job_states.py
def test_cancel_a_queued_and_a_running_job(broker_kind: str) -> None:
    d = deploy(broker_kind)
    try:
        d.add_model(MODEL)
        d.start_api()
        queued = d.submit("tiny-2l-s0", **SMALL).json()  # no worker yet: stays queued
        cancelled = d.client.delete(f"{V1}/jobs/{queued['id']}")
        assert cancelled.status_code == 200
        assert cancelled.json()["state"] == "cancelled"
        again = d.client.delete(f"{V1}/jobs/{queued['id']}")
        assert again.status_code == 409
        assert "cancelled" in again.json()["detail"]
        d.start_worker()
        running = d.submit("tiny-2l-s0", **LONG).json()
        d.wait_progress(running["id"])
        assert d.client.delete(f"{V1}/jobs/{running['id']}").json()["state"] == "cancelled"
        wait_for("the worker to stop the cancelled job",
                 lambda: "cancelled: stopped, nothing stored" in d.log("worker-0"), timeout=60)
        # the queued one never started, the running one stored nothing
        assert "job 1 (dispatch 0) not started" in d.log("worker-0")
        assert d.job(queued["id"])["state"] == "cancelled"
        assert d.job(running["id"])["state"] == "cancelled"
        assert d.runs() == []
        # the same configuration can be submitted again: a new job
        resubmitted = d.submit("tiny-2l-s0", **SMALL)
        assert resubmitted.status_code == 202
        assert resubmitted.json()["id"] != queued["id"]
        assert d.wait_state(resubmitted.json()["id"], "succeeded")["run_id"] is not None
    finally:
        d.close()


# ---------------------------------------------------------------- reconciliation
@pytest.mark.parametrize("broker_kind", ["filesystem"])
def test_registration_version_bump_beat_and_watch_folder_lead_to_results(
        broker_kind: str) -> None:
    d = deploy(broker_kind, STRATA_JOBS__RECONCILE="true",
               STRATA_JOBS__RECONCILE_INTERVAL_S="1.5")
    watch = d.tmp / "incoming"
    watch.mkdir()
    d.env_extra["STRATA_JOBS__WATCH_DIR"] = str(watch)
    try:
        d.start_api(workers=1)
        # 1. registering a model leads to its results, with no further action
        model = d.register(MODEL)
        job = wait_for("a job for the new model", lambda: d.client.get(
            f"{V1}/jobs", params={"model": "tiny-2l-s0"}).json()["items"], timeout=30)[0]
        assert job["reason"] == "reconcile"
        done = d.wait_state(job["id"], "succeeded", "failed")
        assert done["state"] == "succeeded", done["error"]
        rows = d.client.get(f"{V1}/models/{model['name']}/metrics",
                            params={"metric": "intervention.kl", "component": "drop"}).json()
        assert [r["layer"] for r in rows["rows"]] == [0, 1]  # one per layer
        # 2. results under an older metric version only: beat's reconciliation recomputes
        ingested = d.client.post(f"{V1}/runs/ingest", content=old_version_body("0"),
                                 headers={"Content-Type": "application/vnd.apache.arrow.stream"})
        assert ingested.status_code == 201, ingested.text
        d.start_beat()
        bumped = wait_for("recomputation under the current metric version", lambda: [
            j for j in d.client.get(f"{V1}/jobs", params={"model": "tiny-4l-s0"}).json()["items"]
            if j["metric_version"] == METRIC_VERSION], timeout=60)
        assert len(bumped) == 1
        done = d.wait_state(bumped[0]["id"], "succeeded", "failed")
        assert done["state"] == "succeeded", done["error"]
        versions = sorted(r["metric_version"] for r in d.runs() if r["model"] == "tiny-4l-s0")
        assert versions == ["0", METRIC_VERSION]  # the old run stays queryable
        # 3. a checkpoint folder appearing in the watch folder: registered by its folder name
        shutil.copytree(checkpoint_source(), d.tmp / "staging")
        (d.tmp / "staging").rename(watch / "dropped-in")
        job = wait_for("a job for the watched folder", lambda: d.client.get(
            f"{V1}/jobs", params={"model": "dropped-in"}).json()["items"]
            if d.client.get(f"{V1}/models/dropped-in").status_code == 200 else None,
            timeout=60)[0]
        assert d.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
        # 4. reconciliations racing (beat's and five requests at once) queue nothing twice
        from concurrent.futures import ThreadPoolExecutor

        before = d.client.get(f"{V1}/jobs").json()["total"]
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: d.client.post(f"{V1}/jobs/reconcile"), range(5)))
        assert all(a.status_code == 200 and a.json()["queued"] == [] for a in answers)
        assert d.client.get(f"{V1}/jobs").json()["total"] == before
        jobs = d.client.get(f"{V1}/jobs", params={"limit": 100}).json()["items"]
        hashes = [(j["config_hash"], j["metric_version"]) for j in jobs]
        assert len(hashes) == len(set(hashes))
    finally:
        d.close()


def checkpoint_source() -> Path:
    from compute.zoo.paths import zoo_path

    return zoo_path("tiny-2l-s0")


# ---------------------------------------------------------------- the shell
def strata(d: Deployment, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return launcher.run(args, env or d.env(), timeout=300)


def test_jobs_and_models_from_the_shell() -> None:
    import json

    d = deploy("filesystem")
    try:
        # no service yet: `strata models add` registers into the file, named after the folder
        folder = checkpoint_copy(d, "my-checkpoint")
        added = strata(d, "models", "add", str(folder))
        assert added.returncode == 0, added.stderr
        assert "registered my-checkpoint" in added.stdout
        d.start_api(workers=1)
        no_families = strata(d, "families", "list")
        assert no_families.returncode == 0, no_families.stderr
        assert no_families.stdout.startswith("no families: make one with `strata families create")
        named = strata(d, "models", "add", MODEL, "--name", "two-layers")
        assert named.returncode == 0, named.stderr
        listed = strata(d, "models", "list")
        assert "my-checkpoint" in listed.stdout
        assert "two-layers" in listed.stdout
        submitted = strata(d, "jobs", "submit", "--model", "two-layers", "--metrics",
                           "intervention", "--n-sequences", "2", "--seq-len", "16", "--watch")
        assert submitted.returncode == 0, submitted.stderr
        job = json.loads(submitted.stdout[:submitted.stdout.rindex("}") + 1])
        *_, outcome, measured = submitted.stdout.splitlines()
        assert "succeeded" in outcome
        # then what it took, beside the estimate printed before it ran
        assert re.fullmatch(r"  measured: [0-9.]+ s, peak resident memory [0-9.]+ GiB", measured)
        assert "job" in submitted.stderr  # the progress bar
        status = json.loads(strata(d, "jobs", "status", str(job["id"])).stdout)
        assert status["state"] == "succeeded"
        assert status["run_id"] is not None
        assert f"job {job['id']} succeeded" in strata(d, "jobs", "list").stdout
        late = strata(d, "jobs", "cancel", str(job["id"]))
        assert late.returncode == 2
        assert "already succeeded" in late.stderr
        unknown = strata(d, "jobs", "submit", "--model", "nobody")
        assert unknown.returncode == 2
        assert "unknown model 'nobody'" in unknown.stderr
        failing = strata(d, "jobs", "submit", "--model", "two-layers", "--device", "cuda",
                         "--watch")  # refused before queueing: the only worker is a CPU one
        assert failing.returncode == 2
        assert "no worker has device 'cuda'" in failing.stderr
        down = strata(d, "jobs", "list", "--url", "http://127.0.0.1:9")
        assert down.returncode == 6
        assert "cannot be reached" in down.stderr
    finally:
        d.close()


def test_jobs_are_routed_through_named_queues() -> None:
    d = deploy("filesystem")
    try:
        d.add_model(MODEL)
        d.start_api()
        big = d._spawn("worker-big", ["worker", "--device", "cpu", "--queues", "big-gpu",
                                      "--name", "big"])
        d.workers.append(big)
        wait_for("the big-gpu worker", lambda: [w for w in d.client.get(f"{V1}/workers").json()
                                                if w["queues"] == ["big-gpu"]], timeout=90)
        refused = d.submit("tiny-2l-s0", **SMALL, queue="tiny-gpu")
        assert refused.status_code == 422
        assert "no worker consumes queue 'tiny-gpu'" in refused.json()["detail"]
        job = d.submit("tiny-2l-s0", **SMALL, queue="big-gpu").json()
        assert job["queue"] == "big-gpu"
        done = d.wait_state(job["id"], "succeeded", "failed")
        assert done["state"] == "succeeded"
        assert done["worker"].startswith("big")
    finally:
        d.close()
