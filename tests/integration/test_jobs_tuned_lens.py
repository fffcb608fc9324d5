"""Jobs that train a tuned lens, end to end with real processes (`strata serve`, a `strata
worker` on the filesystem broker, a DuckDB file, HTTP between them, as in test_jobs.py): a job
with tuned_lens on a zoo model trains its lens with a small budget, stores it in the
deployment's lens folder and its run; a second job with the same training configuration reuses
the stored lens (its run says it did not train, and the file is untouched); a third names the
lens by its key; the tuned_lens rows are served as logit_lens's are (per-layer query, exports)."""

from __future__ import annotations

import csv
import io

import polars as pl
import pytest

from tests.integration.jobs_harness import V1, Deployment, make_broker

pytestmark = pytest.mark.spread

TRAINING = {"steps": 4, "sequences_per_step": 2, "train_sequences": 8}
JOB = {"metrics": ["logit_lens", "tuned_lens"], "n_sequences": 2, "seq_len": 16,
       "tuned_lens": TRAINING}
METRICS = ("kl_to_final", "entropy", "top1_agreement", "loss")


def _run(d: Deployment, body: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """Submit, wait for success; the job and its stored run."""
    submitted = d.submit("tiny-2l-s0", **body)
    assert submitted.status_code == 202, submitted.text
    done = d.wait_state(submitted.json()["id"], "succeeded", "failed", timeout=240)
    assert done["state"] == "succeeded", done["error"]
    run = d.client.get(f"{V1}/runs/{done['run_id']}")
    assert run.status_code == 200, run.text
    return done, dict(run.json())


def _rows(d: Deployment, run_id: object, metric: str, fmt: str = "json") -> pl.DataFrame:
    params = {"metric": metric, "format": fmt, **({"run_id": run_id} if run_id else {})}
    answer = d.client.get(f"{V1}/models/tiny-2l-s0/metrics", params=params)
    assert answer.status_code == 200, answer.text
    if fmt == "parquet":
        return pl.read_parquet(io.BytesIO(answer.content))
    if fmt == "csv":
        return pl.DataFrame(list(csv.DictReader(io.StringIO(answer.text))))
    return pl.DataFrame(answer.json()["rows"])


def test_a_job_trains_a_lens_a_second_reuses_it_and_the_rows_are_served() -> None:
    d = Deployment(make_broker("filesystem"))
    try:
        d.add_model("zoo:tiny-2l-s0")
        d.start_api(workers=1)
        lenses = d.tmp / "state" / "lenses"

        first, run = _run(d, JOB)
        lens = run["tuned_lens"]
        assert isinstance(lens, dict), run
        assert lens["trained"] is True
        assert (lens["steps"], lens["train_sequences"]) == (4, 8)
        assert lens["tokens_per_step"] == 2 * 14
        key = lens["key"]
        path = lenses / f"{key}.safetensors"
        assert [p.name for p in lenses.iterdir()] == [path.name]
        stamp = path.stat().st_mtime_ns
        assert run["config"]["options"]["tuned_lens"]["steps"] == 4  # type: ignore[index]

        # the same training configuration, another run (other families, more sequences):
        # the stored lens is reused, not retrained
        second_job, second = _run(d, {**JOB, "metrics": ["tuned_lens"], "n_sequences": 3})
        assert second_job["config_hash"] != first["config_hash"]
        assert second["tuned_lens"]["key"] == key  # type: ignore[index]
        assert second["tuned_lens"]["trained"] is False  # type: ignore[index]
        assert path.stat().st_mtime_ns == stamp
        assert [p.name for p in lenses.iterdir()] == [path.name]

        # a job naming the stored lens by its key
        _, named = _run(d, {"metrics": ["tuned_lens"], "n_sequences": 2, "seq_len": 16,
                            "tuned_lens": {"lens": key}})
        assert named["tuned_lens"]["key"] == key  # type: ignore[index]
        assert named["tuned_lens"]["trained"] is False  # type: ignore[index]

        # the rows, served like the logit lens's: points 0..L, KL 0 at L, n = sequences
        n_layers = d.client.get(f"{V1}/models/tiny-2l-s0").json()["n_layers"]
        for metric in METRICS:
            tuned = _rows(d, first["run_id"], f"tuned_lens.{metric}").sort("layer")
            raw = _rows(d, first["run_id"], f"logit_lens.{metric}").sort("layer")
            assert tuned["layer"].to_list() == raw["layer"].to_list() == list(
                range(n_layers + 1))
            assert tuned["n"].to_list() == raw["n"].to_list() == [2] * (n_layers + 1)
            assert tuned["unit"].to_list() == raw["unit"].to_list()
            assert tuned["relative_depth"].to_list() == raw["relative_depth"].to_list()
            assert tuned["stderr"].is_not_null().all()
        kl = _rows(d, first["run_id"], "tuned_lens.kl_to_final").sort("layer")
        assert kl["value"][-1] == pytest.approx(0.0, abs=1e-9)
        assert (kl["value"][:-1] >= 0).all()
        # the exports carry the same rows
        for fmt in ("parquet", "csv"):
            exported = _rows(d, first["run_id"], "tuned_lens.kl_to_final", fmt).sort(
                pl.col("layer").cast(pl.Int64))
            assert exported.height == n_layers + 1
            assert [float(v) for v in exported["value"]] == pytest.approx(
                kl["value"].to_list(), abs=1e-12)
        # the model's current tuned_lens rows are the latest run's (the named lens's)
        current = _rows(d, None, "tuned_lens.kl_to_final")
        assert current.height == n_layers + 1
    finally:
        d.close()
