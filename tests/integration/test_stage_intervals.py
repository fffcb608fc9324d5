"""Stage boundaries stored at ingest carry their bootstrap interval over sequences, sharpness and
clear flag, and the stages answer serves them (a real DuckDB file, the in-process app)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from litestar.testing import TestClient

from compute.metrics.base import SEQUENCE_MEANS_SCHEMA
from compute.records import Record
from compute.run import RunResult
from service.api.app import create_app
from service.settings import Settings
from service.store import Store
from service.store.ingest import ingest_result
from service.store.migrate import upgrade
from tests.integration.api_server import KEY, synthetic

N_SEQ, L = 12, 6


def staged_run(name: str, knees: list[int]) -> RunResult:
    """Per-sequence means: drop KL catastrophic at layer 0; lens KL a plateau through each
    sequence's knee (cycling through `knees`), then halving per point; suppression neurons
    outnumber prediction neurons in layers 4 and 5."""
    rng = np.random.default_rng(0)
    drop = np.where(np.arange(L) == 0, 5.0, 0.3) * rng.lognormal(0, 0.05, (N_SEQ, L))
    points = np.arange(L + 1)
    lens = np.array([np.where(points <= knees[s % len(knees)], 9.0,
                              9.0 * 0.4 ** (points - knees[s % len(knees)]))
                     for s in range(N_SEQ)]) * rng.lognormal(0, 0.05, (N_SEQ, L + 1))
    lens[:, -1] = 0.0
    rows: dict[str, list[object]] = {c: [] for c in SEQUENCE_MEANS_SCHEMA.names}
    records: list[Record] = []
    for metric, component, values in (("intervention.kl", "drop", drop),
                                      ("logit_lens.kl_to_final", None, lens)):
        for layer in range(values.shape[1]):
            column = values[:, layer]
            records.append(Record.of(metric, float(column.mean()), N_SEQ, layer=layer,
                                     component=component,
                                     stderr=float(column.std(ddof=1) / np.sqrt(N_SEQ))))
            for s, v in enumerate(column):
                for key, value in (("metric", metric), ("layer", layer),
                                   ("component", component), ("head", None), ("sequence", s),
                                   ("value", float(v))):
                    rows[key].append(value)
    pred, supp = [2, 2, 2, 1, 0, 0], [0, 0, 0, 0, 4, 6]
    for i in range(L):
        records += [Record.of("neurons.n_prediction", pred[i], 8, layer=i),
                    Record.of("neurons.n_suppression", supp[i], 8, layer=i),
                    Record.of("neurons.n_partition", 0, 8, layer=i),
                    Record.of("neurons.frac_prediction", pred[i] / 8, 8, layer=i),
                    Record.of("neurons.frac_suppression", supp[i] / 8, 8, layer=i),
                    Record.of("neurons.frac_partition", 0.0, 8, layer=i)]
    result = synthetic(name, L, records, ("intervention", "logit_lens", "neurons"))
    return dataclasses.replace(result, sequence_means=pa.table(
        rows, schema=SEQUENCE_MEANS_SCHEMA))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    db = tmp_path / "strata.duckdb"
    store = Store.open(db, threads=1)
    upgrade(store)
    ingest_result(store, staged_run("sharp", [3]))
    ingest_result(store, staged_run("spread", [2, 3, 4]))
    old = staged_run("old", [3])
    ingest_result(store, dataclasses.replace(
        old, sequence_means=SEQUENCE_MEANS_SCHEMA.empty_table()))
    settings = Settings(database=db, api_keys=KEY)
    with TestClient(create_app(settings, store)) as test_client:
        yield test_client
    store.close()


def test_stored_boundaries_carry_intervals_sharpness_and_clear(
        client: TestClient[Any]) -> None:
    body = client.get("/api/v1/stages", params={"models": "sharp,spread,old"}).json()
    models = {m["name"]: m for m in body["models"]}
    sharp = models["sharp"]["boundaries"]
    assert [(b["boundary"], b["clear"], b["layer"]) for b in sharp] == [
        (1, True, 1), (2, True, 3), (3, True, 4)]
    for b in sharp:
        assert b["clear"] == b["found"]
        assert b["estimate"] == b["layer"]
        assert b["sharpness"] > 0
        assert b["interval"] is not None
        assert b["interval"][0] <= b["layer"] <= b["interval"][1]
        assert b["interval_level"] == pytest.approx(0.9)
        assert b["interval_relative_depth"] == pytest.approx([v / (L - 1) for v in b["interval"]])
        assert b["evidence"]["bootstrap"]["n_sequences"] == N_SEQ
        assert b["range"][0] <= b["layer"] <= b["range"][1]
    assert sharp[1]["interval"] == [3, 3]  # every sequence has its knee at point 3
    spread = models["spread"]["boundaries"][1]
    assert spread["interval"][0] <= 2
    assert spread["interval"][1] >= 3
    old = models["old"]["boundaries"]
    assert [b["layer"] for b in old] == [1, 3, 4]
    for b in old:
        assert b["interval"] is None
        assert b["interval_level"] is None
        assert "no per-sequence means" in b["evidence"]["bootstrap"]["reason"]
