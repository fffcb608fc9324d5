"""The stage rule places boundaries where hand-built metric curves put them, with intervals over
sequences, and finds nothing on curves without structure or on a random model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.errors import SpecError
from compute.records import Record, records_to_table
from compute.stages import (
    CATASTROPHIC_KL,
    infer_stages,
    n_layers_of,
    resampled_curves,
    stage_records,
)

L = 8


def build(drop: Sequence[float], lens: Sequence[float], pred: Sequence[float],
          supp: Sequence[float], *, drop_top1: Sequence[float] | None = None,
          lens_top1: Sequence[float] | None = None, swap: Sequence[float] | None = None,
          calibrated: bool = False) -> pl.DataFrame:
    """A record table of the metrics the rule reads (swap KL flat unless given)."""
    n = len(drop)
    suffix = "_cal" if calibrated else ""
    records = [Record.of("intervention.kl", v, 100, layer=i, component="drop")
               for i, v in enumerate(drop)]
    records += [Record.of("intervention.kl", v, 100, layer=i, component="swap")
                for i, v in enumerate(swap or [0.1] * (n - 1))]
    records += [Record.of("logit_lens.kl_to_final", v, 100, layer=i) for i, v in enumerate(lens)]
    records += [Record.of(f"neurons.n_prediction{suffix}", v, 64, layer=i)
                for i, v in enumerate(pred)]
    records += [Record.of(f"neurons.n_suppression{suffix}", v, 64, layer=i)
                for i, v in enumerate(supp)]
    if drop_top1 is not None:
        records += [Record.of("intervention.top1_agreement", v, 100, layer=i, component="drop")
                    for i, v in enumerate(drop_top1)]
    if lens_top1 is not None:
        records += [Record.of("logit_lens.top1_agreement", v, 100, layer=i)
                    for i, v in enumerate(lens_top1)]
    return pl.from_arrow(records_to_table(records))  # type: ignore[return-value]


CATASTROPHIC_THEN_LOW = [5.0, 0.5, 0.4, 0.3, 0.3, 0.2, 0.2, 0.1]
HIGH_THEN_COLLAPSE = [6.0, 6.0, 5.8, 5.6, 5.5, 2.0, 0.5, 0.2, 0.0]
PRED = [0, 1, 2, 3, 5, 6, 2, 1]
SUPP = [0, 0, 1, 1, 2, 3, 6, 9]  # suppression leads by >= 4 from layer 6 on


def test_boundaries_land_where_the_curves_were_built() -> None:
    records = build(CATASTROPHIC_THEN_LOW, HIGH_THEN_COLLAPSE, PRED, SUPP)
    assert n_layers_of(records) == L
    b1, b2, b3 = infer_stages(records, L)
    assert b1.layer == 1  # only layer 0's drop is catastrophic
    assert b2.layer == 4  # the lens holds its plateau through point 4, block 4 starts falling
    assert b3.layer == 6  # suppression outnumbers prediction from layer 6 to the end
    assert b1.relative_depth == pytest.approx(1 / 7)
    assert b2.evidence["metric"] == "logit_lens.kl_to_final"
    assert b2.evidence["signals"]["lens_kl"]["value_at"] == 2.0  # point 5, after block 4
    assert b2.evidence["signals"]["lens_kl"]["value_before"] == 5.5
    assert b3.evidence["counts"] == "fixed"
    assert "fixed study classes" in b3.evidence["note"]
    for b in (b1, b2, b3):
        assert b.clear
        assert b.estimate == b.layer
        assert b.sharpness is not None
        assert b.sharpness > 0
        assert b.range is not None
        assert b.range[0] <= b.layer <= b.range[1]  # type: ignore[operator]
        assert b.interval is None  # no per-sequence table: no interval, and it says so
        assert "no per-sequence" in b.evidence["bootstrap"]["reason"]
    rows = stage_records([b1, b2, b3], L)
    assert [r.metric for r in rows] == ["stages.boundary_1", "stages.boundary_2",
                                        "stages.boundary_3"]
    assert [r.layer for r in rows] == [1, 4, 6]


def test_boundaries_move_with_the_curves() -> None:
    later_drop = [5.0, 3.0, 2.0, 0.2, 0.15, 0.2, 0.15, 0.1]  # layers 0-2 catastrophic
    later_knee = [6.0, 5.9, 5.8, 5.7, 5.6, 5.6, 3.0, 1.5, 0.0]
    b1, b2, _ = infer_stages(build(later_drop, later_knee, PRED, SUPP), L)
    assert b1.layer == 3
    assert b2.layer == 5  # plateau through point 5; block 5 starts the fall


def test_agreement_signals_place_boundary_1_beside_kl() -> None:
    drop_top1 = [0.02, 0.1, 0.85, 0.9, 0.88, 0.9, 0.92, 0.7]
    two_bad = [5.0, 2.0, 0.2, 0.15, 0.2, 0.15, 0.1, 0.3]
    b1, _, _ = infer_stages(build(two_bad, HIGH_THEN_COLLAPSE, PRED, SUPP,
                                  drop_top1=drop_top1), L)
    assert b1.layer == 2
    assert b1.evidence["signals"]["drop_top1"]["own_layer"] == 2
    assert b1.evidence["signals"]["drop_top1"]["value_at"] == 0.85
    assert b1.evidence["min_drop_kl_before"] == 2.0


def smollm2_like_lens(n_layers: int = 30, knee: int = 22, seed: int = 0) -> list[float]:
    """Point 0 (embeddings) far above everything; 13-17 nats through `knee`; then a decline to
    about 2.8 nats at point L-1; 0 at L (the shape described for SmolLM2-135M)."""
    rng = np.random.default_rng(seed)
    plateau = list(15.0 + 2.0 * rng.uniform(-1, 1, knee))
    fall = list(np.geomspace(12.0, 2.8, n_layers - 1 - knee))
    return [107.0, *plateau, *fall, 0.0]


def test_embedding_point_does_not_hide_the_knee() -> None:
    n = 30
    lens = smollm2_like_lens(n)
    assert len(lens) == n + 1
    drop = [6.0] + [0.3 + 0.02 * (i % 3) for i in range(1, n - 1)] + [1.2]
    records = build(drop, lens, [0] * n, [0] * n, swap=[4.0] + [0.2] * (n - 2))
    _, b2, _ = infer_stages(records, n)
    assert b2.clear, b2.evidence
    assert b2.layer is not None
    assert abs(b2.layer - 22) <= 1
    # the chord from point 0 (the old rule) sees no knee in this curve
    distance = [lens[i] / lens[0] - (1 - i / n) for i in range(1, n)]
    assert max(distance) < 0.1


# SmolLM2-135M-Instruct (Q4_1 GGUF), logit lens at points 0..30 on 2 sequences of the built-in
# corpus: the KL holds 12.6-16.6 nats from point 1 to 22 and falls from point 23 on; the
# agreement creeps up from point ~16.
SMOLLM2_LENS_KL = [95.913, 12.785, 13.872, 12.979, 13.206, 13.002, 13.465, 13.203, 13.757, 15.12,
                   15.834, 16.561, 15.723, 14.851, 14.993, 14.676, 15.476, 15.216, 15.024, 14.145,
                   13.383, 12.625, 13.645, 12.334, 10.191, 6.546, 5.52, 4.61, 3.408, 2.379, 0.0]
SMOLLM2_LENS_TOP1 = [0.033, 0.117, 0.067, 0.05, 0.067, 0.083, 0.033, 0.033, 0.05, 0.05, 0.017,
                     0.017, 0.067, 0.083, 0.133, 0.1, 0.133, 0.133, 0.133, 0.15, 0.183, 0.267, 0.3,
                     0.317, 0.35, 0.383, 0.417, 0.517, 0.567, 0.55, 1.0]


def test_the_knee_follows_the_lens_kl_on_smollm2() -> None:
    n = 30
    drop = [6.0] + [0.3] * (n - 1)
    records = build(drop, SMOLLM2_LENS_KL, [0] * n, [0] * n, lens_top1=SMOLLM2_LENS_TOP1)
    b2 = infer_stages(records, n)[1]
    assert b2.clear, b2.evidence
    assert b2.layer in (22, 23)  # the last plateau point: block 22 (or 23) starts the fall
    agreement = b2.evidence["signals"]["lens_top1"]["own_layer"]
    assert agreement is not None
    assert agreement < 20  # the agreement alone would say earlier: it corroborates, not places


def _with_tuned(records: pl.DataFrame, tuned: Sequence[float]) -> pl.DataFrame:
    rows = [Record.of("tuned_lens.kl_to_final", v, 100, layer=i) for i, v in enumerate(tuned)]
    extra = pl.from_arrow(records_to_table(rows))
    assert isinstance(extra, pl.DataFrame)
    return pl.concat([records, extra])


def test_a_tuned_lens_is_one_more_signal_for_boundary_2() -> None:
    records = build(CATASTROPHIC_THEN_LOW, HIGH_THEN_COLLAPSE, PRED, SUPP)
    plain = infer_stages(records, L)[1]
    assert set(plain.evidence["signals"]) == {"lens_kl"}
    # a tuned lens that leaves its plateau at the same point corroborates the knee
    agreeing = [3.0, 1.0, 1.0, 0.95, 0.9, 0.2, 0.1, 0.05, 0.0]
    b2 = infer_stages(_with_tuned(records, agreeing), L)[1]
    assert b2.layer == plain.layer == 4
    assert b2.evidence["signals"]["tuned_kl"]["own_layer"] == 4
    assert b2.evidence["signals"]["tuned_kl"]["value_at"] == 0.2
    assert "tuned_kl" in b2.evidence["agreeing"]
    # one that converges two points earlier disagrees: the raw lens still places the
    # boundary, and its range widens to hold the tuned lens's own knee
    early = [3.0, 1.0, 1.0, 0.2, 0.1, 0.08, 0.06, 0.05, 0.0]
    b2 = infer_stages(_with_tuned(records, early), L)[1]
    assert b2.evidence["signals"]["tuned_kl"]["own_layer"] == 2
    assert b2.layer == 4
    assert "tuned_kl" not in b2.evidence["agreeing"]
    assert b2.range == (2, 4)


def test_boundary_3_starts_at_or_after_boundary_1_when_2_is_unclear() -> None:
    deep_drop = [5.0, 4.0, 3.0, 2.5, 0.2, 0.15, 0.2, 0.1]  # detokenization ends at layer 4
    straight = [6.0 * (1 - i / L) for i in range(L + 1)]  # no knee
    early_supp = [0, 0, 6, 6, 6, 6, 6, 6]  # suppression leads from layer 2 on
    b1, b2, b3 = infer_stages(build(deep_drop, straight, [0] * L, early_supp), L)
    assert b1.layer == 4
    assert not b2.clear
    assert b3.layer == 4  # not 2: boundary 3 never precedes boundary 1
    assert b3.evidence["search_start"] == 4


def test_unclear_metrics_give_no_boundary_instead_of_an_invented_one() -> None:
    flat_drop = [0.5, 0.5, 0.4, 0.5, 0.4, 0.5, 0.4, 0.5]
    straight_lens = [6.0 * (1 - i / L) for i in range(L + 1)]
    never = [5] * L
    b1, b2, b3 = infer_stages(build(flat_drop, straight_lens, never, [1] * L), L)
    assert (b1.layer, b2.layer, b3.layer) == (None, None, None)
    assert "no early run" in b1.evidence["reason"]
    assert "no knee" in b2.evidence["reason"]
    assert "never" in b3.evidence["reason"]
    assert stage_records([b1, b2, b3], L) == []
    # a catastrophic layer 0 whose fall is gradual is not sharp
    gradual = [6.0, 3.0, 1.5, 0.75, 0.37, 0.19, 0.09, 0.05]
    b1 = infer_stages(build(gradual, straight_lens, never, [1] * L), L)[0]
    assert b1.layer is None
    assert b1.estimate is not None
    assert "not sharp" in b1.evidence["reason"]
    # too few neurons: a surplus of one suppression neuron is no evidence
    b3 = infer_stages(build(flat_drop, straight_lens, [0] * L, [0] * 6 + [1, 1]), L)[2]
    assert b3.layer is None
    assert b3.estimate == 6
    assert "too few neurons" in b3.evidence["reason"]


def test_calibrated_neuron_counts_are_preferred() -> None:
    records = build(CATASTROPHIC_THEN_LOW, HIGH_THEN_COLLAPSE, PRED, SUPP)
    calibrated = build(CATASTROPHIC_THEN_LOW, HIGH_THEN_COLLAPSE, [0] * L,
                       [0, 0, 0, 0, 0, 4, 5, 6], calibrated=True)
    both = pl.concat([records, calibrated.filter(pl.col("metric").str.ends_with("_cal"))])
    b3 = infer_stages(both, L)[2]
    assert b3.layer == 5  # the calibrated counts, not the fixed ones (which say 6)
    assert b3.evidence["counts"] == "calibrated"
    assert "note" not in b3.evidence


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
    with pytest.raises(SpecError, match="sequence means lack"):
        infer_stages(records, L, pl.DataFrame({"metric": ["x"], "value": [1.0]}))


# --------------------------------------------------------------------------- ordering


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(4, 12))
def test_clear_boundaries_are_always_ordered(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    steps = sorted(rng.integers(1, n, 3))
    drop = [float(v) for v in np.where(np.arange(n) < steps[0], 5.0, 0.2)
            * rng.uniform(0.5, 1.5, n)]
    lens = [float(v) for v in np.where(np.arange(n + 1) <= steps[1], 8.0, 0.5)
            * rng.uniform(0.7, 1.3, n + 1)]
    lens[-1] = 0.0
    supp = [float(v) for v in np.where(np.arange(n) >= rng.integers(1, n), 8, 0)]
    pred = [float(v) for v in rng.integers(0, 4, n)]
    b = infer_stages(build(drop, lens, pred, supp), n)
    layers = [x.layer for x in b if x.layer is not None]
    assert layers == sorted(layers)
    if b[0].clear and b[2].estimate is not None:
        assert b[2].estimate >= b[0].layer  # type: ignore[operator]
    if b[1].clear and b[2].estimate is not None:
        assert b[2].estimate >= b[1].layer  # type: ignore[operator]


# --------------------------------------------------------------------------- bootstrap


def sequence_table(curves: dict[tuple[str, str | None], np.ndarray]) -> pl.DataFrame:
    """Per-sequence means: curves[(metric, component)] is [n_sequences, n_positions]."""
    rows = []
    for (metric, component), values in curves.items():
        for s, row in enumerate(values):
            rows += [{"metric": metric, "layer": i, "component": component, "head": None,
                      "sequence": s, "value": float(v)} for i, v in enumerate(row)]
    return pl.DataFrame(rows, schema={"metric": pl.String, "layer": pl.Int32,
                                      "component": pl.String, "head": pl.Int32,
                                      "sequence": pl.Int32, "value": pl.Float64})


def records_from_sequences(table: pl.DataFrame, n: int) -> pl.DataFrame:
    """The records a run with these per-sequence means stores: means over sequences."""
    means = table.group_by("metric", "component", "layer").agg(pl.col("value").mean())
    records = [Record.of(m, v, 10, layer=layer, component=c)
               for m, c, layer, v in means.iter_rows()]
    records += [Record.of("neurons.n_prediction_cal", 0, 64, layer=i) for i in range(n)]
    records += [Record.of("neurons.n_suppression_cal", 10 if i >= n - 2 else 0, 64, layer=i)
                for i in range(n)]
    return pl.from_arrow(records_to_table(records))  # type: ignore[return-value]


def knee_sequences(n_seq: int, n: int, knees: list[int], noise: float,
                   seed: int) -> pl.DataFrame:
    """Each sequence: drop KL catastrophic at layer 0; lens KL a plateau through its own knee
    (drawn from `knees`), then falling; multiplicative noise."""
    rng = np.random.default_rng(seed)
    lens = np.zeros((n_seq, n + 1))
    for s in range(n_seq):
        knee = knees[s % len(knees)]
        points = np.arange(n + 1)
        lens[s] = np.where(points <= knee, 10.0, 10.0 * 0.5 ** (points - knee))
    lens *= rng.lognormal(0, noise, lens.shape)
    lens[:, -1] = 0.0
    drop = np.where(np.arange(n) == 0, 6.0, 0.2) * rng.lognormal(0, noise, (n_seq, n))
    return sequence_table({("logit_lens.kl_to_final", None): lens,
                           ("intervention.kl", "drop"): drop})


def test_resampled_curves_match_a_slow_loop() -> None:
    table = knee_sequences(7, 6, [3], 0.3, seed=1)
    table = table.filter(~((pl.col("sequence") == 2) & (pl.col("layer") == 1)))  # a gap
    keys, fast = resampled_curves(table, n_resamples=25, seed=4)
    sequences = sorted(table["sequence"].unique().to_list())
    draws = np.random.default_rng(4).integers(0, len(sequences), size=(25, len(sequences)))
    for r in range(25):
        drawn = pl.DataFrame({"sequence": [sequences[i] for i in draws[r]]},
                             schema={"sequence": pl.Int32})
        slow = (drawn.join(table, on="sequence")
                .group_by("metric", "component", "layer").agg(pl.col("value").mean()))
        for metric, component, layer, value in slow.iter_rows():
            key = f"{metric}[{component}]" if component else metric
            assert fast[r, keys.index((key, layer))] == pytest.approx(value, rel=1e-12)
        assert slow.height == len(keys)


def test_interval_covers_the_sequences_spread_and_is_seeded() -> None:
    n = 12
    tight = knee_sequences(24, n, [6], 0.05, seed=0)
    spread = knee_sequences(24, n, [4, 6, 8], 0.05, seed=0)
    for table, lo_max, hi_min in ((tight, 6, 6), (spread, 5, 7)):
        records = records_from_sequences(table, n)
        b1, b2, b3 = infer_stages(records, n, table, n_resamples=100)
        assert b2.interval is not None
        assert b2.interval[0] <= lo_max
        assert b2.interval[1] >= hi_min
        assert b2.interval[0] <= b2.estimate <= b2.interval[1]  # type: ignore[operator]
        assert b1.interval == (1, 1)
        assert b2.evidence["bootstrap"]["n_resamples"] == 100
        assert b2.evidence["bootstrap"]["n_sequences"] == 24
        assert 0.0 <= b2.evidence["bootstrap"]["clear_fraction"] <= 1.0
        assert b3.interval is not None
    tight_b2 = infer_stages(records_from_sequences(tight, n), n, tight, n_resamples=100)[1]
    assert tight_b2.interval == (6, 6)
    again = infer_stages(records_from_sequences(spread, n), n, spread, n_resamples=100)[1]
    first = infer_stages(records_from_sequences(spread, n), n, spread, n_resamples=100)[1]
    assert again.interval == first.interval
    assert again.evidence["bootstrap"] == first.evidence["bootstrap"]


# --------------------------------------------------------------------------- null model


@pytest.fixture(scope="module")
def random_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.DataFrame, pl.DataFrame]:
    from compute.metrics.base import EngineOptions
    from compute.models import ModelSpec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    arch = dict(n_layers=6, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=500,
                n_ctx=64, act_fn="gelu_new", normalization_type="LN")
    path: Path = tmp_path_factory.mktemp("null") / "t.npy"
    np.save(path, np.random.default_rng(0).integers(1, 500, (8, 32)))
    config = RunConfig(model=ModelSpec(source="random", name="null-6l", architecture=arch,
                                       seed=3),
                       tokens=TokenSpec(source="npy", path=str(path), n_sequences=0,
                                        seq_len=0),
                       families=("intervention", "logit_lens", "neurons"),
                       options=EngineOptions(batch_size=8))
    result = compute_run(config)
    return (pl.from_arrow(result.records),  # type: ignore[return-value]
            pl.from_arrow(result.sequence_means))


def test_a_random_model_has_no_clear_boundary(
        random_run: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    records, sequences = random_run
    assert sequences.height > 0
    boundaries = infer_stages(records, 6, sequences, n_resamples=50)
    for b in boundaries:
        assert not b.clear, (b.index, b.evidence)
        assert b.evidence["reason"]
        assert b.evidence["bootstrap"]["clear_fraction"] <= 0.1
    drop0 = records.filter((pl.col("metric") == "intervention.kl")
                           & (pl.col("component") == "drop") & (pl.col("layer") == 0))
    assert drop0["value"][0] < CATASTROPHIC_KL  # why boundary 1 is not clear
    assert math.isfinite(boundaries[0].sharpness or 0.0)
