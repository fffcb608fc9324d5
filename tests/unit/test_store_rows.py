"""Checking and shaping a run's records for the store (pure Arrow, no database)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.store.errors import IngestError
from service.store.rows import parse_model_info, prepare_rows, relative_depth
from tests.integration.synthetic import synthetic_result


def _prepare(result):  # type: ignore[no-untyped-def]
    return prepare_rows(result.records, result.neuron_tokens, parse_model_info(result.model_info))


def test_relative_depth_of_blocks_and_lens_points() -> None:
    layers = pa.array([0, 1, 3, None], pa.int32())
    assert relative_depth(layers, False, 4).to_pylist() == pytest.approx([0, 1 / 3, 1, None])
    lens = pa.array([True, True, True, False])
    assert relative_depth(layers, lens, 4).to_pylist() == pytest.approx([0, 0.25, 0.75, None])
    assert relative_depth(pa.array([0], pa.int32()), False, 1).to_pylist() == [0.0]


def test_moments_become_one_row_per_neuron() -> None:
    result = synthetic_result(2, 50, seed=3)
    rows = _prepare(result)
    assert rows.neurons.num_rows == 100
    assert rows.results.num_rows == 0
    assert rows.n_records == 400
    records = result.records.to_pylist()
    kurt = {(r["layer"], r["neuron"]): r["value"] for r in records
            if r["metric"] == "neurons.vocab_kurt"}
    stored = rows.neurons.to_pylist()
    assert all(r["vocab_kurt"] == kurt[(r["layer"], r["neuron"])] for r in stored)
    assert [r["relative_depth"] for r in stored[:1] + stored[-1:]] == [0.0, 1.0]
    heavy = np.array([r["vocab_kurt"] > 10 for r in stored])
    assert (np.array([r["prediction"] or r["suppression"] for r in stored]) == heavy).all()


def test_row_order_does_not_matter() -> None:
    result = synthetic_result(2, 30, seed=4)
    shuffled = result.records.take(np.random.default_rng(0).permutation(240))
    info = parse_model_info(result.model_info)
    assert prepare_rows(shuffled, None, info).neurons.equals(_prepare(result).neurons)


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: pa.concat_tables([t, t.slice(5, 1)]), "appears 2 times"),
    (lambda t: t.filter(pc.not_equal(t.column("neuron"), 7)), None),
    (lambda t: t.set_column(7, "n", pc.add(t.column("n"), pa.array(np.arange(t.num_rows)))),
     "different n"),
    (lambda t: t.set_column(4, "neuron", pa.array([None] * t.num_rows, pa.int32())),
     "need a layer and a neuron"),
])
def test_malformed_moments_are_refused(change, message) -> None:  # type: ignore[no-untyped-def]
    result = synthetic_result(2, 30)
    info = parse_model_info(result.model_info)
    table = change(result.records)
    if message is None:  # a neuron missing entirely (here #7 of both layers) is fine
        assert prepare_rows(table, None, info).neurons.num_rows == 58
        return
    with pytest.raises(IngestError, match=message):
        prepare_rows(table, None, info)


def test_model_info_is_checked() -> None:
    info = synthetic_result(1, 1).model_info
    with pytest.raises(IngestError, match="d_mlp"):
        parse_model_info({**info, "d_mlp": -1})
    with pytest.raises(IngestError, match="processing"):
        parse_model_info({k: v for k, v in info.items() if k != "processing"})
