"""Uncertainty by sequence: `compute.reduce.MeanAccumulator` against numpy over per-token arrays
grouped by sequence (unequal counts per sequence, sequences split across batches and calls,
keys in different orders), the paired swap-minus-drop metric, and the seeded bootstrap over
sequences (`compute.bootstrap`)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from compute.bootstrap import bootstrap_over_sequences
from compute.errors import ComputeError
from compute.reduce import MeanAccumulator


def numpy_reference(tokens: dict[str, list[tuple[int, float]]]) -> dict[str, tuple]:
    """Per key: (value, stderr, n sequences, n tokens) from (sequence, value) pairs, the
    obvious way: group by sequence, mean per sequence, mean and std(ddof=1)/sqrt(n) of those."""
    out = {}
    for key, pairs in tokens.items():
        seqs = sorted({s for s, _ in pairs})
        means = np.array([np.mean([v for s, v in pairs if s == q]) for q in seqs])
        n = len(means)
        stderr = float(np.std(means, ddof=1) / np.sqrt(n)) if n > 1 else None
        out[key] = (float(np.mean(means)), stderr, n, len(pairs))
    return out


def assert_matches(acc: MeanAccumulator, tokens: dict[str, list[tuple[int, float]]]) -> None:
    want = numpy_reference(tokens)
    got = acc.results()
    assert set(got) == {(k,) for k in want}
    for key, (value, stderr, n, count) in want.items():
        stat = got[(key,)]
        assert stat.n == n, key
        assert stat.tokens == count, key
        assert math.isclose(stat.value, value, rel_tol=1e-9, abs_tol=1e-12), key
        if stderr is None:
            assert stat.stderr is None
        else:
            assert stat.stderr is not None
            assert math.isclose(stat.stderr, stderr, rel_tol=1e-9, abs_tol=1e-12), key
        assert acc.result((key,)) == stat


def test_equal_batches_split_over_several_batches_and_calls() -> None:
    """The engine's path: batch-major rows of equal-length sequences; 7 sequences in batches
    of 3, 3, 1; key b arrives in two calls per batch (its sums add up per sequence)."""
    rng = np.random.default_rng(0)
    acc = MeanAccumulator("cpu", 7)
    tokens: dict[str, list[tuple[int, float]]] = {"a": [], "b": []}
    per_seq = 5
    for first, size in ((0, 3), (3, 3), (6, 1)):
        acc.start_batch(first, size)
        # each sequence has its own offset: correlated tokens, as in a real run
        offsets = rng.normal(size=size) * 3
        block = rng.normal(size=(2, size, per_seq)) + offsets[None, :, None]
        acc.add_many([("a",), ("b",)], torch.tensor(block.reshape(2, -1), dtype=torch.float32))
        extra = rng.normal(size=(size, 2)) + offsets[:, None]
        acc.add(("b",), torch.tensor(extra.reshape(-1), dtype=torch.float32))
        for j in range(size):
            f32 = block.astype(np.float32).astype(np.float64)
            tokens["a"] += [(first + j, v) for v in f32[0, j]]
            tokens["b"] += [(first + j, v) for v in f32[1, j]]
            tokens["b"] += [(first + j, v) for v in extra.astype(np.float32)[j].astype(float)]
    assert_matches(acc, tokens)
    # the sequence, not the token, is the unit: 7 sequences, 35 / 49 tokens
    assert acc.result(("a",)).n == 7
    assert acc.result(("a",)).tokens == 35
    assert acc.result(("b",)).tokens == 49


def test_unequal_counts_per_sequence_by_ids_and_repeated_sequences() -> None:
    """Values tagged with their sequence: any count per sequence, a sequence split across
    calls, sequences out of order, a key one sequence never reaches."""
    rng = np.random.default_rng(1)
    acc = MeanAccumulator("cpu")
    tokens: dict[str, list[tuple[int, float]]] = {"x": [], "y": []}
    for _ in range(4):
        n = int(rng.integers(1, 12))
        ids = rng.integers(0, 6, size=n)
        values = rng.normal(size=(2, n)) * 2 + ids[None, :]
        acc.add_many([("x",), ("y",)], torch.tensor(values), sequence_ids=ids)
        tokens["x"] += list(zip(ids.tolist(), values[0].tolist(), strict=True))
        tokens["y"] += list(zip(ids.tolist(), values[1].tolist(), strict=True))
    acc.add(("y",), torch.tensor([100.0, 101.0, 102.0]), sequence_ids=torch.tensor([9, 9, 9]))
    tokens["y"] += [(9, 100.0), (9, 101.0), (9, 102.0)]
    assert_matches(acc, tokens)
    keys, means, has = acc.sequence_means()
    assert keys == [("x",), ("y",)]
    assert has[9].tolist() == [False, True]
    assert means[9, 1] == 101.0


def test_value_is_mean_of_sequence_means_not_token_mean() -> None:
    """Sequence 0 has 1 value, sequence 1 has 3: the mean is (0 + 2) / 2 = 1, not 1.5."""
    acc = MeanAccumulator()
    acc.add(("k",), torch.tensor([0.0, 2.0, 2.0, 2.0]), sequence_ids=[0, 1, 1, 1])
    stat = acc.result(("k",))
    assert stat.value == 1.0
    assert stat.n == 2
    assert stat.tokens == 4
    assert stat.stderr == pytest.approx(np.std([0.0, 2.0], ddof=1) / np.sqrt(2))


def test_one_sequence_has_no_stderr_and_nonfinite_values_are_refused() -> None:
    acc = MeanAccumulator()
    acc.start_batch(0, 1)
    acc.add(("k",), torch.tensor([1.0, 2.0, 3.0]))
    assert acc.result(("k",)).stderr is None
    assert acc.result(("k",)).n == 1
    acc.add(("bad",), torch.tensor([1.0, float("nan"), 3.0]))
    with pytest.raises(ComputeError, match="non-finite"):
        acc.results()


def test_rows_must_split_evenly_and_a_batch_must_be_started() -> None:
    acc = MeanAccumulator()
    with pytest.raises(ComputeError, match="start_batch"):
        acc.add(("k",), torch.ones(4))
    acc.start_batch(0, 3)
    with pytest.raises(ComputeError, match="split evenly"):
        acc.add(("k",), torch.ones(4))


def test_derive_is_the_per_token_difference_averaged_per_sequence() -> None:
    """swap - drop via per-sequence sums equals the per-token difference grouped by sequence,
    and its stderr is the paired one (smaller than either alone when they move together)."""
    rng = np.random.default_rng(2)
    acc = MeanAccumulator("cpu", 6)
    per_token: list[tuple[int, float]] = []
    for first in (0, 3):
        acc.start_batch(first, 3)
        common = rng.normal(size=(3, 4)) * 5  # shared by both: cancels in the difference
        swap = common + rng.normal(size=(3, 4)) * 0.1 + 0.5
        drop = common + rng.normal(size=(3, 4)) * 0.1
        acc.add_many([("swap",), ("drop",)], torch.tensor(np.stack([swap, drop]).reshape(2, -1)))
        per_token += [(first + j, float(swap[j, t] - drop[j, t]))
                      for j in range(3) for t in range(4)]
    acc.derive(("diff",), [(1.0, ("swap",)), (-1.0, ("drop",))])
    value, stderr, n, count = numpy_reference({"d": per_token})["d"]
    got = acc.result(("diff",))
    assert got.n == n == 6
    assert got.tokens == count
    assert got.value == pytest.approx(value, rel=1e-9)
    assert got.stderr == pytest.approx(stderr, rel=1e-9)
    assert got.stderr < 0.2 * acc.result(("swap",)).stderr  # type: ignore[operator]


def test_derive_refuses_values_of_different_tokens() -> None:
    acc = MeanAccumulator()
    acc.add(("a",), torch.ones(3), sequence_ids=[0, 0, 1])
    acc.add(("b",), torch.ones(3), sequence_ids=[0, 1, 1])
    with pytest.raises(ComputeError, match="same tokens"):
        acc.derive(("c",), [(1.0, ("a",)), (-1.0, ("b",))])


def test_many_keys_grow_without_losing_sums() -> None:
    """Keys added one call at a time past the column capacity (16, 32, ...) keep their sums."""
    acc = MeanAccumulator("cpu", 2)
    acc.start_batch(0, 2)
    for i in range(70):
        acc.add((f"k{i}",), torch.tensor([float(i), float(i), i + 2.0, i + 2.0]))
    got = acc.results()
    assert [got[(f"k{i}",)].value for i in range(70)] == [i + 1.0 for i in range(70)]
    assert all(got[(f"k{i}",)].stderr == pytest.approx(1.0) for i in range(70))


# --------------------------------------------------------------------------- bootstrap


def synthetic_table(n_sequences: int, seed: int) -> pl.DataFrame:
    """Per-sequence means of two metrics over 4 layers: normal around known layer means."""
    rng = np.random.default_rng(seed)
    rows = []
    for layer in range(4):
        for s in range(n_sequences):
            rows.append({"metric": "intervention.kl", "layer": layer, "component": "drop",
                         "head": None, "sequence": s, "value": layer + rng.normal()})
            rows.append({"metric": "logit_lens.kl_to_final", "layer": layer, "component": None,
                         "head": None, "sequence": s, "value": 10.0 - layer})
    return pl.DataFrame(rows, schema={"metric": pl.String, "layer": pl.Int32,
                                      "component": pl.String, "head": pl.Int32,
                                      "sequence": pl.Int32, "value": pl.Float64})


def drop_kl_at(layer: int):
    def statistic(curves: pl.DataFrame) -> float:
        row = curves.filter((pl.col("metric") == "intervention.kl") & (pl.col("layer") == layer))
        return float(row["value"].item())
    return statistic


def test_bootstrap_interval_covers_the_true_mean_about_as_often_as_it_says() -> None:
    """90% intervals of a mean of 40 N(2, 1) per-sequence means, over 50 synthetic runs:
    coverage near 0.9 (binomial sd ~0.04), and width near 2 * 1.645 / sqrt(40)."""
    covered, widths = 0, []
    for seed in range(50):
        low, high, samples = bootstrap_over_sequences(
            synthetic_table(40, seed), drop_kl_at(2), n_resamples=200, seed=seed, ci=0.9)
        assert low is not None
        assert high is not None
        assert samples.shape == (200,)
        covered += low <= 2.0 <= high
        widths.append(high - low)
    assert 0.76 <= covered / 50 <= 0.99
    assert np.mean(widths) == pytest.approx(2 * 1.645 / np.sqrt(40), rel=0.15)


def test_bootstrap_is_deterministic_by_seed_and_resamples_whole_sequences() -> None:
    table = synthetic_table(12, 3)
    a = bootstrap_over_sequences(table, drop_kl_at(1), n_resamples=50, seed=7)
    b = bootstrap_over_sequences(table, drop_kl_at(1), n_resamples=50, seed=7)
    c = bootstrap_over_sequences(table, drop_kl_at(1), n_resamples=50, seed=8)
    assert np.array_equal(a[2], b[2])
    assert a[:2] == b[:2]
    assert not np.array_equal(a[2], c[2])
    # a constant curve stays constant under any resampling; n is the number of draws
    seen = []

    def lens(curves: pl.DataFrame) -> float:
        seen.append(curves)
        return float(curves.filter(pl.col("metric") == "logit_lens.kl_to_final")["value"].sum())
    low, high, _samples = bootstrap_over_sequences(table, lens, n_resamples=5, seed=0)
    assert low == high == pytest.approx(10 + 9 + 8 + 7)
    assert all(set(f["n"].to_list()) == {12} for f in seen)


def test_bootstrap_resample_mean_by_hand() -> None:
    """One resample, recomputed by hand with the same generator: the curve is the mean of the
    drawn sequences' means, each counted as often as it was drawn."""
    table = synthetic_table(5, 4)
    _, _, samples = bootstrap_over_sequences(table, drop_kl_at(3), n_resamples=1, seed=11)
    drawn = np.random.default_rng(11).integers(0, 5, size=5)
    per_seq = table.filter((pl.col("metric") == "intervention.kl") & (pl.col("layer") == 3)
                           ).sort("sequence")["value"].to_numpy()
    assert samples[0] == pytest.approx(per_seq[drawn].mean())


def test_bootstrap_statistic_may_answer_none() -> None:
    table = synthetic_table(6, 5)
    low, high, samples = bootstrap_over_sequences(table, lambda c: None, n_resamples=10)
    assert low is None
    assert high is None
    assert samples.size == 0
    with pytest.raises(ComputeError, match="empty"):
        bootstrap_over_sequences(table.head(0), drop_kl_at(0))
    with pytest.raises(ValueError, match="ci"):
        bootstrap_over_sequences(table, drop_kl_at(0), ci=1.5)
