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
                    null_edge: float = 0.5, peer_middle: float = 0.5, peer_edge: float = 0.5,
                    seed_gain: float = 0.0, first_layer: float | None = None,
                    seeds: tuple[int, ...] = (0, 1, 2, 3)) -> pl.DataFrame:
    """Families hs{2,4,6}l-{adamw,adam}, each seed the anchor once, 4 heads per layer;
    stability `middle` in the middle band, `edge` outside it (`first_layer` at layer 0 if
    given; lower by `deep_extra_dip` in the middle of 6-layer models), AdamW higher by
    `adamw_gain` plus `seed_gain` x seed (so the paired gain varies by seed); +-0.01 head
    jitter that averages to zero."""
    rows = []
    jitter = [-0.01, 0.01, -0.005, 0.005]
    for depth in (2, 4, 6):
        for opt in ("adamw", "adam"):
            for seed in seeds:
                for layer in range(depth):
                    rel = layer / (depth - 1)
                    mid = 0.25 <= rel <= 0.75
                    base = (middle - (deep_extra_dip if depth == 6 else 0.0)) if mid else edge
                    if layer == 0 and first_layer is not None:
                        base = first_layer
                    gain = adamw_gain + seed_gain * seed if opt == "adamw" else 0.0
                    for head in range(4):
                        rows.append({
                            "family": f"hs{depth}l-{opt}", "depth": depth, "optimizer": opt,
                            "seed": seed, "layer": layer, "head": head, "relative_depth": rel,
                            "stability": base + gain + jitter[head],
                            "null": (null_middle if mid else null_edge) + jitter[head],
                            "peer_similarity": (peer_middle if mid else peer_edge)
                            + jitter[head],
                            "ablation_kl": 1.0 + jitter[head],
                        })
    return pl.DataFrame(rows)


def layers_of(heads: pl.DataFrame, cka: float = 0.9, cka_null: float = 0.8) -> pl.DataFrame:
    """The per-layer frame the API gives: head means, and a residual CKA with its null."""
    return (heads.group_by("family", "depth", "optimizer", "seed", "layer", "relative_depth")
            .agg(pl.col("stability", "null").mean())
            .with_columns(pl.lit(cka).alias("cka_linear"),
                          pl.lit(cka_null).alias("cka_null_linear"))
            .sort("family", "seed", "layer"))


def cubes(study: ModuleType, heads: pl.DataFrame) -> dict[str, object]:
    return study.cubes_of(heads, layers_of(heads))


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


def test_t_pool_is_the_t_interval_of_the_mean_z(study: ModuleType) -> None:
    from scipy.stats import t

    r = np.array([-0.2, -0.5, -0.7, -0.1])
    z = np.arctanh(r)
    est, low, high = study.t_pool(z)
    half = t.ppf(0.975, 3) * z.std(ddof=1) / 2
    assert (est, low, high) == pytest.approx(
        (math.tanh(z.mean()), math.tanh(z.mean() - half), math.tanh(z.mean() + half)))
    # units that agree give a narrow interval, units that disagree a wide one
    assert study.t_pool(np.array([0.5, 0.51, 0.49]))[2] < study.t_pool(
        np.array([-0.5, 0.5, 1.5]))[2]
    with pytest.raises(ValueError, match="two units"):
        study.t_pool(np.array([0.3]))


def test_cochran_q_against_its_formula(study: ModuleType) -> None:
    z, n = np.array([0.1, 0.5, -0.2]), np.array([4, 8, 13])
    w = n - 3
    pooled = (w * z).sum() / w.sum()
    assert study.cochran_q(z, n) == pytest.approx(float((w * (z - pooled) ** 2).sum()))
    assert study.cochran_q(np.array([0.3, 0.3]), np.array([4, 4])) == pytest.approx(0.0)


def test_the_hierarchical_bootstrap_pairs_the_optimizers_by_seed(study: ModuleType) -> None:
    # AdamW beats Adam by 0.01 + 0.02 x seed: every seed pair agrees on the sign, so a paired
    # interval stays above zero; the per-anchor estimates are each seed's own gain
    heads = synthetic_heads(middle=0.6, edge=0.8, adamw_gain=0.01, seed_gain=0.02)
    claim = study.claim_4(cubes(study, heads), n_boot=NB)
    assert claim.estimate == pytest.approx(0.01 + 0.02 * 1.5)
    assert claim.per_anchor == pytest.approx({f"anchor s{s}": 0.01 + 0.02 * s
                                              for s in range(4)})
    assert 0.01 <= claim.low < claim.estimate < claim.high <= 0.07 + 1e-9
    assert claim.verdict == "holds"


def test_claim_1_middle_dip_with_and_without_layer_0(study: ModuleType) -> None:
    heads = synthetic_heads(middle=0.5, edge=0.8, null_middle=0.4, null_edge=0.7,
                            peer_middle=0.3, peer_edge=0.6)
    claims = {c.claim: c for c in study.claim_1(cubes(study, heads), n_boot=NB)}
    assert set(claims) == {"1a", "1a (no layer 0)", "1a'", "1a' (no layer 0)", "1b",
                           "1b (no layer 0)"}
    assert claims["1a"].estimate == pytest.approx(-0.3)
    assert claims["1a"].verdict == "holds"
    assert set(claims["1a"].parts) == {"hs4l-adam", "hs4l-adamw", "hs6l-adam", "hs6l-adamw"}
    assert claims["1a'"].estimate == pytest.approx(0.0, abs=1e-12)  # the null dips as much
    assert claims["1b"].estimate == pytest.approx(0.3)  # 1 - peer: middle 0.7, edge 0.4
    assert claims["1b"].verdict == "holds"
    # a dip carried by layer 0 alone is gone without it
    only_first = synthetic_heads(middle=0.8, edge=0.8, first_layer=0.95)
    by_name = {c.claim: c for c in study.claim_1(cubes(study, only_first), n_boot=NB)}
    assert by_name["1a"].estimate < -0.01
    assert by_name["1a (no layer 0)"].estimate == pytest.approx(0.0, abs=1e-12)
    flat = study.claim_1(cubes(study, synthetic_heads(middle=0.8, edge=0.5)), n_boot=NB)[0]
    assert flat.verdict == "does not hold"


def test_claim_2_deeper_dip(study: ModuleType) -> None:
    deeper = study.claim_2(cubes(study, synthetic_heads(middle=0.6, edge=0.8,
                                                        deep_extra_dip=0.1)), n_boot=NB)
    assert deeper.estimate == pytest.approx(-0.1)
    assert deeper.verdict == "holds"
    same = study.claim_2(cubes(study, synthetic_heads(middle=0.6, edge=0.8)), n_boot=NB)
    assert same.estimate == pytest.approx(0.0, abs=1e-12)


def test_claim_2_without_layer_0(study: ModuleType) -> None:
    # the edge is layer 0 at 0.95 and the last layers at 0.8: with layer 0 the 6-layer edge
    # mean holds less of it (1 of 4 edge layers against 1 of 2), so the dips differ by depth
    # through layer 0 alone; without it they are equal
    heads = synthetic_heads(middle=0.8, edge=0.8, first_layer=0.95)
    with_first = study.claim_2(cubes(study, heads), n_boot=NB)
    without = study.claim_2(cubes(study, heads), n_boot=NB, first_layer=False)
    assert (with_first.claim, without.claim) == ("2", "2 (no layer 0)")
    assert "layer 0 left out" in without.statistic
    assert with_first.estimate == pytest.approx(-0.15 / 4 + 0.15 / 2)
    assert without.estimate == pytest.approx(0.0, abs=1e-12)


def test_claim_3_pools_deeper_layers_with_layers_as_the_units(study: ModuleType) -> None:
    rows = []
    for depth in (2, 4, 6):
        for layer in range(depth):
            rel = layer / (depth - 1)
            for seed in range(3):  # three anchors per layer: one unit, their mean z
                r = (-0.8 + 0.1 * (seed - 1) if depth == 6 else -0.6) if rel >= 0.5 else 0.9
                rows.append({"family": f"hs{depth}l-adamw", "seed": seed, "layer": layer,
                             "relative_depth": rel, "n_heads": 4, "pearson": r,
                             "spearman": r})
    claim = study.claim_3(pl.DataFrame(rows))
    deeper_layers = 1 + 2 + 3
    assert len(claim.parts) == deeper_layers  # the early layers' +0.9 are left out
    z = []
    for depth in (2, 4, 6):
        for layer in range(depth):
            if layer / (depth - 1) >= 0.5:
                rs = [-0.8 + 0.1 * (s - 1) if depth == 6 else -0.6 for s in range(3)]
                z.append(np.mean(np.arctanh(rs)))
    assert claim.estimate == pytest.approx(math.tanh(np.mean(z)))
    assert f"t over {deeper_layers} layers" in claim.interval
    assert claim.verdict == "holds"
    assert study.claim_3(pl.DataFrame(rows), column="spearman").claim == "3'"


def test_claim_4_weight_decay_gain(study: ModuleType) -> None:
    claim = study.claim_4(cubes(study, synthetic_heads(middle=0.6, edge=0.8, adamw_gain=0.05)),
                          n_boot=NB)
    assert claim.estimate == pytest.approx(0.05)
    assert claim.parts == pytest.approx({"2 layers": 0.05, "4 layers": 0.05, "6 layers": 0.05})
    assert claim.verdict == "holds"
    excess = study.claim_4(cubes(study, synthetic_heads(middle=0.6, edge=0.8, adamw_gain=0.05)),
                           n_boot=NB, column="excess")
    assert excess.claim == "4'"
    assert excess.estimate == pytest.approx(0.05)
    worse = synthetic_heads(middle=0.6, edge=0.8, adamw_gain=-0.05)
    assert study.claim_4(cubes(study, worse), n_boot=NB).verdict == "does not hold"


def test_claim_5_scores_each_side_against_its_own_null_without_comparing_them(
        study: ModuleType) -> None:
    # a CKA and a pattern cosine are not on one scale: each side is value - its own null, in
    # its own units, and no row subtracts one side from the other
    heads = synthetic_heads(middle=0.7, edge=0.7, null_middle=0.4, null_edge=0.4)
    residual, head = study.claim_5(study.cubes_of(heads, layers_of(heads, 0.95, 0.9)),
                                   n_boot=NB)
    assert (residual.claim, head.claim) == ("5 (residual)", "5 (heads)")
    assert residual.estimate == pytest.approx(0.05, abs=1e-9)
    assert head.estimate == pytest.approx(0.3, abs=1e-9)
    assert residual.verdict == head.verdict == "holds"
    # a residual no further from its null than chance is scored on its own, whatever the heads
    below = study.claim_5(study.cubes_of(heads, layers_of(heads, 0.5, 0.6)), n_boot=NB)[0]
    assert below.estimate == pytest.approx(-0.1, abs=1e-9)
    assert below.verdict == "does not hold"
    assert {c.claim for c in study.claims({"heads": heads, "layers": layers_of(heads),
                                           "stability_importance": _no_correlations()},
                                          n_boot=NB)} >= {"5 (residual)", "5 (heads)"}


def _no_correlations() -> pl.DataFrame:
    """Two deeper layers' correlations, enough for claim 3's pool to run."""
    return pl.DataFrame([{"family": "hs4l-adamw", "seed": 0, "layer": layer,
                          "relative_depth": layer / 3, "n_heads": 4, "pearson": r,
                          "spearman": r} for layer, r in ((2, 0.1), (3, -0.1))])
