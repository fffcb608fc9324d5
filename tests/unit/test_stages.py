"""The stage rule places boundaries where hand-built metric curves put them."""

from __future__ import annotations

import polars as pl
import pytest

from compute.errors import SpecError
from compute.records import Record, records_to_table
from compute.stages import infer_stages, n_layers_of, stage_records

L = 8


def build(drop: list[float], lens: list[float], pred: list[int], supp: list[int]) -> pl.DataFrame:
    records = [Record.of("intervention.kl", v, 100, layer=i, component="drop")
               for i, v in enumerate(drop)]
    records += [Record.of("intervention.kl", 0.1, 100, layer=i, component="swap")
                for i in range(L - 1)]
    records += [Record.of("logit_lens.kl_to_final", v, 100, layer=i) for i, v in enumerate(lens)]
    records += [Record.of("neurons.n_prediction", v, 64, layer=i) for i, v in enumerate(pred)]
    records += [Record.of("neurons.n_suppression", v, 64, layer=i) for i, v in enumerate(supp)]
    return pl.from_arrow(records_to_table(records))  # type: ignore[return-value]


CATASTROPHIC_THEN_LOW = [5.0, 0.5, 0.4, 0.3, 0.3, 0.2, 0.2, 0.1]
HIGH_THEN_COLLAPSE = [6.0, 6.0, 5.8, 5.6, 5.5, 2.0, 0.5, 0.2, 0.0]
PRED = [0, 1, 2, 3, 5, 6, 2, 1]
SUPP = [0, 0, 1, 1, 2, 3, 4, 5]


def test_boundaries_land_where_the_curves_were_built() -> None:
    records = build(CATASTROPHIC_THEN_LOW, HIGH_THEN_COLLAPSE, PRED, SUPP)
    assert n_layers_of(records) == L
    b1, b2, b3 = infer_stages(records, L)
    assert b1.layer == 1  # first layer whose drop KL is below 0.2 x 5.0
    assert b2.layer == 4  # the last high point before the collapse
    assert b3.layer == 6  # suppression outnumbers prediction from layer 6 to the end
    assert b1.relative_depth == pytest.approx(1 / 7)
    assert b2.evidence["metric"] == "logit_lens.kl_to_final"
    assert b2.evidence["kl_at_knee"] == 5.5
    assert b3.evidence["n_suppression"][6] == 4
    rows = stage_records([b1, b2, b3], L)
    assert [r.metric for r in rows] == ["stages.boundary_1", "stages.boundary_2",
                                        "stages.boundary_3"]
    assert [r.layer for r in rows] == [1, 4, 6]


def test_boundaries_move_with_the_curves() -> None:
    later_drop = [5.0, 3.0, 2.0, 0.6, 0.3, 0.2, 0.2, 0.1]
    earlier_knee = [6.0, 5.9, 5.8, 1.0, 0.6, 0.4, 0.2, 0.1, 0.0]
    b1, b2, _ = infer_stages(build(later_drop, earlier_knee, PRED, SUPP), L)
    assert b1.layer == 3
    assert b2.layer == 2


def test_unclear_metrics_give_no_boundary_instead_of_an_invented_one() -> None:
    flat_drop = [0.5, 0.5, 0.4, 0.5, 0.4, 0.5, 0.4, 0.5]
    straight_lens = [6.0 * (1 - i / L) for i in range(L + 1)]
    never = [5] * L
    b1, b2, b3 = infer_stages(build(flat_drop, straight_lens, never, [1] * L), L)
    assert (b1.layer, b2.layer, b3.layer) == (None, None, None)
    assert "not catastrophic" in b1.evidence["reason"]
    assert "no knee" in b2.evidence["reason"]
    assert "never" in b3.evidence["reason"]
    assert stage_records([b1, b2, b3], L) == []


def test_missing_metrics_are_reported_not_guessed() -> None:
    records = build(CATASTROPHIC_THEN_LOW, HIGH_THEN_COLLAPSE, PRED, SUPP)
    only_lens = records.filter(pl.col("metric") == "logit_lens.kl_to_final")
    b1, b2, b3 = infer_stages(only_lens, L)
    assert b1.layer is None
    assert "needs" in b1.evidence["reason"]
    assert b2.layer == 4
    assert b3.layer is None
    assert "needs" in b3.evidence["reason"]
    with pytest.raises(SpecError):
        infer_stages(records.drop("value"), L)
