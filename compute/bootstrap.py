"""A seeded percentile bootstrap over sequences (docs/metrics.md: uncertainty).

The sequence is the unit of uncertainty: a statistic of per-layer curves (a stage boundary, a
difference of two curves) gets its interval by resampling the run's sequences with replacement
and recomputing every per-layer mean as the mean of the resampled per-sequence means (a sequence
drawn twice counts twice). The per-sequence means are a run's `sequence_means` table
(`compute.metrics.base.SEQUENCE_MEANS_SCHEMA`; in the store, `service.store.sequence_means`).

>>> low, high, samples = bootstrap_over_sequences(seq, lambda curves: ..., seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from compute.errors import ComputeError

KEY = ("metric", "layer", "component", "head")
CURVE_SCHEMA = {
    "metric": pl.String,
    "layer": pl.Int64,
    "component": pl.String,
    "head": pl.Int64,
    "value": pl.Float64,
    "n": pl.Int64,
}


def sequence_matrix(
    seq_table: pl.DataFrame,
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """(keys, means [keys, sequences], has [keys, sequences], sequence ids): the table pivoted,
    one row per (metric, layer, component, head), one column per distinct sequence."""
    missing = [c for c in (*KEY, "sequence", "value") if c not in seq_table.columns]
    if missing:
        raise ComputeError(f"the per-sequence table lacks columns {', '.join(missing)}")
    table = seq_table.select(
        pl.col("metric").cast(pl.String),
        pl.col("layer").cast(pl.Int64),
        pl.col("component").cast(pl.String),
        pl.col("head").cast(pl.Int64),
        pl.col("sequence").cast(pl.Int64),
        pl.col("value").cast(pl.Float64),
    )
    if table.select(pl.struct(*KEY, "sequence").is_duplicated().any()).item():
        raise ComputeError(
            "the per-sequence table has a (metric, layer, component, head, sequence) more than once"
        )
    keys = table.select(KEY).unique(maintain_order=True).with_row_index("_key")
    sequences = np.unique(table["sequence"].to_numpy())
    indexed = table.join(keys, on=list(KEY), how="left", nulls_equal=True)
    rows = indexed["_key"].to_numpy().astype(np.int64)
    cols = np.searchsorted(sequences, indexed["sequence"].to_numpy())
    means = np.zeros((keys.height, len(sequences)))
    has = np.zeros((keys.height, len(sequences)), dtype=bool)
    means[rows, cols] = indexed["value"].to_numpy()
    has[rows, cols] = True
    return keys.drop("_key"), means, has, sequences


def curves_for(
    keys: pl.DataFrame, means: np.ndarray, has: np.ndarray, weights: np.ndarray
) -> pl.DataFrame:
    """Per-layer means with each sequence counted `weights[j]` times (keys none of whose
    sequences has weight are left out): columns metric, layer, component, head, value, n."""
    count = has.astype(np.float64) @ weights
    total = means @ weights  # means are 0 where a key lacks the sequence
    keep = count > 0
    return keys.filter(pl.Series(keep)).with_columns(
        pl.Series("value", total[keep] / count[keep], dtype=pl.Float64),
        pl.Series("n", count[keep].astype(np.int64), dtype=pl.Int64),
    )


def bootstrap_over_sequences(
    seq_table: pl.DataFrame,
    statistic: Callable[[pl.DataFrame], float | None],
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    ci: float = 0.9,
) -> tuple[float | None, float | None, np.ndarray]:
    """A percentile bootstrap interval of `statistic` over sequences.

    Each of `n_resamples` resamples draws as many sequences as the table has, with replacement
    (numpy's PCG64 seeded with `seed`: the same seed, the same samples), recomputes every
    per-layer mean as the mean of the drawn per-sequence means and calls `statistic` on those
    curves (a frame with columns metric, layer, component, head, value, n = sequences drawn).
    A statistic may answer None (e.g. no boundary found): such resamples are left out of the
    interval. Returns (low, high, samples): the (1-ci)/2 and (1+ci)/2 quantiles (numpy's
    linear interpolation) of the non-None samples, None and None if there are none.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be within (0, 1), got {ci}")
    keys, means, has, sequences = sequence_matrix(seq_table)
    n = len(sequences)
    if n == 0:
        raise ComputeError("the per-sequence table is empty: nothing to resample")
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_resamples):
        drawn = rng.integers(0, n, size=n)
        weights = np.bincount(drawn, minlength=n).astype(np.float64)
        value = statistic(curves_for(keys, means, has, weights))
        if value is not None:
            samples.append(float(value))
    out = np.asarray(samples, dtype=np.float64)
    if out.size == 0:
        return None, None, out
    low, high = np.quantile(out, [(1.0 - ci) / 2.0, (1.0 + ci) / 2.0])
    return float(low), float(high), out
