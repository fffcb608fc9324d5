"""The repository queries the API serves, on a real DuckDB file, with the runs picked as the
API picks them (`Snapshot.current_run`)."""

from __future__ import annotations

import polars as pl
import pytest

from compute.run import RunResult
from service.api.queries.index import StoreIndex
from service.store import Store
from service.store import repositories as repo
from service.store.ingest import ingest_result
from service.store.tables import RefitFamily, RefitFamilyMember, StageBoundary
from tests.integration.stored import current_run
from tests.integration.synthetic import variant


@pytest.fixture
def filled(store: Store, run_result: RunResult) -> dict[str, int]:
    """Two models; model a has an old-version run, an older and a newer current-version run."""
    ids = {
        "a_old_version": ingest_result(store, variant(run_result, metric_version="0")).run_id,
        "a_first": ingest_result(store, run_result).run_id,
        "a_latest": ingest_result(store, variant(run_result, seed=1, scale=2.0)).run_id,
        "b": ingest_result(store, variant(run_result, name="rand-b", scale=3.0)).run_id,
    }
    with store.read() as conn:
        ids["model_a"] = repo.get_run(conn, ids["a_first"]).model_id
        ids["model_b"] = repo.get_run(conn, ids["b"]).model_id
    return ids


def _records(result: RunResult) -> pl.DataFrame:
    return pl.DataFrame(result.records)


def test_models_and_runs(store: Store, filled: dict[str, int]) -> None:
    with store.read() as conn:
        assert [m.name for m in repo.filter_models(conn)[0]] == ["rand-3l", "rand-b"]
        named, total = repo.filter_models(conn, name="rand-b")
        assert ([m.id for m in named], total) == ([filled["model_b"]], 1)
        assert len(repo.list_runs(conn, model_id=filled["model_a"])) == 3
        assert len(repo.list_runs(conn, metric_version="0")) == 1
    snap = StoreIndex(store).snapshot()
    assert {m: snap.current_run(m).id for m in (filled["model_a"], filled["model_b"])
            } == {filled["model_a"]: filled["a_latest"], filled["model_b"]: filled["b"]}
    assert current_run(store, filled["model_a"], family="neurons").id == filled["a_latest"]
    assert current_run(store, filled["model_a"], family="stability") is None
    # what the model answers tell clients: every family of the current runs, one place
    assert set(snap.current_runs(filled["model_a"]).values()) == {filled["a_latest"]}
    assert "neurons" in snap.current_runs(filled["model_a"])


def test_current_results_of_a_model(store: Store, filled: dict[str, int],
                                    run_result: RunResult) -> None:
    latest = current_run(store, filled["model_a"], family="logit_lens")
    older = current_run(store, filled["model_a"], family="logit_lens", metric_version="0")
    assert latest is not None
    assert older is not None
    with store.read() as conn:
        rows = repo.rows_of_runs(conn, [latest.id], ["logit_lens.kl_to_final"])
        old = repo.rows_of_runs(conn, [older.id], ["logit_lens.kl_to_final"])
        layer = repo.rows_of_runs(conn, [latest.id], ["intervention.kl"], component="swap",
                                  layer_min=1, layer_max=1)
    expected = _records(run_result).filter(pl.col("metric") == "logit_lens.kl_to_final")
    assert rows["run_id"].unique().to_list() == [filled["a_latest"]]
    assert rows["value"].to_list() == pytest.approx((2 * expected["value"]).to_list())
    assert rows["relative_depth"].to_list() == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert old["value"].to_list() == pytest.approx(expected["value"].to_list())
    assert layer.height == 1
    assert layer["relative_depth"][0] == pytest.approx(0.5)


def test_cross_model_rows(store: Store, filled: dict[str, int]) -> None:
    runs = {m: current_run(store, m, family="intervention").id
            for m in (filled["model_a"], filled["model_b"])}
    heads_run = current_run(store, filled["model_b"], family="heads").id
    with store.read() as conn:
        rows = repo.rows_of_runs(conn, list(runs.values()), ["intervention.kl"],
                                 component="drop")
        heads = repo.rows_of_runs(conn, [heads_run], ["heads.induction"], heads=True)
    assert rows.group_by("run_id").len().sort("run_id").rows() == sorted(
        (run, 3) for run in runs.values())
    assert set(rows["run_id"]) == {filled["a_latest"], filled["b"]}
    mid = rows.filter(pl.col("relative_depth").is_between(0.4, 0.6))
    assert mid["layer"].to_list() == [1, 1]
    assert heads.height == 3 * 4
    assert set(heads["run_id"]) == {filled["b"]}


def test_neurons_top_k_with_tokens(store: Store, filled: dict[str, int],
                                   run_result: RunResult) -> None:
    run = filled["a_first"]
    with store.read() as conn:
        top = repo.neurons(conn, run, layer=2, neuron_class="partition", top_k=5)
        every = repo.neurons(conn, run, with_tokens=False)
    assert every.height == 3 * 64
    expected = (every.filter(pl.col("layer") == 2, pl.col("partition"))
                .sort("vocab_var", descending=True).head(5))
    assert top["neuron"].to_list() == expected["neuron"].to_list()
    tokens = pl.DataFrame(run_result.neuron_tokens).filter(
        pl.col("layer") == 2, pl.col("neuron") == top["neuron"][0],
        pl.col("direction") == "promoted", pl.col("neuron_class") == "partition").sort("rank")
    assert top["promoted"][0].to_list() == tokens["token"].to_list()
    # the flags are compute's own classification of the stored moments
    from compute.metrics.neurons import KURTOSIS_THRESHOLD, PARTITION_VARIANCE

    assert every["partition"].to_list() == (every["vocab_var"] > PARTITION_VARIANCE).to_list()
    assert every["prediction"].to_list() == ((every["vocab_kurt"] > KURTOSIS_THRESHOLD)
                                             & (every["vocab_skew"] > 0)).to_list()


def test_heads_by_metric(store: Store, filled: dict[str, int]) -> None:
    with store.read() as conn:
        rows = repo.rows_of_runs(conn, [filled["a_first"]], ["heads.ablation_kl"], heads=True)
    assert rows.height == 3 * 4
    assert rows["head"].null_count() == 0


def test_stages_and_families(store: Store, filled: dict[str, int]) -> None:
    from sqlalchemy.orm import Session

    with store.write() as conn, Session(bind=conn) as session:
        # replace the boundaries inferred at ingest with hand-made ones
        session.query(StageBoundary).filter(StageBoundary.run_id == filled["a_latest"]).delete()
        session.add_all([
            StageBoundary(run_id=filled["a_latest"], model_id=filled["model_a"], boundary=1,
                          found=True, layer=1, relative_depth=0.5, rule="drop-kl-fall",
                          evidence={"kl": [3.0, 0.2]}),
            StageBoundary(run_id=filled["a_latest"], model_id=filled["model_a"], boundary=2,
                          found=False, rule="lens-knee", evidence={"reason": "no knee"}),
            RefitFamily(name="rand", anchor_model_id=filled["model_a"]),
        ])
        session.flush()
        family = session.query(RefitFamily).one()
        session.add_all([RefitFamilyMember(family_id=family.id, model_id=m)
                         for m in (filled["model_a"], filled["model_b"])])
        session.flush()
    staged = {m: current_run(store, m, staged=True).id
              for m in (filled["model_a"], filled["model_b"])}
    with store.read() as conn:
        stages = repo.boundaries_of_runs(conn, [staged[filled["model_a"]]])
        assert [(s["boundary"], s["found"], s["layer"]) for s in stages] == [
            (1, True, 1), (2, False, None)]
        assert stages[0]["evidence"] == {"kl": [3.0, 0.2]}
        # model b's boundaries are the ones inferred at ingest
        assert [s["boundary"] for s in repo.boundaries_of_runs(conn, [staged[filled["model_b"]]])
                ] == [1, 2, 3]
        [family] = repo.list_families(conn)
        assert [m.name for m in repo.family_members(conn, family.id)] == ["rand-3l", "rand-b"]


def test_reingest_drops_stages_inferred_from_the_old_rows(store: Store, run_result: RunResult
                                                          ) -> None:
    from sqlalchemy.orm import Session

    summary = ingest_result(store, run_result)
    assert summary.stage_boundaries == 3  # inferred at ingest (intervention, lens, neurons)
    with store.write() as conn, Session(bind=conn) as session:
        session.query(StageBoundary).filter(StageBoundary.run_id == summary.run_id).delete()
        session.add(StageBoundary(run_id=summary.run_id, model_id=summary.model_id, boundary=3,
                                  found=True, layer=2, relative_depth=1.0, rule="stale",
                                  evidence={}))
        session.flush()
    ingest_result(store, run_result)
    with store.read() as conn:
        rows = repo.boundaries_of_runs(conn, [summary.run_id])
    assert [b["boundary"] for b in rows] == [1, 2, 3]
    assert "stale" not in {b["rule"] for b in rows}
