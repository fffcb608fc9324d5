"""Job system benchmark: what a job costs on top of the computation itself.

    .venv/bin/python benchmarks/jobs.py             # filesystem and Redis, ~6 min on 2 cores
    .venv/bin/python benchmarks/jobs.py --quick     # smaller: a smoke run

For each broker (Celery's filesystem transport; a Redis server started for the benchmark), a
real deployment in a temporary folder — `strata serve --no-local-worker`, one `strata worker
--device cpu`, default settings — and, in this process:

1. trivial job (tiny-2l-s0, intervention, 2 × 16 tokens) and a ~60 s job (tiny-4l-s0, every
   family, --long-sequences × 128 tokens): the end-to-end time from `POST /api/v1/jobs` to its
   results being queryable over HTTP (the job `succeeded`, then one metric read back), against
   `compute_run` on the same model and tokens called directly in this process (model load
   included, torch already imported: the fairest direct run). Each end-to-end job is the
   model's first in the worker, so it loads the model too. Then a second trivial job, warm:
   the worker keeps the model (its LRU), and the direct run gets it preloaded.
2. throughput: 50 small jobs (distinct configurations: n_sequences 1..50) submitted at once,
   through the one worker: jobs/s, and that each ran exactly once (attempts 1, 50 distinct
   runs, none lost).

Targets: overhead < 2 s on the trivial job, < 10 % on the 60 s job; no job lost or run twice.
Prints a JSON summary as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.jobs_harness import V1, Deployment, make_broker  # noqa: E402
from tests.serving import wait_for  # noqa: E402

# What users run: the shipped defaults for heartbeats, leases and upkeep.
DEFAULTS = {"STRATA_WORKER__HEARTBEAT_S": "5", "STRATA_JOBS__LEASE_S": "30",
            "STRATA_JOBS__MAINTENANCE_INTERVAL_S": "2", "OMP_NUM_THREADS": ""}


def direct(model: str, families: list[str], n_sequences: int, seq_len: int, *,
           warm: bool = False) -> float:
    """`compute_run` in this process; `warm`: the model is loaded beforehand (as a worker
    that ran a job on it keeps it), and not timed."""
    from compute.models import load_model, resolve_model_spec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    config = RunConfig(model=resolve_model_spec(f"zoo:{model}"), families=tuple(families),
                       tokens=TokenSpec(source="builtin", n_sequences=n_sequences,
                                        seq_len=seq_len))
    lm = load_model(config.model) if warm else None
    start = time.perf_counter()
    compute_run(config, lm=lm)
    return time.perf_counter() - start


def end_to_end(d: Deployment, model: str, families: list[str], n_sequences: int,
               seq_len: int, poll_s: float = 0.05) -> tuple[float, dict[str, Any]]:
    """Submit, then ask for the job every `poll_s` until it succeeded and read a metric back.
    Polling is not free (each answer reads the database on a machine that also computes): the
    long job is polled as a person or a dashboard would, every 0.5 s."""
    start = time.perf_counter()
    answer = d.submit(model, metrics=families, n_sequences=n_sequences, seq_len=seq_len)
    if answer.status_code != 202:
        raise RuntimeError(answer.text)
    job_id = answer.json()["id"]

    def stored() -> dict[str, Any] | None:
        job = d.job(job_id)
        if job["state"] in ("failed", "cancelled"):
            raise RuntimeError(f"job {job_id} ended {job['state']}: {job['error']}")
        return job if job["state"] == "succeeded" else None

    job = wait_for(f"job {job_id}", stored, timeout=1800, every=poll_s)
    rows = d.client.get(f"{V1}/models/{model}/metrics",
                        params={"metric": "intervention.kl", "run_id": job["run_id"]})
    if rows.status_code != 200 or not rows.json()["rows"]:
        raise RuntimeError(f"job {job_id} succeeded but its results are not served: {rows.text}")
    return time.perf_counter() - start, job


def throughput(d: Deployment, n_jobs: int) -> dict[str, Any]:
    start = time.perf_counter()
    ids = []
    for i in range(n_jobs):
        answer = d.submit("tiny-2l-s0", metrics=["intervention"], n_sequences=i + 1,
                          seq_len=24)
        if answer.status_code != 202:
            raise RuntimeError(answer.text)
        ids.append(answer.json()["id"])

    def all_done() -> list[dict[str, Any]] | None:
        page = d.client.get(f"{V1}/jobs", params={"limit": 500}).json()["items"]
        mine = [j for j in page if j["id"] in ids]
        return mine if all(j["state"] in ("succeeded", "failed") for j in mine) else None

    jobs = wait_for("the queued jobs", all_done, timeout=3600, every=0.5)
    wall = time.perf_counter() - start
    runs = {j["run_id"] for j in jobs}
    return {"jobs": n_jobs, "wall_s": round(wall, 2), "jobs_per_s": round(n_jobs / wall, 2),
            "succeeded": sum(j["state"] == "succeeded" for j in jobs),
            "ran_more_than_once": sum(j["attempts"] != 1 for j in jobs),
            "distinct_runs": len(runs - {None})}


def bench(kind: str, long_sequences: int, n_jobs: int) -> dict[str, Any]:
    d = Deployment(make_broker(kind), env_extra=DEFAULTS)
    try:
        d.start_api()
        d.start_worker()
        for model in ("zoo:tiny-2l-s0", "zoo:tiny-4l-s0"):
            d.register(model)
        out: dict[str, Any] = {"broker": kind}
        trivial = (["intervention"], 2, 16)
        e2e, job = end_to_end(d, "tiny-2l-s0", *trivial)
        base = direct("tiny-2l-s0", *trivial)
        out["trivial"] = {"end_to_end_s": round(e2e, 2), "direct_s": round(base, 2),
                          "overhead_s": round(e2e - base, 2), "worker_wall_s": job["wall_s"]}
        warm = (["intervention"], 3, 16)  # the worker has the model loaded now
        e2e, job = end_to_end(d, "tiny-2l-s0", *warm)
        base = direct("tiny-2l-s0", *warm, warm=True)
        out["trivial_warm"] = {"end_to_end_s": round(e2e, 2), "direct_s": round(base, 2),
                               "overhead_s": round(e2e - base, 2),
                               "worker_wall_s": job["wall_s"]}
        families = ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms",
                    "heads"]
        e2e, job = end_to_end(d, "tiny-4l-s0", families, long_sequences, 128, poll_s=0.5)
        base = direct("tiny-4l-s0", families, long_sequences, 128)
        out["long"] = {"end_to_end_s": round(e2e, 2), "direct_s": round(base, 2),
                       "overhead_pct": round(100 * (e2e - base) / base, 1),
                       "worker_wall_s": job["wall_s"], "n_sequences": long_sequences}
        out["throughput"] = throughput(d, n_jobs)
        return out
    finally:
        d.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--long-sequences", type=int, default=None,
                        help="sequences of the long job (default 160: ~60 s here)")
    parser.add_argument("--brokers", default="filesystem,redis")
    args = parser.parse_args()
    long_sequences = args.long_sequences or (16 if args.quick else 160)
    n_jobs = 10 if args.quick else 50
    results = []
    for kind in args.brokers.split(","):
        result = bench(kind, long_sequences, n_jobs)
        print(json.dumps(result), flush=True)
        results.append(result)
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
