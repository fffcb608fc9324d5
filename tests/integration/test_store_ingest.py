"""Ingest on a real DuckDB file: round trip, idempotence, atomic visibility, and refusals that
name the problem and store nothing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sqlalchemy.orm import Session

from compute.records import RECORD_SCHEMA
from compute.run import METRIC_VERSION, RunResult
from service.store import IngestError, RunNotFoundError, Store, ingest
from service.store import repositories as repo
from service.store import runs as lifecycle
from service.store.ingest import ingest_result
from tests.integration.stored import current_run, stored_records
from tests.integration.synthetic import variant


def _counts(store: Store) -> dict[str, int]:
    with store.read() as conn:
        return {t: conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar() for t in
                ("models", "token_sources", "runs", "results", "neurons", "neuron_tokens",
                 "sequence_means")}


def _metrics(result: RunResult) -> set[str]:
    return set(result.records.column("metric").to_pylist())


def _sorted(table: pa.Table) -> list[dict[str, object]]:
    rows = table.cast(RECORD_SCHEMA).to_pylist()
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r.values()))


def test_round_trip_returns_every_record(store: Store, run_result: RunResult) -> None:
    summary = ingest_result(store, run_result)
    assert not summary.replaced
    with store.read() as conn:
        stored = stored_records(conn, summary.run_id, _metrics(run_result))
        run = repo.get_run(conn, summary.run_id)
        model = repo.get_model(conn, summary.model_id)
    assert _sorted(stored) == _sorted(run_result.records)
    assert run is not None
    assert model is not None
    assert (run.status, run.progress, run.config_hash) == ("succeeded", 1.0,
                                                           run_result.config_hash)
    assert run.n_records == run_result.records.num_rows
    assert run.tokens_evaluated == run_result.tokens_evaluated
    assert run.config["metric_version"] == run.metric_version == METRIC_VERSION == "2"
    assert (model.n_layers, model.d_mlp, model.n_heads, model.fold_ln) == (3, 64, 4, True)
    assert summary.neuron_tokens == run_result.neuron_tokens.num_rows


def test_same_run_again_replaces_it(store: Store, run_result: RunResult) -> None:
    first = ingest_result(store, run_result)
    counts = _counts(store)
    second = ingest_result(store, variant(run_result, scale=2.0))
    assert second.run_id == first.run_id
    assert second.replaced
    assert _counts(store) == counts
    current = current_run(store, first.model_id, family="intervention")
    assert current is not None
    with store.read() as conn:
        kl = repo.rows_of_runs(conn, [current.id], ["intervention.kl"], component="drop")
    expected = [2 * r["value"] for r in run_result.records.to_pylist()
                if r["metric"] == "intervention.kl" and r["component"] == "drop"]
    assert kl["value"].to_list() == pytest.approx(expected)


def test_other_configuration_or_version_is_another_run(store: Store,
                                                       run_result: RunResult) -> None:
    a = ingest_result(store, run_result)
    b = ingest_result(store, variant(run_result, seed=7))
    c = ingest_result(store, variant(run_result, metric_version="0"))
    assert len({a.run_id, b.run_id, c.run_id}) == 3
    assert a.model_id == b.model_id == c.model_id
    assert current_run(store, a.model_id).id == b.run_id  # latest under version "2"
    assert current_run(store, a.model_id, metric_version="0").id == c.run_id


def test_readers_see_old_rows_until_commit(store: Store, run_result: RunResult,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = ingest_result(store, run_result).run_id
    seen: list[float] = []

    def look() -> None:  # another connection, mid-transaction
        with store.read() as conn:
            seen.extend(repo.rows_of_runs(conn, [run_id], ["intervention.kl"])["value"])

    monkeypatch.setattr(ingest, "before_commit", look)
    ingest_result(store, variant(run_result, scale=3.0))
    original = [r["value"] for r in run_result.records.to_pylist()
                if r["metric"] == "intervention.kl"]
    assert sorted(seen) == pytest.approx(sorted(original))
    with store.read() as conn:
        now = repo.rows_of_runs(conn, [run_id], ["intervention.kl"])["value"].to_list()
    assert sorted(now) == pytest.approx(sorted(3 * v for v in original))


def test_error_inside_the_transaction_keeps_previous_rows(store: Store, run_result: RunResult,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = ingest_result(store, run_result).run_id
    with store.read() as conn:
        before = stored_records(conn, run_id, _metrics(run_result))

    def fail() -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ingest, "before_commit", fail)
    with pytest.raises(OSError, match="disk full"):
        ingest_result(store, variant(run_result, scale=5.0))
    with pytest.raises(OSError, match="disk full"):
        ingest_result(store, variant(run_result, seed=3))
    with store.read() as conn:
        assert stored_records(conn, run_id, _metrics(run_result)).equals(before)
        assert len(repo.list_runs(conn)) == 1


def _set(column: str, fn: Callable[[pa.Array], pa.Array]) -> Callable[[pa.Table], pa.Table]:
    def change(table: pa.Table) -> pa.Table:
        i = table.schema.get_field_index(column)
        return table.set_column(i, table.schema.field(i), fn(table.column(column).combine_chunks()))
    return change


def _at(i: int, value: object, type_: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    def put(col: pa.Array) -> pa.Array:
        values = col.to_pylist()
        values[i] = value
        return pa.array(values, type_)
    return put


def _first(table: pa.Table, metric: str) -> int:
    return table.column("metric").to_pylist().index(metric)


MALFORMED: dict[str, tuple[Callable[[pa.Table], pa.Table], str]] = {
    "missing column": (lambda t: t.drop_columns(["unit"]), "missing columns: unit"),
    "wrong type": (lambda t: t.set_column(t.schema.get_field_index("layer"), "layer",
                                          pa.array(["x"] * t.num_rows)), "wrong column types"),
    "NaN value": (_set("value", _at(0, math.nan, pa.float64())), "NaN or infinite"),
    "infinite stderr": (_set("stderr", _at(0, math.inf, pa.float64())), "NaN or infinite"),
    "unknown metric": (_set("metric", _at(0, "intervention.klx", pa.string())),
                       "unknown metric name 'intervention.klx'"),
    "layer beyond the model": (_set("layer", _at(0, 9, pa.int32())), "layer out of range"),
    "block layer L": (lambda t: _set("layer", _at(_first(t, "intervention.kl"), 3,
                                                  pa.int32()))(t), "intervention.kl has layer 3"),
    "head beyond the model": (lambda t: _set("head", _at(_first(t, "heads.induction"), 4,
                                                         pa.int32()))(t), "head out of range"),
    "duplicate rows": (lambda t: pa.concat_tables([t, t.slice(0, 1)]), "duplicate records"),
    "incomplete neuron": (lambda t: t.filter(pc.invert(pc.and_(
        pc.equal(t.column("metric"), "neurons.vocab_kurt"),
        pc.equal(t.column("neuron"), 5)))), "lacks neurons.vocab_kurt"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_records_are_refused_and_store_nothing(store: Store, run_result: RunResult,
                                                         case: str) -> None:
    ingest_result(store, run_result)
    counts = _counts(store)
    change, message = MALFORMED[case]
    bad = dataclasses.replace(variant(run_result, seed=11), records=change(run_result.records))
    with pytest.raises(IngestError, match=message.replace("(", r"\(")):
        ingest_result(store, bad)
    assert _counts(store) == counts


def test_malformed_neuron_tokens_are_refused(store: Store, run_result: RunResult) -> None:
    tokens = run_result.neuron_tokens
    cases = {
        "missing columns: cosine": tokens.drop_columns(["cosine"]),
        "NaN or infinite": _set("cosine", _at(0, math.nan, pa.float64()))(tokens),
        "unknown direction": _set("direction", _at(0, "sideways", pa.string()))(tokens),
        "neuron out of range": _set("neuron", _at(0, 64, pa.int32()))(tokens),
    }
    for message, table in cases.items():
        with pytest.raises(IngestError, match=message):
            ingest_result(store, dataclasses.replace(run_result, neuron_tokens=table))
    assert _counts(store)["runs"] == 0


def test_mixed_up_configuration_is_refused(store: Store, run_result: RunResult) -> None:
    other = variant(run_result, seed=5)
    with pytest.raises(IngestError, match="does not match the run's configuration"):
        ingest_result(store, dataclasses.replace(run_result, config=other.config))
    broken = dict(run_result.model_info, n_layers="three")
    with pytest.raises(IngestError, match="n_layers"):
        ingest_result(store, dataclasses.replace(run_result, model_info=broken))
    assert _counts(store)["runs"] == 0


def test_model_that_changed_under_its_name_is_refused(store: Store,
                                                      run_result: RunResult) -> None:
    ingest_result(store, run_result)
    grown = dict(run_result.model_info, n_params=run_result.model_info["n_params"] + 1)
    with pytest.raises(IngestError, match="registered with other numbers"):
        ingest_result(store, dataclasses.replace(variant(run_result, seed=2), model_info=grown))


def test_results_for_a_queued_run(store: Store, run_result: RunResult) -> None:
    queued = lifecycle.enqueue(store, run_result.config)
    assert lifecycle.enqueue(store, run_result.config).id == queued.id
    lifecycle.mark_running(store, queued.id, device="cpu")
    lifecycle.set_progress(store, queued.id, 0.5)
    with pytest.raises(RunNotFoundError, match="run 999 does not exist"):
        ingest_result(store, run_result, run_id=999)
    with pytest.raises(IngestError, match=f"run {queued.id} was created for"):
        ingest_result(store, variant(run_result, seed=9), run_id=queued.id)
    summary = ingest_result(store, run_result, run_id=queued.id)
    assert summary.run_id == queued.id
    assert not summary.replaced
    with store.read() as conn:
        run = repo.get_run(conn, queued.id)
    assert run is not None
    assert run.status == "succeeded"
    assert run.started_at <= run.finished_at


def test_failed_run_is_not_current(store: Store, run_result: RunResult) -> None:
    first = ingest_result(store, run_result)
    newer = lifecycle.enqueue(store, variant(run_result, seed=4).config)
    lifecycle.mark_failed(store, newer.id, "CUDA out of memory")
    assert current_run(store, first.model_id).id == first.run_id
    with store.read() as conn:
        failed = repo.get_run(conn, newer.id)
    assert failed.status == "failed"
    assert failed.error == "CUDA out of memory"
    assert lifecycle.enqueue(store, variant(run_result, seed=4).config).status == "queued"
    with pytest.raises(RunNotFoundError):
        lifecycle.mark_running(store, 12345)


SEQUENCE_KEY = ["metric", "layer", "component", "head"]


def test_sequence_means_round_trip_and_agree_with_the_records(store: Store,
                                                              run_result: RunResult) -> None:
    """Every per-layer mean's per-sequence means are stored and read back; per key their mean
    is the record's value and their count its n (6 sequences), their std / sqrt(n) its stderr."""
    summary = ingest_result(store, run_result)
    assert summary.sequence_means == run_result.sequence_means.num_rows > 0
    with store.read() as conn:
        stored = repo.sequence_means(conn, summary.run_id)
        only = repo.sequence_means(conn, summary.run_id, ["intervention.swap_minus_drop_kl"])
        with Session(bind=conn) as session:
            via_session = repo.sequence_means(session, summary.run_id, [])
    sent = pl.DataFrame(run_result.sequence_means).cast(dict(stored.schema))
    key = [*SEQUENCE_KEY, "sequence"]
    assert stored.sort(key, nulls_last=True).equals(sent.sort(key, nulls_last=True))
    assert set(only["metric"]) == {"intervention.swap_minus_drop_kl"}
    assert only.height == 2 * 6  # layers 0..L-2 of a 3-layer model, 6 sequences
    assert via_session.height == 0
    per_key = stored.group_by(SEQUENCE_KEY).agg(
        pl.col("value").mean().alias("mean"), pl.len().alias("count"),
        (pl.col("value").std(ddof=1) / pl.len().sqrt()).alias("se"))
    records = pl.DataFrame(run_result.records).filter(pl.col("head").is_null()
                                                       & pl.col("neuron").is_null())
    joined = per_key.join(records.cast({"layer": pl.Int32, "head": pl.Int32}),
                          on=SEQUENCE_KEY, nulls_equal=True)
    assert joined.height == per_key.height
    assert (joined["count"] == joined["n"]).all()
    assert (joined["count"] == 6).all()
    assert ((joined["mean"] - joined["value"]).abs()
            <= 1e-9 * (1 + joined["value"].abs())).all()
    has_se = joined.filter(pl.col("stderr").is_not_null())
    assert ((has_se["se"] - has_se["stderr"]).abs() <= 1e-9 * (1 + has_se["stderr"])).all()
    # every per-layer mean of the sweep families has its sequences (not the ratio of means)
    means = records.filter(pl.col("stderr").is_not_null())
    assert means.join(per_key, on=SEQUENCE_KEY, nulls_equal=True, how="anti").height == 0


def test_sequence_means_are_replaced_with_their_run(store: Store, run_result: RunResult) -> None:
    first = ingest_result(store, run_result)
    counts = _counts(store)
    second = ingest_result(store, run_result)
    assert second.run_id == first.run_id
    assert _counts(store) == counts


def _seq_set(column: str, index: int, value: object, type_: pa.DataType):
    def change(table: pa.Table) -> pa.Table:
        values = table.column(column).to_pylist()
        values[index] = value
        return table.set_column(table.schema.get_field_index(column), column,
                                pa.array(values, type_))
    return change


def test_malformed_sequence_means_are_refused(store: Store, run_result: RunResult) -> None:
    means = run_result.sequence_means
    frame = pl.DataFrame(means)
    one_fewer = frame.filter(~((pl.col("metric") == "intervention.kl")
                               & (pl.col("component") == "drop") & (pl.col("layer") == 1)
                               & (pl.col("sequence") == 3))).to_arrow()
    assert one_fewer.num_rows == means.num_rows - 1
    cases = {
        "missing columns: sequence": means.drop_columns(["sequence"]),
        "NaN or infinite": _seq_set("value", 0, math.nan, pa.float64())(means),
        "negative sequence": _seq_set("sequence", 0, -1, pa.int32())(means),
        "duplicate per-sequence means": pa.concat_tables([means, means.slice(0, 1)]),
        "not among the records": _seq_set("metric", 0, "logit_lens.entropy", pa.string())(
            _seq_set("layer", 0, 99, pa.int32())(means)),
        "5 sequences, but the record says n=6": one_fewer,
    }
    for message, table in cases.items():
        with pytest.raises(IngestError, match=message):
            ingest_result(store, dataclasses.replace(run_result, sequence_means=table))
    assert _counts(store)["runs"] == 0
