"""POST /api/v1/runs/ingest: a remote worker's results, in Arrow IPC, atomic and idempotent;
refusals store nothing; writes need a key; stage boundaries are inferred at ingest."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pyarrow.compute as pc

from compute.run import result_metadata
from service.exports import FORMATS
from tests.integration.api_server import (
    INGEST_MAX_MB,
    KEY,
    V1,
    Api,
    arrow_body,
    line,
    stagey,
)

ARROW = {"Content-Type": FORMATS["arrow"].media_type}


def post(api: Api, body: bytes, key: str | None = KEY, **params: object) -> object:
    headers = {**ARROW, **({"X-API-Key": key} if key else {})}
    return api.post(f"{V1}/runs/ingest", content=body, headers=headers, params=params)


def count_runs(api: Api) -> int:
    return int(api.get(f"{V1}/runs").json()["total"])


def test_ingest_round_trip_with_tokens_and_stages(server: Api) -> None:
    result = stagey()
    renamed = dataclasses.replace(result, config=result.config.model_copy(update={
        "model": result.config.model.model_copy(update={"name": "stagey-copy"})}))
    renamed = dataclasses.replace(renamed, config_hash=renamed.config.config_hash())
    first = post(server, arrow_body(renamed))
    assert first.status_code == 201, first.text
    summary = first.json()
    assert summary["stage_boundaries"] == 3
    assert summary["replaced"] is False
    assert summary["results"] == renamed.records.num_rows
    again = post(server, arrow_body(renamed))
    assert again.status_code == 200
    assert again.json()["run_id"] == summary["run_id"]
    assert again.json()["replaced"] is True
    stages = server.get(f"{V1}/models/stagey-copy/stages").json()
    assert [b["layer"] for b in stages["models"][0]["boundaries"]] == [1, 3, 4]
    listed = server.get(f"{V1}/runs/{server.runs['rand-3l']}").json()
    computed = server.results["rand-3l"]
    assert listed["n_records"] == computed.records.num_rows
    # where its time went and the peak memory it reached, as the computing process measured
    resources = listed["resources"]
    assert resources["timings_s"] == computed.timings_s
    assert resources["host_peak_rss_mib"] == computed.memory["host_peak_rss_mib"] > 0
    assert resources["host_peak_scope"] == computed.memory["host_peak_scope"] == "run"
    assert resources["device_peak_allocated_mib"] is None
    # delivered again with other figures, the run's are replaced; delivered without them (an
    # older worker), it has none, rather than the earlier delivery's
    memory = {"host_peak_rss_mib": 7, "host_peak_scope": "process",
              "device_peak_allocated_mib": 3}
    measured = dataclasses.replace(renamed, timings_s={"load": 1.5}, memory=memory)
    assert post(server, arrow_body(measured)).status_code == 200
    stored = server.get(f"{V1}/runs/{summary['run_id']}").json()["resources"]
    assert stored == {"timings_s": {"load": 1.5}, **memory}
    bare = dataclasses.replace(renamed, timings_s={}, memory={})
    assert post(server, arrow_body(bare)).status_code == 200
    assert server.get(f"{V1}/runs/{summary['run_id']}").json()["resources"] is None


def test_ingest_carries_per_sequence_means_in_either_order(server: Api) -> None:
    """Records, then per-sequence means and neuron tokens in either order: both side tables
    are recognised by their columns and stored; a run's means twice is refused."""
    computed = server.results["rand-3l"]
    assert computed.sequence_means.num_rows > 0
    renamed = dataclasses.replace(computed, config=computed.config.model_copy(update={
        "model": computed.config.model.model_copy(update={"name": "rand-3l-seq"})}))
    renamed = dataclasses.replace(renamed, config_hash=renamed.config.config_hash())
    records = FORMATS["arrow"].encode(renamed.records, result_metadata(renamed))
    means = FORMATS["arrow"].encode(renamed.sequence_means, None)
    tokens = FORMATS["arrow"].encode(renamed.neuron_tokens, None)
    response = post(server, records + means + tokens)
    assert response.status_code == 201, response.text
    assert response.json()["sequence_means"] == renamed.sequence_means.num_rows
    assert response.json()["neuron_tokens"] == renamed.neuron_tokens.num_rows
    again = post(server, records + tokens + means)
    assert again.status_code == 200, again.text
    assert again.json()["sequence_means"] == renamed.sequence_means.num_rows
    twice = post(server, records + means + means)
    assert twice.status_code == 422
    assert "sequence_means twice" in twice.json()["detail"]


def test_refusals_store_nothing(server: Api) -> None:
    before = count_runs(server)
    good = line(5)
    meta = result_metadata(good)
    bad_values = good.records.set_column(
        good.records.schema.get_field_index("value"), "value",
        pc.multiply(good.records.column("value"), float("nan")))
    cases = {
        "empty": b"",
        "not arrow": b"hello, world" * 10,
        "no metadata": FORMATS["arrow"].encode(good.records, None),
        "metadata not json": _with_meta(good.records, b"{nope"),
        "metadata of another shape": _with_meta(good.records, json.dumps({"x": 1}).encode()),
        "hash of another run": FORMATS["arrow"].encode(good.records,
                                                       {**meta, "config_hash": "0" * 64}),
        "NaN values": FORMATS["arrow"].encode(bad_values, meta),
        "memory not a number": FORMATS["arrow"].encode(
            good.records, {**meta, "memory": {"host_peak_rss_mib": "lots"}}),
        "memory of an unknown scope": FORMATS["arrow"].encode(
            good.records, {**meta, "memory": {"host_peak_rss_mib": 5, "host_peak_scope": "ever"}}),
        "timings not seconds": FORMATS["arrow"].encode(
            good.records, {**meta, "timings_s": {"load": "slow"}}),
        "three streams": arrow_body(good) + FORMATS["arrow"].encode(good.records, None) * 2,
        "tokens of the wrong shape": arrow_body(good) + FORMATS["arrow"].encode(
            pa.table({"x": [1]}), None),
    }
    for what, body in cases.items():
        response = post(server, body)
        assert response.status_code == 422, (what, response.text)
        assert response.json()["error"], what
        assert response.json()["detail"], what
    assert count_runs(server) == before
    assert post(server, arrow_body(good), run_id=999999).status_code == 404
    assert count_runs(server) == before


def _with_meta(table: pa.Table, raw: bytes) -> bytes:
    return FORMATS["arrow"].encode(table.replace_schema_metadata({b"strata": raw}), None)


def test_writes_need_a_key_and_bodies_have_a_limit(server: Api) -> None:
    body = arrow_body(line(5))
    assert post(server, body, key=None).status_code == 401
    assert post(server, body, key="not-it").status_code == 401
    too_big = post(server, b"\0" * (INGEST_MAX_MB * 2**20 + 1))
    assert too_big.status_code == 413
    assert too_big.json()["status"] == 413
    assert too_big.json()["detail"] == (
        f"request body exceeds the {INGEST_MAX_MB} MiB limit (STRATA_API__INGEST_MAX_MB)")
    # any other route: the app's limit, named too (Litestar's own answer named none)
    oversized = server.post(f"{V1}/jobs", content=b"{" + b" " * 2**21 + b"}",
                            headers={"Content-Type": "application/json", "X-API-Key": KEY})
    assert oversized.status_code == 413
    assert oversized.json()["detail"] == "request body exceeds the 1 MiB limit"
    assert server.get(f"{V1}/runs/ingest").status_code in (404, 405)
