"""The cost before the commitment (issue 50): a job's submission and a model's registration
answer what the run would cost — FLOPs (`compute.flops`), peak memory (`compute.memory`) and
the time on each worker that could take it, from that worker's measured rate (none measured:
none given) — and a default run above `STRATA_JOBS__AUTO_RUN_MAX_TFLOP` waits to be asked for.

The real app and `JobService` on a real DuckDB file, with the fake broker of
test_job_states.py; a worker's history is written as a finished job row."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from compute.flops import family_flops
from compute.memory import ModelDims, sweep_bytes_per_sequence
from compute.zoo.paths import zoo_path
from service.store.tables import JobRow, RunResource, RunRow, TokenSource
from tests.integration.test_job_states import V1, Jobs, open_jobs
from tests.serving import wait_for

TINY = {"metrics": ["intervention", "logit_lens"], "n_sequences": 2, "seq_len": 16}


def _flops(n_sequences: int, seq_len: int, families: list[str]) -> float:
    dims = ModelDims.from_hf_config(zoo_path("tiny-2l-s0"))
    assert dims is not None
    return sum(family_flops(dims, seq_len, families).values()) * n_sequences


def test_a_submission_answers_its_flops_and_memory(tmp_path: Path) -> None:
    with open_jobs(tmp_path) as jobs:
        answer = jobs.submit(**TINY)
        assert answer.status_code == 202, answer.text
        estimate = answer.json()["estimate"]
        assert estimate["flops"] == pytest.approx(_flops(2, 16, TINY["metrics"]), rel=1e-3)
        dims = ModelDims.from_hf_config(zoo_path("tiny-2l-s0"))
        assert dims is not None
        assert estimate["bytes_per_sequence"] == sweep_bytes_per_sequence(
            dims, 16, 4, patterns=False, z=False)
        assert estimate["peak_memory_bytes"] == (estimate["weights_bytes"]
                                                 + 2 * estimate["bytes_per_sequence"])
        assert estimate["weights_bytes"] >= dims.weight_bytes("float32")
        assert estimate["load_peak_host_bytes"] > estimate["weights_bytes"]
        # no worker is up: no time, and it says so rather than inventing one
        assert (estimate["seconds"], estimate["workers"]) == (None, [])
        assert any("no worker" in note for note in estimate["notes"])
        assert "TFLOP" in estimate["summary"]
        assert "time unknown" in estimate["summary"]
        # on a CPU worker loading is the process's peak: the one line a user reads names it
        load_peak = estimate["load_peak_host_bytes"] / 2**20
        assert f"({load_peak:.0f} MiB of host memory while loading)" in estimate["summary"]
        # only the answer to a submission carries it
        assert jobs.job(answer.json()["id"])["estimate"] is None


def _finished_by(jobs: Jobs, job_id: int, worker: str, wall_s: float) -> None:
    """Job `job_id` as if `worker` had run it in `wall_s` seconds."""
    with jobs.store.write() as conn, Session(bind=conn) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        job.state, job.worker = "succeeded", worker
        job.started_at = job.created_at
        job.finished_at = job.created_at + timedelta(seconds=wall_s)
        session.flush()


def _finished_with_timings(jobs: Jobs, job_id: int, worker: str, wall_s: float,
                           timings_s: dict[str, float]) -> None:
    """Job `job_id` as if `worker` had run it in `wall_s` seconds, its run recording where the
    time went (`compute.run.RunResult.timings_s`, stored as ingest stores it)."""
    _finished_by(jobs, job_id, worker, wall_s)
    with jobs.store.write() as conn, Session(bind=conn) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        source = TokenSource(spec_hash=f"{job_id:064d}", source="builtin", path=None,
                             n_sequences=2, seq_len=16, seed=0, fingerprint=None, spec={})
        session.add(source)
        session.flush()
        run = RunRow(model_id=job.model_id, token_source_id=source.id,
                     config_hash=job.config_hash, metric_version=job.metric_version,
                     code_version="test", families=list(job.config["families"]),
                     config=job.config, status="succeeded", progress=1.0, error=None,
                     started_at=job.started_at, finished_at=job.finished_at, device="cpu",
                     dtype="float32", tokens_evaluated=None, wall_s=wall_s, environment=None,
                     n_records=0)
        session.add(run)
        session.flush()
        session.add(RunResource(run_id=run.id, timings_s=timings_s, host_peak_rss_mib=None,
                                host_peak_scope=None, device_peak_allocated_mib=None))
        job.run_id = run.id
        session.flush()


def test_the_time_comes_from_the_workers_measured_rate(tmp_path: Path) -> None:
    with open_jobs(tmp_path) as jobs:
        jobs.worker_alive("cpu")
        first = jobs.submit(**TINY).json()
        unmeasured = first["estimate"]["workers"]
        assert [(w["worker"], w["flops_per_s"], w["seconds"]) for w in unmeasured] == [
            ("w1", None, None)]
        assert "no measured rate" in unmeasured[0]["note"]
        assert first["estimate"]["seconds"] is None

        _finished_by(jobs, first["id"], "w1", wall_s=10.0)
        second = jobs.submit(**{**TINY, "n_sequences": 6}).json()["estimate"]
        rate = first["estimate"]["flops"] / 10.0
        timed = second["workers"][0]
        assert timed["flops_per_s"] == pytest.approx(rate, rel=1e-3)
        assert timed["jobs_measured"] == 1
        assert timed["seconds"] == pytest.approx(second["flops"] / rate, rel=1e-3)
        assert second["seconds"] == timed["seconds"]
        assert "on w1" in second["summary"]



def test_a_rate_is_measured_in_the_run_s_dtype_and_never_carried_to_another(
        tmp_path: Path) -> None:
    """A worker's float32 jobs say nothing of its bfloat16 speed (on an AVX2-only CPU bfloat16
    is emulated, tens of times slower; AMX is several times faster): a bfloat16 run on a worker
    that has finished only float32 jobs has no time, and a slow bfloat16 job leaves the float32
    rate as it was."""
    with open_jobs(tmp_path) as jobs:
        jobs.worker_alive("cpu")
        f32 = jobs.submit(**TINY).json()
        _finished_by(jobs, f32["id"], "w1", wall_s=10.0)
        f32_rate = f32["estimate"]["flops"] / 10.0

        bf16 = jobs.submit(**{**TINY, "dtype": "bfloat16"}).json()
        untimed = bf16["estimate"]["workers"][0]
        assert (untimed["flops_per_s"], untimed["seconds"], untimed["jobs_measured"]) == (
            None, None, 0), untimed
        assert "no measured rate in bfloat16" in untimed["note"]
        assert "float32" in untimed["note"]  # the rate it has, and that it does not carry over
        assert bf16["estimate"]["seconds"] is None
        assert any("no worker has a measured rate in bfloat16" in note
                   for note in bf16["estimate"]["notes"])
        assert "time unknown" in bf16["estimate"]["summary"]

        _finished_by(jobs, bf16["id"], "w1", wall_s=400.0)  # 40 times slower: emulated
        again = jobs.submit(**{**TINY, "dtype": "bfloat16", "n_sequences": 4}).json()["estimate"]
        timed = again["workers"][0]
        bf16_rate = bf16["estimate"]["flops"] / 400.0
        assert timed["flops_per_s"] == pytest.approx(bf16_rate, rel=1e-3)
        assert timed["jobs_measured"] == 1
        assert timed["seconds"] == pytest.approx(again["flops"] / bf16_rate, rel=1e-3)
        assert "bfloat16 job" in timed["note"]

        f32_again = jobs.submit(**{**TINY, "n_sequences": 4}).json()["estimate"]["workers"][0]
        assert f32_again["flops_per_s"] == pytest.approx(f32_rate, rel=1e-3)
        assert f32_again["jobs_measured"] == 1


def test_the_rate_is_taken_over_computing_and_loading_is_added_once(tmp_path: Path) -> None:
    """A small job's load can be much of its wall time, which says little of the worker's
    speed. The rate is the jobs' FLOPs over the seconds their runs recorded computing (every
    phase but loading and a tuned lens's training), and a run is timed at that rate plus the
    median of the jobs' other seconds (loading, delivery)."""
    with open_jobs(tmp_path) as jobs:
        jobs.worker_alive("cpu")
        a = jobs.submit(**TINY).json()
        b = jobs.submit(**{**TINY, "n_sequences": 6}).json()
        # a: 12 s of which 3 computing; b: 20.1 s of which 6.5 computing (a lens trained 4 s)
        _finished_with_timings(jobs, a["id"], "w1", 12.0,
                               {"load": 9.0, "clean_pass": 1.0, "intervention": 2.0})
        _finished_with_timings(jobs, b["id"], "w1", 20.1,
                               {"load": 9.5, "lens_training": 4.0, "clean_pass": 2.0,
                                "intervention": 3.0, "logit_lens": 1.5})
        big = jobs.submit(**{**TINY, "n_sequences": 64}).json()["estimate"]
        timed = big["workers"][0]
        rate = (a["estimate"]["flops"] + b["estimate"]["flops"]) / (3.0 + 6.5)
        other = (9.0 + 13.6) / 2  # the median of two
        assert timed["jobs_measured"] == 2
        assert timed["flops_per_s"] == pytest.approx(rate, rel=1e-3)
        assert timed["overhead_s"] == pytest.approx(other, abs=0.05)
        assert timed["seconds"] == pytest.approx(other + big["flops"] / rate, abs=0.1)
        # over wall time the rate would have been a third of this, the big run's time far longer
        by_wall = (a["estimate"]["flops"] + b["estimate"]["flops"]) / 32.1
        assert timed["flops_per_s"] > 3 * by_wall
        assert "computing" in timed["note"]
        assert "11.3 s" in timed["note"]  # the median other seconds, named


def test_a_time_far_beyond_the_jobs_measured_says_it_is_extrapolated(tmp_path: Path) -> None:
    """A rate measured on small jobs is what there is for a first large one, and small models
    compute at a lower FLOP rate: the time for a run more than ten times the largest job
    measured is still given, and the worker's note, its `largest_job_flops` and the one-line
    summary say it is extrapolated, and from how far."""
    with open_jobs(tmp_path) as jobs:
        jobs.worker_alive("cpu")
        first = jobs.submit(**TINY).json()
        _finished_by(jobs, first["id"], "w1", wall_s=10.0)
        measured = first["estimate"]["flops"]

        near = jobs.submit(**{**TINY, "n_sequences": 16}).json()["estimate"]  # 8 times
        assert near["workers"][0]["largest_job_flops"] == pytest.approx(measured, rel=1e-3)
        assert "extrapolated" not in near["workers"][0]["note"]
        assert "extrapolated" not in near["summary"]

        far = jobs.submit(**{**TINY, "n_sequences": 64}).json()["estimate"]  # 32 times
        timed = far["workers"][0]
        assert timed["seconds"] == pytest.approx(far["flops"] / (measured / 10.0), rel=1e-3)
        assert timed["largest_job_flops"] == pytest.approx(measured, rel=1e-3)
        assert "extrapolated" in timed["note"]
        assert "this run is 32 times that" in timed["note"]
        assert "more likely too long than too short" in timed["note"]
        assert "(extrapolated from jobs at most 1/32 of this one)" in far["summary"]


def test_above_the_threshold_a_default_run_waits_to_be_asked(tmp_path: Path) -> None:
    with open_jobs(tmp_path, reconcile=True, auto_run_max_tflop=0.01) as jobs:
        made = jobs.http.post(f"{V1}/models", json={"source": "zoo:tiny-4l-s0"})
        assert made.status_code == 201, made.text
        plan = made.json()["default_run"]
        assert (plan["queued"], plan["job_id"]) == (False, None)
        assert plan["estimate"]["flops"] > 0.01e12
        assert "STRATA_JOBS__AUTO_RUN_MAX_TFLOP" in plan["detail"]
        assert "strata jobs submit --model tiny-4l-s0" in plan["detail"]
        assert "TFLOP" in plan["detail"]
        # reconciliation does not queue it on its own either
        assert jobs.http.post(f"{V1}/jobs/reconcile").status_code in (200, 201)
        listed = jobs.http.get(f"{V1}/jobs", params={"model": "tiny-4l-s0"}).json()
        assert listed["total"] == 0
        # asked for: queued now, as a person's job
        asked = jobs.http.post(f"{V1}/models", json={"source": "zoo:tiny-4l-s1",
                                                     "default_run": True})
        assert asked.status_code == 201, asked.text
        queued = asked.json()["default_run"]
        assert queued["queued"] is True
        job = jobs.job(queued["job_id"])
        assert (job["model"], job["reason"], job["state"]) == ("tiny-4l-s1", "api", "queued")
        assert jobs.broker.sent[-1][0] == queued["job_id"]


def test_within_the_threshold_the_default_run_is_queued_as_before(tmp_path: Path) -> None:
    with open_jobs(tmp_path, reconcile=True) as jobs:
        made = jobs.http.post(f"{V1}/models", json={"source": "zoo:tiny-4l-s0"})
        assert made.status_code == 201, made.text
        plan: dict[str, Any] = made.json()["default_run"]
        assert plan["queued"] is True
        assert "queued by reconciliation" in plan["detail"]

        def reconciled() -> Any:
            found = jobs.http.get(f"{V1}/jobs", params={"model": "tiny-4l-s0"}).json()
            return found["items"] if found["total"] else None

        items = wait_for("the default run's job", reconciled, timeout=60)
        assert items[0]["reason"] == "reconcile"
        # the same registration again says it is queued, with its job
        again = jobs.http.post(f"{V1}/models", json={"source": "zoo:tiny-4l-s0"})
        assert again.status_code == 200
        assert again.json()["default_run"]["job_id"] == items[0]["id"]
