"""What a worker delivers: `service.worker.execute.run_job` on a real (tiny) computation, its body
decoded by the API's ingest and stored in a real DuckDB file — the per-sequence means travel with
the records and land in `sequence_means`. The API client is a stand-in that records the calls
(the HTTP path itself is covered by tests/integration/test_jobs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from compute.metrics.base import EngineOptions
from compute.models import ModelSpec, load_model
from compute.run import RunConfig
from compute.tokens import TokenSpec
from service.api.queries.ingest import decode
from service.schemas.jobs import Claimed
from service.schemas.runs import IngestSummary
from service.settings import Settings
from service.store import Store
from service.store import repositories as repo
from service.store.ingest import ingest_result
from service.worker.cache import ModelCache
from service.worker.execute import Identity, run_job
from tests.integration.conftest import TINY_ARCHITECTURE


class RecordingClient:
    """The worker's API client, answering as the API would, keeping what it was sent."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.delivered: list[bytes] = []
        self.failed: list[str] = []

    def claim(self, job_id: int, dispatch: int, worker: str, device: str) -> Claimed:
        return Claimed(config=self.config.model_dump(mode="json"), device=device, attempt=1)

    def heartbeat(self, job_id: int, dispatch: int, worker: str, **progress: Any) -> bool:
        return False

    def deliver(self, job_id: int, body: bytes, deadline_s: float) -> IngestSummary:
        self.delivered.append(body)
        return IngestSummary(job_id, 1, False, 0, 0, 0, 0)

    def fail(self, job_id: int, dispatch: int, worker: str, error: str,
             deadline_s: float) -> None:
        self.failed.append(error)


def test_a_worker_delivers_the_per_sequence_means(tmp_path: Path, store: Store) -> None:
    np.save(tmp_path / "t.npy", np.random.default_rng(3).integers(1, 100, (5, 12)))
    config = RunConfig(
        model=ModelSpec(source="random", name="rand-3l-w", architecture=TINY_ARCHITECTURE,
                        seed=2),
        tokens=TokenSpec(source="npy", path=str(tmp_path / "t.npy"), n_sequences=0, seq_len=0),
        families=("intervention", "logit_lens", "norms"),
        options=EngineOptions(batch_size=2))
    client = RecordingClient(config)
    outcome = run_job(7, 1, settings=Settings(database=tmp_path / "unused.duckdb"),
                      client=client, me=Identity("w1", "cpu"),  # type: ignore[arg-type]
                      cache=ModelCache(1, load_model))
    assert outcome == "succeeded", client.failed
    [body] = client.delivered
    result = decode(body)
    means = pl.DataFrame(result.sequence_means)
    assert sorted(means["sequence"].unique().to_list()) == [0, 1, 2, 3, 4]
    assert {"intervention.swap_minus_drop_kl", "logit_lens.kl_to_final",
            "norms.resid"} <= set(means["metric"])
    summary = ingest_result(store, result)
    assert summary.sequence_means == result.sequence_means.num_rows
    with store.read() as conn:
        stored = repo.sequence_means(conn, summary.run_id, ["logit_lens.kl_to_final"])
        records = repo.rows_of_runs(conn, [summary.run_id], ["logit_lens.kl_to_final"])
    assert stored.height == 5 * 4  # 4 residual points of a 3-layer model, 5 sequences
    assert (records["n"] == 5).all()
    per_point = stored.group_by("layer").agg(pl.col("value").mean()).sort("layer")
    assert np.allclose(per_point["value"].to_numpy(), records.sort("layer")["value"].to_numpy(),
                       rtol=1e-9, atol=1e-12)
