"""Data endpoints over real HTTP: the numbers are the computed ones, in every format, with the
same columns; runs are chosen as documented; ETag, Cache-Control, gzip and CORS."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import polars as pl
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from service.schemas.families import StabilityRow
from service.schemas.neurons import NeuronCountRow, NeuronRow
from service.schemas.results import CompareRow, HeadRow, MetricRow, SequenceRow, columns
from service.schemas.stages import StageRow
from tests.integration.api_server import CORS_ORIGIN, V1, Api


def records(api: Api, name: str) -> pl.DataFrame:
    return pl.DataFrame(api.results[name].records)


def rows(response: Any) -> pl.DataFrame:
    assert response.status_code == 200, response.text
    return pl.DataFrame(response.json()["rows"])


# --------------------------------------------------------------------------- per model


def test_metric_rows_are_the_computed_records(server: Api) -> None:
    got = server.get(f"{V1}/models/rand-3l/metrics",
                     params={"metric": "intervention.kl", "component": "drop", "model_id":
                             _model_id(server, "rand-3l", fold_ln=True)})
    body = got.json()
    assert body["run"]["id"] == server.runs["rand-3l"]
    assert list(body["rows"][0]) == list(columns(MetricRow))
    expected = records(server, "rand-3l").filter(pl.col("metric") == "intervention.kl",
                                                  pl.col("component") == "drop").sort("layer")
    table = rows(got)
    assert table["layer"].to_list() == expected["layer"].to_list() == [0, 1, 2]
    assert table["value"].to_list() == pytest.approx(expected["value"].to_list())
    assert table["stderr"].to_list() == pytest.approx(expected["stderr"].to_list())
    assert table["n"].to_list() == expected["n"].to_list()
    assert table["relative_depth"].to_list() == pytest.approx([0, 0.5, 1])
    assert set(table["unit"]) == {"nats"}


def test_per_sequence_means_are_the_samples_behind_value_and_stderr(server: Api) -> None:
    """Recomputed here from the per-sequence rows: each layer's value is their mean, its
    stderr their std (ddof 1) / sqrt(n), n their number — the definition in docs/metrics.md."""
    model_id = _model_id(server, "rand-3l", fold_ln=True)
    for metric, component in (("intervention.kl", "drop"), ("logit_lens.kl_to_final", None),
                              ("attention.entropy", None)):
        params = {"metric": metric, "model_id": model_id,
                  **({"component": component} if component else {})}
        got = server.get(f"{V1}/models/rand-3l/sequences", params=params)
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["run"]["id"] == server.runs["rand-3l"]
        assert list(body["rows"][0]) == list(columns(SequenceRow))
        samples = pl.DataFrame(body["rows"]).filter(pl.col("head").is_null())
        assert set(samples["unit"]) == {rows(server.get(f"{V1}/models/rand-3l/metrics",
                                                        params=params))["unit"][0]}
        per_layer = rows(server.get(f"{V1}/models/rand-3l/metrics", params=params))
        for row in per_layer.iter_rows(named=True):
            values = samples.filter(pl.col("layer") == row["layer"],
                                    pl.col("component").eq_missing(row["component"]))["value"].to_numpy()
            assert len(values) == row["n"] == 6, (metric, row)
            assert float(np.mean(values)) == pytest.approx(row["value"], rel=1e-6, abs=1e-9)
            assert float(np.std(values, ddof=1) / np.sqrt(len(values))) == pytest.approx(
                row["stderr"], rel=1e-6, abs=1e-9)
    # the same rows as a table, and refusals that say what to fix
    csv = server.get(f"{V1}/models/rand-3l/sequences",
                     params={"metric": "intervention.kl", "model_id": model_id, "format": "csv"})
    assert csv.status_code == 200
    table = pl.read_csv(io.BytesIO(csv.content))
    assert table.columns == list(columns(SequenceRow))
    assert table.height == len(server.get(f"{V1}/models/rand-3l/sequences", params={
        "metric": "intervention.kl", "model_id": model_id}).json()["rows"])
    old = server.get(f"{V1}/models/rand-3l/sequences",
                     params={"metric": "intervention.kl", "run_id": server.runs["rand-3l-v0"],
                             "model_id": model_id})
    assert old.status_code == 422, old.text
    assert "no per-sequence means" in old.json()["detail"]
    neuron = server.get(f"{V1}/models/rand-3l/sequences", params={"metric": "neurons.vocab_kurt"})
    assert neuron.status_code == 422
    assert "per neuron" in neuron.json()["detail"]
    assert server.get(f"{V1}/models/rand-3l/sequences",
                      params={"metric": "vibes"}).status_code == 422


def _model_id(api: Api, name: str, *, fold_ln: bool) -> int:
    models = api.get(f"{V1}/models", params={"name": name}).json()["items"]
    return next(m["id"] for m in models if m["spec"]["processing"]["fold_ln"] == fold_ln)


def test_a_name_registered_twice_means_the_latest_unless_model_id(server: Api) -> None:
    latest = server.get(f"{V1}/models/rand-3l").json()
    first = _model_id(server, "rand-3l", fold_ln=True)
    assert latest["spec"]["processing"]["fold_ln"] is False
    assert latest["same_name_ids"] == [first]
    chosen = server.get(f"{V1}/models/rand-3l", params={"model_id": first}).json()
    assert chosen["id"] == first
    by_id = server.get(f"{V1}/models/{first}").json()
    assert by_id["id"] == first
    lens = server.get(f"{V1}/models/rand-3l/metrics", params={"metric": "logit_lens.entropy"})
    assert lens.json()["run"]["id"] == server.runs["rand-3l-raw"]
    wrong = server.get(f"{V1}/models/tiny-2l-s0", params={"model_id": first})
    assert wrong.status_code == 404
    assert "no model 'tiny-2l-s0' with id" in wrong.json()["detail"]


def test_layer_range_run_and_version_selection(server: Api) -> None:
    first = _model_id(server, "rand-3l", fold_ln=True)
    base = {"metric": "logit_lens.kl_to_final", "model_id": first}
    ranged = rows(server.get(f"{V1}/models/rand-3l/metrics",
                             params={**base, "layer_min": 1, "layer_max": 2}))
    assert ranged["layer"].to_list() == [1, 2]
    old = server.get(f"{V1}/models/rand-3l/metrics", params={**base, "metric_version": "0"})
    assert old.json()["run"]["id"] == server.runs["rand-3l-v0"]
    assert old.json()["run"]["metric_version"] == "0"
    pinned = server.get(f"{V1}/models/rand-3l/metrics",
                        params={**base, "run_id": server.runs["rand-3l-v0"]})
    assert pinned.json()["run"]["id"] == server.runs["rand-3l-v0"]
    assert pinned.headers["cache-control"] == "public, max-age=300"
    other = server.get(f"{V1}/models/rand-3l/metrics",
                       params={**base, "run_id": server.runs["stagey"]})
    assert other.status_code == 404
    none_yet = server.get(f"{V1}/models/line-12/metrics", params={"metric": "logit_lens.loss"})
    assert none_yet.status_code == 404
    assert "no succeeded run with logit_lens.loss" in none_yet.json()["detail"]
    every = rows(server.get(f"{V1}/models/tiny-2l-s0/metrics",
                            params={"metric": "intervention.kl"}))
    assert set(every["component"]) == {"drop", "swap", "drop_attn", "drop_mlp", "none"}
    assert every.filter(pl.col("component") == "none")["layer"].to_list() == [None]


def test_every_format_has_the_same_columns_and_values(server: Api) -> None:
    url = f"{V1}/models/tiny-2l-s0/metrics"
    params = {"metric": "intervention.kl", "component": "drop"}
    as_json = rows(server.get(url, params=params))
    csv = server.get(url, params={**params, "format": "csv"})
    assert csv.headers["content-type"].startswith("text/csv")
    parquet = server.get(url, params=params, headers={"Accept": "application/vnd.apache.parquet"})
    assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
    arrow = server.get(url, params=params,
                       headers={"Accept": "text/html;q=0.9, application/vnd.apache.arrow.stream"})
    assert arrow.headers["content-type"] == "application/vnd.apache.arrow.stream"
    frames = {"csv": pl.read_csv(io.BytesIO(csv.content)),
              "parquet": pl.from_arrow(pq.read_table(io.BytesIO(parquet.content))),
              "arrow": pl.from_arrow(ipc.open_stream(io.BytesIO(arrow.content)).read_all())}
    for name, frame in frames.items():
        assert frame.columns == as_json.columns == list(columns(MetricRow)), name
        assert frame["value"].to_list() == pytest.approx(as_json["value"].to_list()), name
        assert frame["layer"].to_list() == as_json["layer"].to_list(), name
    meta = json.loads(pq.read_table(io.BytesIO(parquet.content)).schema.metadata[b"strata"])
    assert meta["run"]["id"] == server.runs["tiny-2l-s0"]
    assert "rows" not in meta
    refused = server.get(url, params=params, headers={"Accept": "image/png"})
    assert refused.status_code == 406
    assert refused.json()["status"] == 406
    assert server.get(url, params={**params, "format": "xlsx"}).status_code == 400


def test_etag_answers_304_and_changes_with_a_new_run(server: Api) -> None:
    url = f"{V1}/models/line-12/metrics"
    params = {"metric": "intervention.kl", "component": "drop"}
    first = server.get(url, params=params)
    tag = first.headers["etag"]
    assert first.headers["cache-control"] == "public, no-cache"
    again = server.get(url, params=params, headers={"If-None-Match": tag})
    assert again.status_code == 304
    assert again.content == b""
    csv = server.get(url, params={**params, "format": "csv"}, headers={"If-None-Match": tag})
    assert csv.status_code == 200  # another representation, another tag
    response = server.ingest(server.results["line-12"])  # the same run, delivered again
    assert response.status_code == 200
    assert response.json()["replaced"] is True
    after = server.get(url, params=params, headers={"If-None-Match": tag})
    assert after.status_code == 200
    assert after.headers["etag"] != tag


def test_gzip_and_cors(server: Api) -> None:
    big = server.get(f"{V1}/models/rand-3l/heads", params={"metric": "heads.induction"},
                     headers={"Accept-Encoding": "gzip"})
    assert big.headers.get("content-encoding") == "gzip"
    assert len(big.json()["rows"]) == 12
    preflight = server.client.options(f"{V1}/models", headers={
        "Origin": CORS_ORIGIN, "Access-Control-Request-Method": "GET"})
    assert preflight.headers.get("access-control-allow-origin") == CORS_ORIGIN
    elsewhere = server.get(f"{V1}/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in elsewhere.headers


def test_heads(server: Api) -> None:
    got = server.get(f"{V1}/models/tiny-2l-s0/heads",
                     params={"metric": "heads.ablation_kl", "layer_min": 1})
    table = rows(got)
    assert table.columns == list(columns(HeadRow))
    expected = records(server, "tiny-2l-s0").filter(
        pl.col("metric") == "heads.ablation_kl", pl.col("layer") == 1).sort("head")
    assert table["head"].to_list() == expected["head"].to_list()
    assert table["value"].to_list() == pytest.approx(expected["value"].to_list())
    assert server.get(f"{V1}/models/tiny-2l-s0/heads",
                      params={"metric": "intervention.kl"}).status_code == 422
    # the head screen is per head too, beside the exact numbers it estimates
    screen = rows(server.get(f"{V1}/models/tiny-2l-s0/heads",
                             params={"metric": "heads_atp.loss_delta"}))
    stored = records(server, "tiny-2l-s0").filter(pl.col("metric") == "heads_atp.loss_delta")
    assert len(screen) == len(stored) == 2 * 4  # 2 layers x 4 heads
    assert sorted(screen["value"].to_list()) == pytest.approx(sorted(stored["value"].to_list()))


def test_neurons_top_k_with_tokens_and_counts(server: Api) -> None:
    first = _model_id(server, "rand-3l", fold_ln=True)
    got = server.get(f"{V1}/models/rand-3l/neurons",
                     params={"class": "partition", "top": 3, "layer": 2, "model_id": first})
    table = rows(got)
    assert table.columns == list(columns(NeuronRow))
    moments = records(server, "rand-3l").filter(pl.col("metric") == "neurons.vocab_var",
                                                 pl.col("layer") == 2)
    expected = moments.filter(pl.col("value") > 0.005).sort(
        ["value", "neuron"], descending=[True, False]).head(3)
    assert table["neuron"].to_list() == expected["neuron"].to_list()
    assert table["vocab_var"].to_list() == pytest.approx(expected["value"].to_list())
    tokens = pl.DataFrame(server.results["rand-3l"].neuron_tokens).filter(
        pl.col("layer") == 2, pl.col("neuron") == table["neuron"][0],
        pl.col("neuron_class") == "partition", pl.col("direction") == "promoted").sort("rank")
    assert table["promoted_ids"][0].to_list() == tokens["token_id"].to_list()
    csv = server.get(f"{V1}/models/rand-3l/neurons",
                     params={"class": "partition", "top": 3, "layer": 2, "model_id": first,
                             "format": "csv"})
    from_csv = pl.read_csv(io.BytesIO(csv.content))
    assert json.loads(from_csv["promoted_ids"][0]) == tokens["token_id"].to_list()
    counts = rows(server.get(f"{V1}/models/stagey/neurons/counts"))
    assert counts.columns == list(columns(NeuronCountRow))
    assert counts["n_suppression"].to_list() == [0, 0, 0, 1, 4, 6]
    assert counts["frac_prediction"][0] == pytest.approx(5 / 8)
    assert server.get(f"{V1}/models/rand-3l/neurons",
                      params={"class": "other"}).status_code == 400


# --------------------------------------------------------------------------- across models


def test_compare_lines_up_models_of_different_depth(server: Api) -> None:
    centres = (np.arange(20) + 0.5) / 20
    for method in ("interpolate", "mean"):
        got = server.get(f"{V1}/compare", params={
            "metric": "intervention.kl", "component": "drop", "models": "line-12,line-24",
            "bins": 20, "method": method})
        table = rows(got)
        assert table.columns == list(columns(CompareRow))
        assert table.group_by("model").len().sort("model").rows() == [("line-12", 20),
                                                                       ("line-24", 20)]
        for name, n_layers in (("line-12", 12), ("line-24", 24)):
            mine = table.filter(pl.col("model") == name).sort("bin")
            depth = np.arange(n_layers) / (n_layers - 1)
            if method == "interpolate":
                assert mine["value"].to_list() == pytest.approx(2 * centres)
                assert mine["stderr"].to_list() == pytest.approx([0.1] * 20)
            else:  # the mean of the layers in each bin; empty bins have no value
                index = np.minimum((depth * 20).astype(int), 19)
                for b in range(20):
                    inside = depth[index == b]
                    value = mine["value"][b]
                    if inside.size == 0:
                        assert value is None
                        assert mine["n_points"][b] == 0
                    else:
                        assert value == pytest.approx(2 * inside.mean())
                        assert mine["stderr"][b] == pytest.approx(0.1 / np.sqrt(inside.size))
                        assert mine["n_points"][b] == inside.size
        assert {m["name"]: m["n_points"] for m in got.json()["models"]} == {"line-12": 12,
                                                                            "line-24": 24}


def _per_sequence(api: Api, name: str, metric: str, component: str | None) -> np.ndarray:
    """[layers, sequences] per-sequence means of one computed run, from its RunResult."""
    frame = pl.DataFrame(api.results[name].sequence_means).filter(
        (pl.col("metric") == metric) & pl.col("head").is_null())
    if component is not None:
        frame = frame.filter(pl.col("component") == component)
    wide = frame.pivot(on="sequence", index="layer", values="value").sort("layer")
    return wide.drop("layer").to_numpy()


@pytest.mark.parametrize("method", ["interpolate", "mean"])
def test_compare_errors_are_over_sequences(server: Api, method: str) -> None:
    """A bin's stderr is the std over sequences of the bin's value computed sequence by
    sequence (np.interp at the centre, or the mean of the bin's layers), / sqrt(sequences);
    n is the number of sequences. Models: the zoo run (3 sequences, 2 layers) and rand-3l
    (its latest registration, 6 sequences, 3 layers)."""
    bins = 5
    got = server.get(f"{V1}/compare", params={
        "metric": "intervention.kl", "component": "drop", "models": "tiny-2l-s0,rand-3l",
        "bins": bins, "method": method})
    body = got.json()
    assert {m["name"]: m["stderr_basis"] for m in body["models"]} == {
        "tiny-2l-s0": "sequence", "rand-3l": "sequence"}
    table = rows(got)
    centres = (np.arange(bins) + 0.5) / bins
    for name, result in (("tiny-2l-s0", "tiny-2l-s0"), ("rand-3l", "rand-3l-raw")):
        m = _per_sequence(server, result, "intervention.kl", "drop")
        n_layers, n_seq = m.shape
        depth = np.arange(n_layers) / (n_layers - 1)
        mine = table.filter(pl.col("model") == name).sort("bin")
        for b in range(bins):
            if method == "interpolate":
                x = np.array([np.interp(centres[b], depth, m[:, s]) for s in range(n_seq)])
            else:
                inside = np.minimum((depth * bins).astype(int), bins - 1) == b
                if not inside.any():
                    assert mine["value"][b] is None
                    continue
                x = m[inside].mean(axis=0)
            assert mine["value"][b] == pytest.approx(x.mean(), rel=1e-6)
            assert mine["stderr"][b] == pytest.approx(np.std(x, ddof=1) / np.sqrt(n_seq),
                                                      rel=1e-6)
            assert mine["n"][b] == n_seq


def test_runs_say_what_their_errors_count(server: Api) -> None:
    """stderr_basis: "sequence" for runs of metric version 2, "token" for older ones, on runs,
    per-layer answers and their exports."""
    assert server.get(f"{V1}/runs/{server.runs['rand-3l']}").json()["stderr_basis"] == \
        "sequence"
    assert server.get(f"{V1}/runs/{server.runs['rand-3l-v0']}").json()["stderr_basis"] == \
        "token"
    params = {"metric": "intervention.kl", "component": "drop"}
    current = server.get(f"{V1}/models/tiny-2l-s0/metrics", params=params).json()
    assert current["run"]["stderr_basis"] == "sequence"
    assert (pl.DataFrame(current["rows"])["n"] == 3).all()  # 3 sequences of 12 tokens
    old = server.get(f"{V1}/models/rand-3l/metrics",
                     params={**params, "metric_version": "0",
                             "model_id": _model_id(server, "rand-3l", fold_ln=True)}).json()
    assert old["run"]["stderr_basis"] == "token"
    parquet = server.get(f"{V1}/models/tiny-2l-s0/metrics", params={**params,
                                                                     "format": "parquet"})
    meta = json.loads(pq.read_schema(io.BytesIO(parquet.content)).metadata[b"strata"])
    assert meta["run"]["stderr_basis"] == "sequence"


def test_compare_real_models_and_errors(server: Api) -> None:
    got = server.get(f"{V1}/compare", params={"metric": "logit_lens.kl_to_final", "bins": 4,
                                               "models": "tiny-2l-s0,stagey,line-12"})
    body = got.json()
    assert [m["name"] for m in body["models"]] == ["tiny-2l-s0", "stagey", "line-12"]
    assert body["models"][2]["run_id"] is None  # line-12 has no logit-lens run
    table = rows(got)
    assert set(table["model"]) == {"tiny-2l-s0", "stagey"}
    lens = records(server, "tiny-2l-s0").filter(pl.col("metric") == "logit_lens.kl_to_final")
    curve = lens.sort("layer")
    expected = np.interp((np.arange(4) + 0.5) / 4, curve["layer"].to_numpy() / 2,
                         curve["value"].to_numpy())
    mine = table.filter(pl.col("model") == "tiny-2l-s0").sort("bin")
    assert mine["value"].to_list() == pytest.approx(expected.tolist())
    ambiguous = server.get(f"{V1}/compare", params={"metric": "intervention.kl",
                                                     "models": "tiny-2l-s0"})
    assert ambiguous.status_code == 422
    assert "component" in ambiguous.json()["detail"]
    unknown = server.get(f"{V1}/compare", params={"metric": "intervention.kl",
                                                   "models": "tiny-2l-s0,gtp2"})
    assert unknown.status_code == 404
    assert "gtp2" in unknown.json()["detail"]
    assert server.get(f"{V1}/compare", params={"metric": "intervention.kl", "models": ",",
                                                "component": "drop"}).status_code == 422
    assert server.get(f"{V1}/compare", params={"metric": "intervention.kl", "models": "stagey",
                                                "bins": 1}).status_code == 400


def test_stages_with_evidence_and_per_stage_aggregates(server: Api) -> None:
    got = server.get(f"{V1}/models/stagey/stages",
                     params={"metric": "intervention.kl", "component": "drop"})
    body = got.json()
    [model] = body["models"]
    assert [(b["boundary"], b["found"], b["layer"]) for b in model["boundaries"]] == [
        (1, True, 1), (2, True, 3), (3, True, 4)]
    assert model["boundaries"][0]["evidence"]["layer_0_kl"] == pytest.approx(5.0)
    assert model["boundaries"][1]["ends_stage"] == "feature_engineering"
    table = rows(got)
    assert table.columns == list(columns(StageRow))
    spans = [(r["stage"], r["layer_start"], r["layer_end"]) for r in table.iter_rows(named=True)]
    assert spans == [(1, 0, 0), (2, 1, 2), (3, 3, 3), (4, 4, 5)]
    drop = [5.0, 0.5, 0.3, 0.2, 0.25, 0.3]
    se = [0.01 * (i + 1) for i in range(6)]
    assert table["value"].to_list() == pytest.approx(
        [5.0, (0.5 + 0.3) / 2, 0.2, (0.25 + 0.3) / 2])
    assert table["stderr"][1] == pytest.approx(np.hypot(se[1], se[2]) / 2)
    assert table["layer_std"][1] == pytest.approx(np.std(drop[1:3], ddof=1))
    assert table["n_points"].to_list() == [1, 2, 1, 2]
    both = server.get(f"{V1}/stages", params={"models": "stagey,rand-3l",
                                               "metric": "logit_lens.kl_to_final"})
    table = rows(both)
    lens = table.filter(pl.col("model") == "stagey").sort("stage")
    # point i counts for block max(i-1, 0): stage 1 = points 0, 1; stage 4 = points 5, 6
    assert lens["value"].to_list() == pytest.approx([9.9, 9.25, 3.0, 0.5])
    unclear = table.filter(pl.col("model") == "rand-3l")
    assert unclear.height == 4
    assert (~unclear["clear"] | unclear["value"].is_not_null()).all()
    assert server.get(f"{V1}/models/line-12/stages").json()["models"][0]["boundaries"] == []


def test_stability_against_ablation_importance_per_layer(server: Api) -> None:
    """Claim (3)'s query: per layer, the correlation over heads between a head's stability
    (the family's per-head rows) and its ablation importance on the anchor (its heads run),
    checked against scipy on the two answers it joins."""
    import scipy.stats

    from compute.metrics.base import EngineOptions
    from compute.models import resolve_model_spec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    url = f"{V1}/families/tiny-4l/stability-importance"
    missing = server.get(url)
    assert missing.status_code == 404
    assert "no heads run" in missing.json()["detail"]
    config = RunConfig(model=resolve_model_spec("zoo:tiny-4l-s0"),
                       tokens=TokenSpec(source="builtin", n_sequences=3, seq_len=16),
                       families=("heads",),
                       options=EngineOptions(induction_n=6, induction_sequences=2))
    assert server.ingest(compute_run(config)).status_code == 201
    answer = server.get(url).json()
    assert answer["importance"] == "heads.ablation_kl"
    assert answer["importance_run"]["id"] != answer["stability_run"]["id"]
    table = pl.DataFrame(answer["rows"])
    assert table["layer"].to_list() == [0, 1, 2, 3]
    assert (table["n_heads"] == 4).all()
    stability = rows(server.get(f"{V1}/families/tiny-4l/stability",
                                params={"metric": "heads.stability", "per_head": "true"}))
    importance = rows(server.get(f"{V1}/models/tiny-4l-s0/heads",
                                 params={"metric": "heads.ablation_kl"}))
    for row in table.iter_rows(named=True):
        s = stability.filter((pl.col("layer") == row["layer"]) & pl.col("head").is_not_null())
        i = importance.filter(pl.col("layer") == row["layer"])
        s, i = s.sort("head")["value"].to_numpy(), i.sort("head")["value"].to_numpy()
        assert row["pearson"] == pytest.approx(scipy.stats.pearsonr(s, i)[0], abs=1e-9)
        assert row["spearman"] == pytest.approx(scipy.stats.spearmanr(s, i)[0], abs=1e-9)
        assert row["pearson_low"] <= row["pearson"] <= row["pearson_high"]
        assert row["mean_stability"] == pytest.approx(s.mean())
        assert row["mean_importance"] == pytest.approx(i.mean())
    csv = server.get(url, params={"format": "csv"})
    assert csv.status_code == 200
    assert pl.read_csv(io.StringIO(csv.text)).columns[:4] == [
        "layer", "relative_depth", "n_heads", "pearson"]
    bad = server.get(url, params={"importance": "intervention.kl"})
    assert bad.status_code == 422
    assert "heads.ablation_kl" in bad.json()["detail"]
    assert server.get(f"{V1}/families/nope/stability-importance").status_code == 404


def test_family_stability(server: Api) -> None:
    families = server.get(f"{V1}/families").json()
    assert [f["name"] for f in families] == ["tiny-4l"]
    assert families[0]["anchor"]["name"] == "tiny-4l-s0"
    assert [m["name"] for m in families[0]["members"]] == ["tiny-4l-s0", "tiny-4l-s1"]
    per_layer = server.get(f"{V1}/families/tiny-4l/stability",
                           params={"metric": "heads.stability"})
    table = rows(per_layer)
    assert table.columns == list(columns(StabilityRow))
    assert table["layer"].to_list() == [0, 1, 2, 3]
    assert table["head"].null_count() == 4
    assert ((table["value"] > -1) & (table["value"] <= 1 + 1e-9)).all()
    heads = rows(server.get(f"{V1}/families/tiny-4l/stability",
                            params={"metric": "heads.stability", "per_head": "true"}))
    assert heads.height == 4 + 4 * 4
    every = rows(server.get(f"{V1}/families/tiny-4l/stability"))
    assert set(every["metric"]) >= {"heads.stability", "heads.stability_null",
                                    "heads.residual_cka.linear"}
    models = server.get(f"{V1}/models", params={"family": "tiny-4l"}).json()
    assert [m["name"] for m in models["items"]] == ["tiny-4l-s0", "tiny-4l-s1"]
    assert models["items"][0]["refit_families"] == ["tiny-4l"]
    assert server.get(f"{V1}/families/nope/stability").status_code == 404
    assert server.get(f"{V1}/families/tiny-4l/stability",
                      params={"metric": "intervention.kl"}).status_code == 422
