"""How well each pruning predictor ranks the measured drops, per model (docs/metrics.md,
`pruning_drops.spearman_*`).

Over the starts l of one width n, Spearman's rank correlation between a predictor's per-block
means (block influence, d(l, n) all-token or last-token) and the measured KL of dropping those
blocks, on the run's sequences; its interval is the seeded percentile bootstrap over sequences
of `compute.bootstrap` (the same draws: numpy PCG64, `BOOTSTRAP_SEED`, a resample of n
sequences with replacement per draw, every per-layer mean recomputed from the drawn sequences'
means), vectorised over the draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compute.records import Record

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
BOOTSTRAP_CI = 0.9
# The predictors scored, by the name of their internal accumulator key (the `pruning` family's
# metric name) and the metric-name stem of their score.
PREDICTORS = ("block_influence", "angular_distance", "angular_distance_last")


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis (every bootstrap draw at once: scipy's ranks, ties
    given their mean rank); NaN where either side is constant."""
    from scipy.stats import rankdata  # on first use: the engine's imports need no scipy.stats

    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra * ra).sum(-1) * (rb * rb).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def bootstrap_weights(n_sequences: int, n_resamples: int, seed: int) -> np.ndarray:
    """[resamples, sequences]: how often each sequence is drawn, the draws of
    `compute.bootstrap.bootstrap_over_sequences`."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, n_sequences))
    for r in range(n_resamples):
        drawn = rng.integers(0, n_sequences, size=n_sequences)
        out[r] = np.bincount(drawn, minlength=n_sequences)
    return out


def score_records(
    family: str,
    keys: Sequence[tuple[str, int]],
    means: np.ndarray,
    widths: Sequence[int],
    n_layers: int,
) -> list[Record]:
    """The Spearman rows of every (predictor, width): `<family>.spearman_<predictor>_<n>` with
    `_low` / `_high` the bootstrap interval. `keys` (metric, start) and `means` [sequences, keys]
    hold the per-sequence means of the measured `kl_<n>` and of the predictors under internal
    names `_<predictor>_<n>` (block influence: `_block_influence_1`). A pair with a constant
    side (no ranking to compare, e.g. fewer than 3 starts) gets no rows."""
    slot = {key: i for i, key in enumerate(keys)}
    n_seq = means.shape[0]
    weights = bootstrap_weights(n_seq, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
    records = []
    for n in widths:
        starts = range(n_layers - n + 1)
        if len(starts) < 3:
            continue
        target = means[:, [slot[(f"kl_{n}", s)] for s in starts]]
        for predictor in PREDICTORS:
            if predictor == "block_influence" and n != 1:
                continue
            found = [slot.get((f"_{predictor}_{n}", s)) for s in starts]
            cols = [c for c in found if c is not None]
            if len(cols) < len(found):
                continue
            pred = means[:, cols]
            rho = float(spearman(pred.mean(0), target.mean(0)))
            if not np.isfinite(rho):
                continue
            draws = spearman(weights @ pred / n_seq, weights @ target / n_seq)
            draws = draws[np.isfinite(draws)]
            name = f"{family}.spearman_{predictor}_{n}"
            spread = float(draws.std(ddof=1)) if draws.size > 1 else None
            records.append(Record.of(name, rho, n_seq, stderr=spread))
            if draws.size:
                low, high = np.quantile(draws, [(1 - BOOTSTRAP_CI) / 2, (1 + BOOTSTRAP_CI) / 2])
                records.append(Record.of(f"{name}_low", float(low), n_seq))
                records.append(Record.of(f"{name}_high", float(high), n_seq))
    return records
