"""The head-stability study's claim computations (scripts/study_head_stability.py) on synthetic
frames whose answer is known by construction."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import polars as pl
import pytest

NB = 200  # bootstrap resamples: enough for intervals of synthetic data this clear
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "study_head_stability.py"


@pytest.fixture(scope="module")
def study() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("study_head_stability", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def synthetic_heads(*, middle: float, edge: float, deep_extra_dip: float = 0.0,
                    adamw_gain: float = 0.0, null_middle: float = 0.5,
                    null_edge: float = 0.5) -> pl.DataFrame:
    """Families hs{2,4,6}l-{adamw,adam} with 4 heads per layer; stability `middle` in the
    middle band, `edge` outside it (lower by `deep_extra_dip` in the middle of 6-layer
    models), AdamW higher by `adamw_gain`; +-0.01 head jitter that averages to zero."""
    rows = []
    jitter = [-0.01, 0.01, -0.005, 0.005]
    for depth in (2, 4, 6):
        for opt in ("adamw", "adam"):
            for layer in range(depth):
                rel = layer / (depth - 1)
                mid = 0.25 <= rel <= 0.75
                base = (middle - (deep_extra_dip if depth == 6 else 0.0)) if mid else edge
                for head in range(4):
                    rows.append({
                        "family": f"hs{depth}l-{opt}", "depth": depth, "optimizer": opt,
                        "layer": layer, "head": head, "relative_depth": rel,
                        "stability": base + (adamw_gain if opt == "adamw" else 0.0)
                        + jitter[head],
                        "null": (null_middle if mid else null_edge) + jitter[head],
                    })
    return pl.DataFrame(rows)


def test_verdict_reads_the_interval_against_the_predicted_side(study: ModuleType) -> None:
    assert study.verdict(0.1, 0.3, ">0") == "holds"
    assert study.verdict(-0.3, -0.1, ">0") == "does not hold"
    assert study.verdict(-0.1, 0.2, ">0") == "cannot tell"
    assert study.verdict(-0.3, -0.1, "<0") == "holds"
    assert study.verdict(0.1, 0.3, "<0") == "does not hold"
    with pytest.raises(ValueError, match="predicted"):
        study.verdict(0.0, 1.0, "0")


def test_bootstrap_is_exact_on_constants_and_covers_the_mean(study: ModuleType) -> None:
    assert study.bootstrap_mean(np.full(5, 0.7)) == pytest.approx((0.7, 0.7, 0.7))
    values = np.random.default_rng(1).normal(2.0, 1.0, 400)
    est, low, high = study.bootstrap_mean(values, n_boot=1_000)
    assert est == pytest.approx(values.mean())
    half = 1.96 * values.std() / math.sqrt(len(values))
    assert low == pytest.approx(est - half, abs=0.03)
    assert high == pytest.approx(est + half, abs=0.03)
    with pytest.raises(ValueError, match="stratum"):
        study.bootstrap([np.array([])], np.mean)


def test_fisher_pool_matches_the_closed_form(study: ModuleType) -> None:
    est, low, high = study.fisher_pool(np.array([0.5]), np.array([28]))
    z, half = math.atanh(0.5), 1.959963984540054 / 5
    assert (est, low, high) == pytest.approx((0.5, math.tanh(z - half), math.tanh(z + half)))
    # equal weights: the pooled z is the mean z
    est, *_ = study.fisher_pool(np.array([0.2, 0.6]), np.array([4, 4]))
    assert est == pytest.approx(math.tanh((math.atanh(0.2) + math.atanh(0.6)) / 2))
    with pytest.raises(ValueError, match="n >= 4"):
        study.fisher_pool(np.array([0.1]), np.array([3]))


def test_claim_1_middle_dip_and_distinctness(study: ModuleType) -> None:
    heads = synthetic_heads(middle=0.5, edge=0.8, null_middle=0.4, null_edge=0.7)
    stability, excess, distinct = study.claim_1(heads, n_boot=NB)
    assert stability.estimate == pytest.approx(-0.3)
    assert stability.verdict == "holds"
    assert set(stability.parts) == {"hs4l-adam", "hs4l-adamw", "hs6l-adam", "hs6l-adamw"}
    assert excess.estimate == pytest.approx(0.0, abs=1e-12)  # the null dips as much
    assert (excess.low, excess.high) == pytest.approx((0.0, 0.0), abs=1e-12)
    assert distinct.estimate == pytest.approx(0.3)  # 1 - null: middle 0.6, edge 0.3
    assert distinct.verdict == "holds"
    flat = study.claim_1(synthetic_heads(middle=0.8, edge=0.5), n_boot=NB)[0]
    assert flat.verdict == "does not hold"


def test_claim_2_deeper_dip(study: ModuleType) -> None:
    deeper = study.claim_2(synthetic_heads(middle=0.6, edge=0.8, deep_extra_dip=0.1), n_boot=NB)
    assert deeper.estimate == pytest.approx(-0.1)
    assert deeper.verdict == "holds"
    same = study.claim_2(synthetic_heads(middle=0.6, edge=0.8), n_boot=NB)
    assert same.estimate == pytest.approx(0.0, abs=1e-12)


def test_claim_3_pools_deeper_layers_only(study: ModuleType) -> None:
    rows = []
    for depth in (2, 4, 6):
        for layer in range(depth):
            rel = layer / (depth - 1)
            rows.append({"family": f"hs{depth}l-adamw", "layer": layer, "relative_depth": rel,
                         "n_heads": 4, "pearson": -0.8 if rel >= 0.5 else 0.9,
                         "spearman": -0.4 if rel >= 0.5 else 1.0})
    claim = study.claim_3(pl.DataFrame(rows))
    assert claim.estimate == pytest.approx(-0.8)  # the early layers' +0.9 are left out
    assert len(claim.parts) == 1 + 2 + 3
    half = 1.959963984540054 / math.sqrt(6)
    assert claim.high == pytest.approx(math.tanh(math.atanh(-0.8) + half))
    assert claim.verdict == "holds"
    ranks = study.claim_3_spearman(pl.DataFrame(rows), n_boot=NB)
    assert (ranks.estimate, ranks.low, ranks.high) == pytest.approx((-0.4, -0.4, -0.4))


def test_claim_4_weight_decay_gain(study: ModuleType) -> None:
    claim = study.claim_4(synthetic_heads(middle=0.6, edge=0.8, adamw_gain=0.05), n_boot=NB)
    assert claim.estimate == pytest.approx(0.05)
    assert claim.parts == pytest.approx({"2 layers": 0.05, "4 layers": 0.05, "6 layers": 0.05})
    assert claim.verdict == "holds"
    excess = study.claim_4(synthetic_heads(middle=0.6, edge=0.8, adamw_gain=0.05)
                           .with_columns((pl.col("stability") - pl.col("null")).alias("excess")),
                           n_boot=NB, column="excess")
    assert excess.claim == "4'"
    assert excess.estimate == pytest.approx(0.05)
    assert study.claim_4(
        synthetic_heads(middle=0.6, edge=0.8, adamw_gain=-0.05), n_boot=NB).verdict == (
        "does not hold"
    )


def test_claim_5_residual_above_heads(study: ModuleType) -> None:
    layers = pl.DataFrame({
        "family": ["a", "a", "b"], "cka_linear": [0.9, 0.85, 0.95],
        "stability": [0.7, 0.65, 0.75],
    })
    claim = study.claim_5(layers, n_boot=NB)
    assert claim.estimate == pytest.approx(0.2)
    assert claim.parts == pytest.approx({"a": 0.2, "b": 0.2})
    assert claim.verdict == "holds"
