"""The pruning plan and the predictors' scores as queries (issue 51, items 3 and 4).

`zoo:planted-pruning` (blocks 3 and 4 cancel each other, blocks 5 and 6 are identities) is
computed once with `pruning,pruning_drops` on a few builtin sequences and ingested into a real
DuckDB file; the API runs in process (`litestar.testing.TestClient`). Every expected value is
worked out here from the computed records themselves (plain Python over (metric, layer) rows),
not by the code under test.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from compute.models import resolve_model_spec
from compute.run import RunConfig, RunResult, compute_run
from compute.tokens import TokenSpec
from service.api.app import create_app
from service.cli import main
from service.client import Client, UnprocessableError
from service.settings import Settings
from service.store import Store, migrate
from service.store.ingest import ingest_result
from tests.serving import settings_from_env

V1 = "/api/v1"
MODEL = "planted-pruning"


@pytest.fixture(scope="module")
def computed() -> RunResult:
    config = RunConfig(
        model=resolve_model_spec(f"zoo:{MODEL}"),
        tokens=TokenSpec(source="builtin", n_sequences=4, seq_len=16),
        families=("pruning", "pruning_drops"),
    )
    return compute_run(config)


def _renamed(
    result: RunResult, name: str, families: tuple[str, ...], keep: str | None
) -> RunResult:
    """The same run under another model name, with only the families (and records) given."""
    config = result.config
    config = config.model_copy(
        update={"model": config.model.model_copy(update={"name": name}), "families": families}
    )
    records, means = result.records, result.sequence_means
    if keep is not None:
        records = records.filter(pc.starts_with(records.column("metric"), keep))
        means = means.filter(pc.starts_with(means.column("metric"), keep))
    return dataclasses.replace(
        result,
        config=config,
        config_hash=config.config_hash(),
        records=records,
        sequence_means=means,
    )


def _narrowed(result: RunResult, name: str = "two-widths") -> RunResult:
    """A run that measured widths 1 and 2 only (as `EngineOptions(drop_widths=(1, 2))`), under
    another configuration (its tokens' seed)."""
    out = _renamed(result, name, ("pruning", "pruning_drops"), None)
    config = out.config.model_copy(
        update={"tokens": out.config.tokens.model_copy(update={"seed": 7})}
    )
    out = dataclasses.replace(out, config=config, config_hash=config.config_hash())
    wide = r"^pruning_drops\..*_[34](_low|_high)?$"
    records = out.records.filter(
        pc.invert(pc.match_substring_regex(out.records.column("metric"), wide))
    )
    means = out.sequence_means.filter(
        pc.invert(pc.match_substring_regex(out.sequence_means.column("metric"), wide))
    )
    return dataclasses.replace(out, records=records, sequence_means=means)


@dataclass
class Service:
    client: TestClient[Any]
    runs: dict[str, int]
    records: dict[tuple[str, int | None], tuple[float, float | None, int]]

    def plan(self, model: str = MODEL, **params: Any) -> Any:
        return self.client.get(f"{V1}/models/{model}/pruning-plan", params=params)


def _settings(db: Path) -> Settings:
    return settings_from_env(
        {
            "HF_HUB_OFFLINE": "1",
            "STRATA_DATABASE": str(db),
            "STRATA_API_KEYS": "k" * 20,
            "STRATA_DATA_DIR": str(db.parent / "state"),
            "STRATA_JOBS__RECONCILE": "false",
        }
    )


SINGLE = "single-drops"  # a model whose only run computed intervention and pruning


@pytest.fixture(scope="module")
def single(computed: RunResult) -> RunResult:
    """The planted model's intervention and pruning families on the same tokens, as a
    default run gives them, under another model name (no pruning_drops)."""
    config = computed.config.model_copy(update={"families": ("intervention", "pruning")})
    return _renamed(compute_run(config), SINGLE, ("intervention", "pruning"), None)


@pytest.fixture(scope="module")
def service(
    computed: RunResult, single: RunResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("pruning") / "strata.duckdb"
    table = computed.records
    records = {
        (m, layer): (v, se, n)
        for m, layer, v, se, n in zip(
            *(table.column(c).to_pylist() for c in ("metric", "layer", "value", "stderr", "n")),
            strict=True,
        )
    }
    with Store.open(db, threads=1) as store:
        migrate.upgrade(store)
        runs = {
            "full": ingest_result(store, computed).run_id,
            "drops-only": ingest_result(
                store, _renamed(computed, "drops-only", ("pruning_drops",), "pruning_drops.")
            ).run_id,
            "no-pruning": ingest_result(
                store, _renamed(computed, "no-pruning", ("pruning",), "pruning.")
            ).run_id,
            "two-widths": ingest_result(store, _narrowed(computed)).run_id,
            # two runs of one model: the older measured 1..4, the newer 1..2
            "older": ingest_result(
                store, _renamed(computed, "two-runs", ("pruning", "pruning_drops"), None)
            ).run_id,
            "newer": ingest_result(store, _narrowed(computed, "two-runs")).run_id,
            "single": ingest_result(store, single).run_id,
        }
        with TestClient(create_app(_settings(db), store)) as client:
            yield Service(client, runs, records)


# ---- the slow, obvious reference, from the computed records


def _series(records: dict[tuple[str, int | None], Any], metric: str) -> dict[int, Any]:
    return {layer: v for (m, layer), v in records.items() if m == metric and layer is not None}


def expected_plan(records: dict[tuple[str, int | None], Any], n: int) -> dict[str, list[int]]:
    kl = _series(records, f"pruning_drops.kl_{n}")
    best = min(kl, key=lambda layer: (kl[layer][0], layer))
    influence = _series(records, "pruning.block_influence")
    lowest = sorted(influence, key=lambda layer: (influence[layer][0], layer))[:n]
    out = {"measured": list(range(best, best + n)), "block_influence": sorted(lowest)}
    for name in ("angular_distance_last", "angular_distance"):
        d = _series(records, f"pruning.{name}_{n}")
        start = min(d, key=lambda layer: (d[layer][0], layer))
        out[name] = list(range(start, start + n))
    return out


def _by_choice(answer: Any) -> dict[str, dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    return {row["choice"]: row for row in answer.json()["rows"]}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_plan_matches_the_stored_records(service: Service, n: int) -> None:
    answer = service.plan(n=n)
    rows = _by_choice(answer)
    body = answer.json()
    assert body["n"] == n
    assert body["widths"] == [1, 2, 3, 4]
    assert body["run"]["id"] == service.runs["full"]
    assert body["predictor_run"]["id"] == service.runs["full"]
    assert answer.headers["X-Strata-Run"].startswith(f"{service.runs['full']}; ")
    expected = expected_plan(service.records, n)
    assert set(rows) == set(expected)
    best_kl = service.records[(f"pruning_drops.kl_{n}", expected["measured"][0])][0]
    for choice, blocks in expected.items():
        row = rows[choice]
        assert row["blocks"] == blocks, choice
        consecutive = blocks == list(range(blocks[0], blocks[0] + n))
        assert row["consecutive"] is consecutive
        assert row["measured"] is consecutive
        if not consecutive:
            assert row["kl"] is None
            assert row["top1_agreement"] is None
            assert "not consecutive" in row["note"]
            continue
        start = blocks[0]
        for metric in ("kl", "top1_agreement", "loss_delta"):
            value, stderr, count = service.records[(f"pruning_drops.{metric}_{n}", start)]
            assert row[metric] == pytest.approx(value, abs=1e-12), (choice, metric)
            assert row[f"{metric}_stderr"] == pytest.approx(stderr, abs=1e-12)
            assert row["n_sequences"] == count == 4
        assert row["kl_excess"] == pytest.approx(row["kl"] - best_kl, abs=1e-12)
        assert row["same_as_measured"] is (start == expected["measured"][0])


def test_the_planted_free_blocks_are_chosen(service: Service) -> None:
    """The positive control: identities at 5 and 6, a cancelling pair at 3, 4. The measured
    plan removes a free block of every width; Gromov's rule (both variants) too; block
    influence finds 5 and 6 and, beyond them, cannot see the pair."""
    for n in (1, 2, 3, 4):
        rows = _by_choice(service.plan(n=n))
        assert rows["measured"]["kl"] < 1e-5, n
        free = {1: [[5], [6]], 2: [[3, 4], [5, 6]], 3: [[3, 4, 5]], 4: [[3, 4, 5, 6]]}[n]
        assert rows["measured"]["blocks"] in free
        for name in ("angular_distance_last", "angular_distance"):
            assert rows[name]["blocks"] in free, (n, name)
            assert rows[name]["kl"] < 1e-5
    one = _by_choice(service.plan(n=1))
    assert one["measured"]["blocks"] == [5]  # ties (5 and 6 both read 0) go to the lower block
    assert one["block_influence"]["blocks"] == [5]
    two = _by_choice(service.plan(n=2))
    assert two["block_influence"]["blocks"] == [5, 6]
    assert two["block_influence"]["measured"]
    three = _by_choice(service.plan(n=3))
    assert not {3, 4} <= set(three["block_influence"]["blocks"])
    assert three["block_influence"]["kl"] is None or three["block_influence"]["kl"] > 0.5


def test_the_scores_with_their_intervals(service: Service) -> None:
    body = service.plan(n=2).json()
    scores = {(s["predictor"], s["n"]): s for s in body["scores"]}
    expected = {}
    for (metric, _layer), (value, stderr, count) in service.records.items():
        if metric.startswith("pruning_drops.spearman_") and not metric.endswith(("_low", "_high")):
            stem = metric.removeprefix("pruning_drops.spearman_")
            predictor, width = stem.rsplit("_", 1)
            expected[(predictor, int(width))] = (metric, value, stderr, count)
    assert set(scores) == set(expected)
    assert ("block_influence", 1) in scores
    for key, (metric, value, stderr, count) in expected.items():
        got = scores[key]
        assert got["metric"] == metric
        assert got["rho"] == pytest.approx(value)
        assert got["stderr"] == pytest.approx(stderr)
        assert got["low"] == pytest.approx(service.records[(f"{metric}_low", None)][0])
        assert got["high"] == pytest.approx(service.records[(f"{metric}_high", None)][0])
        assert got["n_sequences"] == count
        assert got["level"] == 0.9
        assert got["target"] == f"pruning_drops.kl_{key[1]}"
        assert got["predicts"] is (got["low"] > 0)

    # "does BI predict what matters on this model?" in one request, across models too
    answer = service.client.get(
        f"{V1}/pruning-scores",
        params={"models": f"{MODEL},drops-only,no-pruning", "predictor": "block_influence"},
    )
    assert answer.status_code == 200, answer.text
    rows = answer.json()["rows"]
    assert {r["model"] for r in rows} == {MODEL, "drops-only"}
    bi = next(r for r in rows if r["model"] == MODEL)
    assert (bi["n"], bi["rho"]) == (1, pytest.approx(expected[("block_influence", 1)][1]))
    models = {m["name"]: m for m in answer.json()["models"]}
    assert models["no-pruning"]["run_id"] is None
    assert models["no-pruning"]["n_points"] == 0
    assert models[MODEL]["run"]["id"] == service.runs["full"]


def test_every_format_names_its_run(service: Service) -> None:
    json_rows = service.plan(n=2).json()["rows"]
    for fmt in ("csv", "parquet", "arrow"):
        answer = service.plan(n=2, format=fmt)
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Strata-Run"].split(";")[0] == str(service.runs["full"])
    table = pq.read_table(io.BytesIO(service.plan(n=2, format="parquet").content))
    assert table.column("choice").to_pylist() == [r["choice"] for r in json_rows]
    assert table.column("blocks").to_pylist() == [r["blocks"] for r in json_rows]
    context = json.loads(table.schema.metadata[b"strata"])
    assert context["run"]["id"] == service.runs["full"]
    assert context["n"] == 2
    arrow = pa.ipc.open_stream(service.plan(n=2, format="arrow").content).read_all()
    assert arrow.column("kl").to_pylist() == [r["kl"] for r in json_rows]
    table_rows = list(csv.DictReader(io.StringIO(service.plan(n=2, format="csv").text)))
    assert [r["choice"] for r in table_rows] == [r["choice"] for r in json_rows]
    assert [json.loads(r["blocks"]) for r in table_rows] == [r["blocks"] for r in json_rows]


def test_drops_without_the_predictors_say_so(service: Service) -> None:
    rows = _by_choice(service.plan("drops-only", n=2))
    assert rows["measured"]["blocks"] == expected_plan(service.records, 2)["measured"]
    for name in ("block_influence", "angular_distance_last", "angular_distance"):
        assert rows[name]["blocks"] is None
        assert rows[name]["kl"] is None
        assert "--metrics pruning,pruning_drops" in rows[name]["note"]
    assert service.plan("drops-only", n=2).json()["predictor_run"] is None


def test_a_model_with_single_drops_only_has_the_plan_for_one_block(
        service: Service, single: RunResult) -> None:
    """No run with pruning_drops, one with intervention: the plan for n = 1 reads the
    intervention family's drops (the same measurement as pruning_drops.kl_1: equal here, on the
    same tokens, to float rounding), says so, and measures every choice; n = 2 is refused with
    how to compute the drops."""
    table = single.records
    rows = zip(*(table.column(c).to_pylist()
                 for c in ("metric", "component", "layer", "value", "stderr")), strict=True)
    drop = {(m, layer): (v, se) for m, c, layer, v, se in rows if c == "drop"}
    kl = {layer: v for (m, layer), (v, _) in drop.items() if m == "intervention.kl"}
    for layer, value in kl.items():  # the same single drops as the n-block family's width 1
        assert value == pytest.approx(service.records[("pruning_drops.kl_1", layer)][0],
                                      rel=1e-6, abs=1e-9)
    best = min(kl, key=lambda layer: (kl[layer], layer))
    answer = service.plan(SINGLE, n=1)
    body = answer.json()
    assert body["costs_from"] == "intervention"
    assert body["widths"] == [1]
    assert body["scores"] == []
    assert body["run"]["id"] == service.runs["single"]
    assert body["predictor_run"]["id"] == service.runs["single"]
    rows = _by_choice(answer)
    assert rows["measured"]["blocks"] == [best]
    assert rows["measured"]["kl"] == pytest.approx(kl[best])
    records = {(m, layer): v for m, layer, v in zip(
        *(table.column(c).to_pylist() for c in ("metric", "layer", "value")), strict=True)}
    bi = {layer: v for (m, layer), v in records.items() if m == "pruning.block_influence"}
    lowest = min(bi, key=lambda layer: (bi[layer], layer))
    row = rows["block_influence"]
    assert row["blocks"] == [lowest]
    assert row["measured"] is True
    v, se = drop[("intervention.kl", lowest)]
    assert (row["kl"], row["kl_stderr"]) == (pytest.approx(v), pytest.approx(se))
    agree = drop[("intervention.top1_agreement", lowest)][0]
    assert row["top1_agreement"] == pytest.approx(agree)
    assert row["loss_delta"] == pytest.approx(drop[("intervention.loss_delta", lowest)][0])
    assert row["kl_excess"] == pytest.approx(v - kl[best])
    wider = service.plan(SINGLE, n=2)
    assert wider.status_code == 404, wider.text
    assert "serve a budget of n = 1 only" in wider.text
    assert "--metrics pruning,pruning_drops" in wider.text
    own = service.plan(SINGLE, n=1, run_id=service.runs["single"])
    assert own.status_code == 200, own.text
    assert own.json()["costs_from"] == "intervention"
    assert service.plan(MODEL, n=1).json()["costs_from"] == "pruning_drops"


@pytest.mark.parametrize(
    ("model", "params", "status", "says"),
    [
        ("nope", {"n": 1}, 404, "no model is registered"),
        ("no-pruning", {"n": 1}, 404, "--metrics pruning,pruning_drops"),
        (MODEL, {"n": 0}, 422, "out of range"),
        (MODEL, {"n": -3}, 422, "out of range"),
        (MODEL, {"n": 5}, 422, "out of range"),  # 8 blocks: budgets 1..4
        (MODEL, {"n": "two"}, 400, ""),
        (MODEL, {"n": 2, "run_id": 999999}, 404, "has no run"),
        (MODEL, {"n": 2, "format": "xml"}, 400, ""),
    ],
)
def test_bad_requests_are_4xx(
    service: Service, model: str, params: dict[str, Any], status: int, says: str
) -> None:
    answer = service.plan(model, **params)
    assert answer.status_code == status, answer.text
    assert says in answer.text


def test_a_run_without_the_drops_and_an_unmeasured_width(service: Service) -> None:
    answer = service.plan(n=2, run_id=service.runs["no-pruning"])
    assert answer.status_code == 404, answer.text  # another model's run
    own = service.client.get(
        f"{V1}/models/no-pruning/pruning-plan",
        params={"n": 1, "run_id": service.runs["no-pruning"]},
    )
    assert own.status_code == 422
    assert "did not compute pruning_drops" in own.text
    bad = service.client.get(f"{V1}/pruning-scores", params={"models": "no-pruning"})
    assert bad.status_code == 404
    assert "pruning,pruning_drops" in bad.text
    unknown = service.client.get(
        f"{V1}/pruning-scores", params={"models": MODEL, "predictor": "magic"}
    )
    assert unknown.status_code == 422


def test_a_budget_in_range_but_not_measured(service: Service) -> None:
    answer = service.plan("two-widths", n=3)
    assert answer.status_code == 422, answer.text
    assert "it measured n = 1, 2" in answer.text
    assert "pruning,pruning_drops" in answer.text
    assert service.plan("two-widths", n=2).status_code == 200
    assert service.plan("two-widths", n=2).json()["widths"] == [1, 2]


# ---- the client and the CLI, through the same app


def _forwarding(service: Service) -> httpx.MockTransport:
    def forward(request: httpx.Request) -> httpx.Response:
        answer = service.client.request(
            request.method, request.url.raw_path.decode(), headers=dict(request.headers)
        )
        headers = {
            k: v
            for k, v in answer.headers.items()
            if k.lower() not in ("content-encoding", "content-length")
        }
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)

    return httpx.MockTransport(forward)


def test_the_client(service: Service) -> None:
    with Client("http://strata.test", transport=_forwarding(service)) as client:
        plan = client.pruning_plan(MODEL, 2)
        json_rows = service.plan(n=2).json()["rows"]
        assert plan.choices["choice"].to_list() == [r["choice"] for r in json_rows]
        assert plan.choices["kl"].to_list() == [r["kl"] for r in json_rows]
        assert plan.widths == [1, 2, 3, 4]
        assert plan.context["run"]["id"] == service.runs["full"]
        bi = plan.scores.filter(pl.col("predictor") == "block_influence").row(0, named=True)
        assert bi["rho"] == pytest.approx(
            service.records[("pruning_drops.spearman_block_influence_1", None)][0]
        )
        scores = client.pruning_scores([MODEL, "drops-only"], "angular_distance_last", 2)
        assert scores.height == 2
        assert set(scores["model"]) == {MODEL, "drops-only"}
        with pytest.raises(UnprocessableError, match="out of range"):
            client.pruning_plan(MODEL, 9)


def test_the_cli(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli import http as cli_http

    real = cli_http.Transport
    monkeypatch.setattr(
        cli_http,
        "Transport",
        lambda url, key, timeout: real(url, key, timeout=timeout, transport=_forwarding(service)),
    )
    runner = CliRunner()
    out = runner.invoke(
        main, ["pruning", "plan", "--model", MODEL, "--n", "2", "--url", "http://strata.test"]
    )
    assert out.exit_code == 0, out.output
    assert "budget n=2" in out.output
    assert "block_influence" in out.output
    assert "blocks 5,6" in out.output
    assert "rank correlation" in out.output
    raw = runner.invoke(
        main,
        ["pruning", "plan", "--model", MODEL, "--n", "2", "--json", "--url", "http://strata.test"],
    )
    assert json.loads(raw.output)["rows"] == service.plan(n=2).json()["rows"]
    scored = runner.invoke(
        main,
        [
            "pruning",
            "scores",
            "--models",
            f"{MODEL},no-pruning",
            "--predictor",
            "block_influence",
            "--url",
            "http://strata.test",
        ],
    )
    assert scored.exit_code == 0, scored.output
    assert "no-pruning: no run with pruning_drops" in scored.output
    bad = runner.invoke(
        main, ["pruning", "plan", "--model", MODEL, "--n", "7", "--url", "http://strata.test"]
    )
    assert bad.exit_code == 2
    assert "out of range" in bad.output


def test_the_plan_names_the_run_it_read_and_reads_the_one_asked_for(service: Service) -> None:
    """Without a default run computing pruning_drops, the latest run with it answers, and says
    so (not canonical); `run_id` reads the other one."""
    latest = service.plan("two-runs", n=2)
    assert latest.status_code == 200, latest.text
    run = latest.json()["run"]
    assert (run["id"], run["selected_by"], run["canonical"]) == (
        service.runs["newer"],
        "latest",
        False,
    )
    assert latest.json()["widths"] == [1, 2]
    assert f"{service.runs['newer']}; " in latest.headers["X-Strata-Run"]
    assert "selected_by=latest" in latest.headers["X-Strata-Run"]
    assert service.plan("two-runs", n=3).status_code == 422
    older = service.plan("two-runs", n=3, run_id=service.runs["older"])
    assert older.status_code == 200, older.text
    assert older.json()["run"]["id"] == service.runs["older"]
    assert older.json()["run"]["selected_by"] == "run_id"
    assert older.json()["predictor_run"]["id"] == service.runs["older"]
    assert older.json()["widths"] == [1, 2, 3, 4]
    assert {r["run_id"] for r in older.json()["rows"]} == {service.runs["older"]}
