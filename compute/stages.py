"""stages.* — the four stages of inference, placed from a model's stored metrics.

(Longer than the ~500 lines a module should have, on purpose: this is one definition, the rule
of docs/metrics.md's stages.*, and its three boundaries and the bootstrap share private helpers
— split, one definition would be spread over files that only make sense together.)

Stages: 1 detokenization, 2 feature engineering, 3 prediction ensembling, 4 residual sharpening.
Boundary k is the first block of stage k+1, as a layer index l (0..L-1) and relative depth
l/(L-1). The rule is a pure, deterministic function of the run's records (per-layer means) and,
when the run has it, its per-sequence means table (for the bootstrap interval). docs/metrics.md
(stages.*) states it precisely; in short:

1. End of detokenization: where the early run of catastrophic drops ends — the first layer whose
   log(drop KL + 0.01) falls below the midpoint between layer 0's and the median layer's.
   Corroborating (they vote on "clear"): the same for 1 - drop top-1 agreement and for the swap
   KL and agreement. Clear if every earlier layer's drop KL is >= 1 nat, the step is sharp and
   the signals agree.
2. End of feature engineering: where the logit lens starts to converge. Signals: log(KL_i + 0.01)
   and 1 - top-1 agreement of the lens at points 1..L-1 (the embedding point 0 and the final
   point L, exact by definition, are left out), and log(KL_i + 0.01) of the tuned lens where the
   run has one, each fitted at every knee k by a plateau through
   point k followed by a straight decline or a lower plateau; the estimate is the knee where the
   fit to the lens KL gains most over a straight line (the others corroborate). Block k
   (whose output is point k+1) starts stage 3.
3. Start of residual sharpening: the first layer at or after max(boundary 1, boundary 2) from
   which suppression neurons outnumber prediction neurons in every later layer (width-calibrated
   counts when the run has them).

Each boundary carries an estimate (even when not clear), a sharpness (the change relative to the
curve's robust noise), whether it is clear (only clear boundaries get a `layer`), a range (the
spread of the agreeing signals' own positions), a seeded percentile bootstrap interval over
sequences and its evidence (each signal's own position, sharpness and value at the boundary,
and supporting curves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from compute.errors import SpecError
from compute.records import Record

STAGE_NAMES = (
    "detokenization",
    "feature_engineering",
    "prediction_ensembling",
    "residual_sharpening",
)

KL_FLOOR = 0.01  # nats added to a KL before its log: differences below it are not structure
CATASTROPHIC_KL = 1.0  # nats: the least drop KL of every detokenization layer
SHARPNESS_MIN = 3.0  # boundaries 1 and 2: least median sharpness of the primary signals
KNEE_GAIN_MIN = 0.5  # boundary 2: least gain of the lens-KL knee fit over a straight line
CONVERGENCE_MIN = math.log(2.0)  # boundary 2: the lens KL falls at least twofold past the knee
SUPPRESSION_EXCESS_MIN = 3  # boundary 3: least surplus of suppression neurons over the run
SUPPRESSION_Z_MIN = 1.0  # boundary 3: least surplus / sqrt(total count) over the run
NOISE_FLOOR = 0.01  # a curve's noise is at least this fraction of its change (sharpness <= 100)
N_RESAMPLES = 200
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.9

Curves = dict[str, dict[int, float]]  # "metric[component]" -> layer (or lens point) -> value


@dataclass
class Boundary:
    index: int  # 1..3: boundary k ends stage k
    layer: int | None  # first block of stage k+1, or None when no clear boundary
    relative_depth: float | None
    rule: str
    evidence: dict[str, Any] = field(default_factory=dict)
    estimate: int | None = None  # the rule's best position, clear or not
    sharpness: float | None = None
    range: tuple[int, int] | None = None  # hull of the signals' own positions (clear boundaries)
    interval: tuple[int, int] | None = None  # bootstrap percentile interval of the estimate

    @property
    def clear(self) -> bool:
        return self.layer is not None


@dataclass
class _Signal:
    """One curve's view of a boundary: its own best position and its change there."""

    name: str
    own: int | None  # the position this signal alone would choose
    sharpness: float | None  # at the boundary's estimate
    change: float | None  # contrast (boundary 1) or fitted decline (boundary 2), curve units


@dataclass
class _Placement:
    estimate: int | None
    clear: bool
    sharpness: float | None
    reason: str | None
    signals: list[_Signal] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- curves


def _key(metric: str, component: str | None) -> str:
    return f"{metric}[{component}]" if component else metric


def curves_of(records: pl.DataFrame) -> Curves:
    """Per-layer (per-point) curves of a record table: rows with a layer, no head, no neuron."""
    rows = records.filter(
        pl.col("head").is_null() & pl.col("neuron").is_null() & pl.col("layer").is_not_null()
    )
    out: Curves = {}
    for metric, component, layer, value in rows.select(
        "metric", "component", "layer", "value"
    ).iter_rows():
        out.setdefault(_key(metric, component), {})[int(layer)] = float(value)
    return out


def _series(curves: Curves, key: str, positions: range) -> np.ndarray | None:
    curve = curves.get(key, {})
    if any(p not in curve for p in positions):
        return None
    return np.array([curve[p] for p in positions], dtype=np.float64)


def _log_kl(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None else np.log(np.maximum(values, 0.0) + KL_FLOOR)


def _disagreement(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None else 1.0 - values


def _noise(residuals: list[np.ndarray], change: float) -> float:
    """Robust noise of a fit: 1.4826 x median |residual| over segments of >= 2 points (a single
    point fits itself exactly and says nothing about noise), at least NOISE_FLOOR x |change|."""
    pooled = np.concatenate([r for r in residuals if len(r) >= 2] or [np.zeros(0)])
    mad = 1.4826 * float(np.median(np.abs(pooled))) if len(pooled) else 0.0
    return max(mad, NOISE_FLOOR * abs(change), 1e-12)


def _first_max(values: np.ndarray) -> int:
    """Index of the largest value, the earliest on ties."""
    return int(np.argmax(values))


def _depth(layer: int, n_layers: int) -> float:
    return layer / (n_layers - 1) if n_layers > 1 else 0.0


def _tolerance(n_layers: int) -> int:
    return max(1, round(0.1 * n_layers))


def _agreeing(signals: list[Any], estimate: int, n_layers: int) -> list[Any]:
    """The signals whose own position is within the tolerance of `estimate`."""
    return [
        s for s in signals if s.own is not None and abs(s.own - estimate) <= _tolerance(n_layers)
    ]


def _unsharp_or_disagreeing(
    sharpness: float | None, agree: list[Any], signals: list[Any], estimate: int, n_layers: int
) -> str | None:
    """Why a placement is not clear by the two checks boundaries 1 and 2 share (in this order:
    sharpness, then agreement), or None."""
    if sharpness is None or sharpness < SHARPNESS_MIN:
        return f"not sharp: sharpness {sharpness or 0:.3g} < {SHARPNESS_MIN}"
    if 2 * len(agree) < len(signals):
        return (
            f"signals disagree: {len(agree)} of {len(signals)} place it within "
            f"{_tolerance(n_layers)} layer(s) of {estimate}"
        )
    return None


# --------------------------------------------------------------------------- boundary 1


def _early_run(y: np.ndarray) -> int | None:
    """Length of the early run: the first l >= 1 with y[l] below the midpoint between y[0] and
    the curve's median. None when y[0] is not above the median or nothing falls below."""
    middle = (float(y[0]) + float(np.median(y))) / 2
    if y[0] <= np.median(y):
        return None
    return next((i for i in range(1, len(y)) if y[i] < middle), None)


def _contrast_signal(name: str, y: np.ndarray, at: int | None) -> _Signal:
    """A curve's own early run, and at `at` its contrast min(y[:at]) - median(y[at:]) over its
    robust noise (residuals from the two segments' medians)."""
    if len(y) < 2:
        return _Signal(name, None, None, None)
    own = _early_run(y)
    if at is None or not 1 <= at < len(y):
        return _Signal(name, own, None, None)
    change = float(y[:at].min() - np.median(y[at:]))
    noise = _noise([y[:at] - np.median(y[:at]), y[at:] - np.median(y[at:])], change)
    return _Signal(name, own, change / noise, change)


def _detokenization(curves: Curves, n_layers: int) -> _Placement:
    blocks = range(n_layers)
    drop_kl = _series(curves, "intervention.kl[drop]", blocks)
    log_drop = _log_kl(drop_kl)
    drop_top1 = _disagreement(_series(curves, "intervention.top1_agreement[drop]", blocks))
    swaps = range(n_layers - 1)
    corroborating = {
        "drop_top1": drop_top1,
        "swap_kl": _log_kl(_series(curves, "intervention.kl[swap]", swaps)),
        "swap_top1": _disagreement(_series(curves, "intervention.top1_agreement[swap]", swaps)),
    }
    if drop_kl is None or log_drop is None or n_layers < 3:
        return _Placement(
            None,
            False,
            None,
            "needs intervention.kl[drop] for every layer of a model with >= 3 layers",
        )
    estimate = _early_run(log_drop)
    signals = [_contrast_signal("drop_kl", log_drop, estimate)]
    signals += [
        _contrast_signal(n, y, estimate)
        for n, y in corroborating.items()
        if y is not None and len(y) >= 2
    ]
    if estimate is None:
        return _Placement(
            None,
            False,
            None,
            "no early run: the drop KL of layer 0 is not above "
            "the median layer's, or never falls back",
            signals,
        )
    head_kl = float(drop_kl[:estimate].min())
    sharp = [
        s.sharpness
        for s in signals
        if s.name in ("drop_kl", "drop_top1") and s.sharpness is not None
    ]
    sharpness = float(np.median(sharp)) if sharp else None
    agree = _agreeing(signals, estimate, n_layers)
    reason: str | None
    if head_kl < CATASTROPHIC_KL:
        reason = (
            f"not catastrophic: dropping layer(s) 0..{estimate - 1} costs {head_kl:.3g} "
            f"nats at least, under {CATASTROPHIC_KL}"
        )
    else:
        reason = _unsharp_or_disagreeing(sharpness, agree, signals, estimate, n_layers)
    return _Placement(
        estimate,
        reason is None,
        sharpness,
        reason,
        signals,
        {"min_drop_kl_before": head_kl, "agreeing": [s.name for s in agree]},
    )


# --------------------------------------------------------------------------- boundary 2


def _fit(y: np.ndarray, x: np.ndarray, knee: int, shape: str) -> tuple[float, np.ndarray]:
    """A plateau at points <= knee, then (shape "decline") a straight decline or (shape "step")
    a lower plateau, fitted by least squares -> (fall from the plateau to the last point,
    residuals). Closed forms: a step is two means; a hinge y ~ a + b max(0, x - knee) solves
    its 2 x 2 normal equations."""
    after = x > knee
    if shape == "step":
        hi, lo = float(y[~after].mean()), float(y[after].mean())
        return hi - lo, y - np.where(after, lo, hi)
    t = np.maximum(0.0, x - knee)
    n, st, stt = len(y), float(t.sum()), float((t * t).sum())
    sy, sty = float(y.sum()), float((t * y).sum())
    det = n * stt - st * st
    slope = (n * sty - st * sy) / det
    level = (sy - slope * st) / n
    return -slope * float(t[-1]), y - (level + slope * t)


def _line_sse(y: np.ndarray, x: np.ndarray) -> float:
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / (xc * xc).sum())
    return float(((y - y.mean() - slope * xc) ** 2).sum())


def _knee_gains(y: np.ndarray, x: np.ndarray, knees: np.ndarray, shape: str) -> np.ndarray:
    """[knee]: 1 - SSE(fit) / SSE(straight line), for every knee at once; 0 where the fit does
    not fall or the line is exact (a straight curve has no knee). The same fits as `_fit`."""
    line = _line_sse(y, x)
    if line <= 1e-12 * max(1.0, float((y**2).sum())):
        return np.zeros(len(knees))
    after = x[None, :] > knees[:, None]
    if shape == "step":
        n_hi, n_lo = (~after).sum(1), after.sum(1)
        hi = np.where(~after, y, 0.0).sum(1) / n_hi
        lo = np.where(after, y, 0.0).sum(1) / n_lo
        fall = hi - lo
        fitted = np.where(after, lo[:, None], hi[:, None])
    else:
        t = np.maximum(0.0, x[None, :] - knees[:, None])
        n, st, stt = len(y), t.sum(1), (t * t).sum(1)
        sy, sty = float(y.sum()), t @ y
        slope = (n * sty - st * sy) / (n * stt - st * st)
        level = (sy - slope * st) / n
        fall = -slope * t[:, -1]
        fitted = level[:, None] + slope[:, None] * t
    sse = ((y[None, :] - fitted) ** 2).sum(1)
    return np.where(fall > 0, 1.0 - sse / line, 0.0)


def _knee_signal(
    name: str,
    y: np.ndarray,
    x: np.ndarray,
    knees: np.ndarray,
    at: int,
    shape: str,
    by_shape: dict[str, np.ndarray],
) -> _Signal:
    """A curve's own best knee (best of both shapes: `by_shape` holds its gains), and at knee
    `at` its fitted fall over the robust noise of the fit."""
    gains = np.maximum(*(by_shape[s] for s in SHAPES))
    best = _first_max(gains)
    own = int(knees[best]) if gains[best] > 0 else None
    change, residuals = _fit(y, x, at, shape)
    after = x > at
    noise = _noise([residuals[~after], residuals[after]], change)
    return _Signal(name, own, change / noise if change > 0 else 0.0, change)


SHAPES = ("decline", "step")


def _feature_engineering(curves: Curves, n_layers: int, start: int) -> _Placement:
    points = range(1, n_layers)  # the embedding point 0 and the final point L are left out
    lens_kl = _series(curves, "logit_lens.kl_to_final", points)
    primary = {
        "lens_kl": _log_kl(lens_kl),
        "lens_top1": _disagreement(_series(curves, "logit_lens.top1_agreement", points)),
        # where the run has a tuned lens: one more corroborating signal (it never places b_2)
        "tuned_kl": _log_kl(_series(curves, "tuned_lens.kl_to_final", points)),
    }
    used = {n: y for n, y in primary.items() if y is not None}
    if lens_kl is None or n_layers < 4:
        return _Placement(
            None,
            False,
            None,
            "needs logit_lens.kl_to_final at every point of a model with >= 4 layers",
        )
    x = np.arange(1, n_layers, dtype=np.float64)
    knees = np.arange(max(start, 2), n_layers - 1)  # a plateau of >= 2 points, then a fall
    if len(knees) == 0:
        return _Placement(None, False, None, f"no room for a knee at or after layer {start}")
    each = {n: {s: _knee_gains(y, x, knees, s) for s in SHAPES} for n, y in used.items()}
    # placed by the lens KL (the agreement corroborates: on SmolLM2-135M it starts rising six
    # points before the KL leaves its plateau, and a mean of the two would sit between them);
    # the better shape at its best knee; ties: the earliest knee, then "decline"
    kl_gain = each["lens_kl"]
    shape = max(
        SHAPES, key=lambda s: (float(kl_gain[s].max()), -_first_max(kl_gain[s]), s == "decline")
    )
    estimate = int(knees[_first_max(kl_gain[shape])])
    gain = {int(k): float(g) for k, g in zip(knees, kl_gain[shape], strict=True)}
    signals = [_knee_signal(n, y, x, knees, estimate, shape, each[n]) for n, y in used.items()]
    sharp = [s.sharpness for s in signals if s.sharpness is not None]
    sharpness = float(np.median(sharp)) if sharp else None
    kl_fall = signals[0].change or 0.0
    agree = _agreeing(signals, estimate, n_layers)
    reason: str | None
    if gain[estimate] < KNEE_GAIN_MIN:
        reason = (
            f"no knee: a plateau then a fall of the lens KL fits no better than a "
            f"straight line (gain {gain[estimate]:.3g} < {KNEE_GAIN_MIN})"
        )
    elif kl_fall < CONVERGENCE_MIN:
        reason = (
            f"no convergence: the lens KL falls {math.exp(kl_fall):.3g}-fold past the "
            f"knee, under 2-fold"
        )
    else:
        reason = _unsharp_or_disagreeing(sharpness, agree, signals, estimate, n_layers)
    return _Placement(
        estimate,
        reason is None,
        sharpness,
        reason,
        signals,
        {
            "knee_gain": gain[estimate],
            "knee_shape": shape,
            "search_start": start,
            "agreeing": [s.name for s in agree],
        },
    )


# --------------------------------------------------------------------------- boundary 3


def neuron_counts(curves: Curves, n_layers: int) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Prediction and suppression counts per layer: width-calibrated when the run has them."""
    for suffix, kind in (("_cal", "calibrated"), ("", "fixed")):
        pred = _series(curves, f"neurons.n_prediction{suffix}", range(n_layers))
        supp = _series(curves, f"neurons.n_suppression{suffix}", range(n_layers))
        if pred is not None and supp is not None:
            return pred, supp, kind
    return None


def _sharpening(
    counts: tuple[np.ndarray, np.ndarray, str] | None, n_layers: int, start: int
) -> _Placement:
    if counts is None:
        return _Placement(
            None,
            False,
            None,
            "needs neurons.n_prediction(_cal) and n_suppression(_cal) for every layer",
        )
    pred, supp, kind = counts
    excess = supp - pred
    estimate = next((k for k in range(max(start, 1), n_layers) if (excess[k:] > 0).all()), None)
    extra: dict[str, Any] = {
        "counts": kind,
        "search_start": start,
        "n_prediction": pred.tolist(),
        "n_suppression": supp.tolist(),
    }
    if estimate is None:
        return _Placement(
            None,
            False,
            None,
            f"suppression never dominates to the end from layer {max(start, 1)} on ({kind} counts)",
            [],
            extra,
        )
    # summed over the run: the surplus in standard deviations of a difference of counts
    surplus = float(excess[estimate:].sum())
    sharpness = surplus / math.sqrt(max(float((supp + pred)[estimate:].sum()), 1.0))
    extra["surplus"] = surplus
    reason = None
    if surplus < SUPPRESSION_EXCESS_MIN or sharpness < SUPPRESSION_Z_MIN:
        reason = (
            f"too few neurons: suppression exceeds prediction by {surplus:.0f} neurons "
            f"(z {sharpness:.3g}) over layers {estimate}..{n_layers - 1}; needs "
            f"{SUPPRESSION_EXCESS_MIN} and z {SUPPRESSION_Z_MIN}"
        )
    return _Placement(
        estimate,
        reason is None,
        sharpness,
        reason,
        [_Signal("neuron_dominance", estimate, sharpness, surplus)],
        extra,
    )


# --------------------------------------------------------------------------- the rule


def _place(
    curves: Curves, counts: tuple[np.ndarray, np.ndarray, str] | None, n_layers: int
) -> tuple[_Placement, _Placement, _Placement]:
    """The three placements, ordered: boundary 2's search starts at boundary 1, boundary 3's at
    max(boundary 1, boundary 2), using clear boundaries (an unclear one constrains nothing)."""
    first = _detokenization(curves, n_layers)
    start2 = first.estimate if first.clear and first.estimate is not None else 1
    second = _feature_engineering(curves, n_layers, start2)
    start3 = max(
        start2, second.estimate if second.clear and second.estimate is not None else start2
    )
    third = _sharpening(counts, n_layers, start3)
    return first, second, third


RULES = (
    "end of detokenization: the k >= 1 maximising the mean over log(drop KL + 0.01) and "
    "1 - drop top-1 agreement of [min(curve[0..k-1]) - median(curve[k..])] / range(curve); clear "
    f"if every layer before k has drop KL >= {CATASTROPHIC_KL} nats, median sharpness >= "
    f"{SHARPNESS_MIN} and at least half the signals (with the swap curves) agree",
    "end of feature engineering: the knee k (>= boundary 1, >= 2) of a plateau-then-fall fit to "
    "log(lens KL + 0.01) at points 1..L-1 with the largest gain over a straight line; clear if "
    f"gain >= {KNEE_GAIN_MIN}, the KL falls >= 2-fold past it, median sharpness (with 1 - lens "
    f"top-1 agreement) >= {SHARPNESS_MIN} and at least half the signals agree",
    "start of residual sharpening: the first layer at or after max(boundary 1, boundary 2) from "
    "which suppression neurons outnumber prediction neurons in every later layer (calibrated "
    f"counts when present); clear if, summed over those layers, the surplus is >= "
    f"{SUPPRESSION_EXCESS_MIN} neurons and >= {SUPPRESSION_Z_MIN} sqrt(total count)",
)


def _support(curves: Curves, layer: int) -> dict[str, float | None]:
    """Supporting curves at a layer (not used to place it)."""
    attn = curves.get("intervention.kl[drop_attn]", {})
    mlp = curves.get("intervention.kl[drop_mlp]", {})
    share = None
    if layer in attn and layer in mlp and attn[layer] + mlp[layer] > 0:
        share = attn[layer] / (attn[layer] + mlp[layer])
    return {
        "intervention.kl[drop]": curves.get("intervention.kl[drop]", {}).get(layer),
        "intervention.kl[swap]": curves.get("intervention.kl[swap]", {}).get(layer),
        "attention_share_of_ablation_kl": share,
        "attention.prev_5": curves.get("attention.prev_5", {}).get(layer),
        "logit_lens.kl_to_final[point layer+1]": curves.get("logit_lens.kl_to_final", {}).get(
            layer + 1
        ),
        "logit_lens.entropy[point layer+1]": curves.get("logit_lens.entropy", {}).get(layer + 1),
        "norms.attn_mlp_ratio": curves.get("norms.attn_mlp_ratio", {}).get(layer),
    }


RULE_CURVES = frozenset(
    {
        "intervention.kl[drop]",
        "intervention.top1_agreement[drop]",
        "intervention.kl[swap]",
        "intervention.top1_agreement[swap]",
        "logit_lens.kl_to_final",
        "logit_lens.top1_agreement",
        "tuned_lens.kl_to_final",
    }
)
SIGNAL_SOURCES = {
    "drop_kl": ("intervention.kl[drop]", 0),
    "drop_top1": ("intervention.top1_agreement[drop]", 0),
    "swap_kl": ("intervention.kl[swap]", 0),
    "swap_top1": ("intervention.top1_agreement[swap]", 0),
    "lens_kl": ("logit_lens.kl_to_final", 1),
    "lens_top1": ("logit_lens.top1_agreement", 1),
    "tuned_kl": ("tuned_lens.kl_to_final", 1),
}


def _boundary(index: int, placed: _Placement, curves: Curves, n_layers: int) -> Boundary:
    evidence: dict[str, Any] = {
        "metric": (
            "intervention.kl",
            "logit_lens.kl_to_final",
            "neurons.n_suppression vs neurons.n_prediction",
        )[index - 1],
        "estimate": placed.estimate,
        "clear": placed.clear,
        "sharpness": placed.sharpness,
        **placed.extra,
    }
    if placed.reason:
        evidence["reason"] = placed.reason
    at = placed.estimate
    if index == 1:  # the values the first rule quoted, kept for clients that read them
        drop = curves.get("intervention.kl[drop]", {})
        evidence["layer_0_kl"] = drop.get(0)
        evidence["kl_at_layer"] = drop.get(at) if at is not None else None
    elif index == 2:
        lens = curves.get("logit_lens.kl_to_final", {})
        evidence["knee_point"] = at
        evidence["kl_at_knee"] = lens.get(at) if at is not None else None
        evidence["kl_at_point_0"] = lens.get(0)
    signals: dict[str, Any] = {}
    for s in placed.signals:
        entry: dict[str, Any] = {"own_layer": s.own, "sharpness": s.sharpness, "change": s.change}
        if s.name in SIGNAL_SOURCES and placed.estimate is not None:
            key, shift = SIGNAL_SOURCES[s.name]
            # the value at the boundary and just before it (lens: the point after the block)
            curve = curves.get(key, {})
            entry["metric"] = key
            entry["value_before"] = curve.get(placed.estimate - 1 + shift)
            entry["value_at"] = curve.get(placed.estimate + shift)
        signals[s.name] = entry
    evidence["signals"] = signals
    if placed.estimate is not None:
        evidence["support"] = _support(curves, placed.estimate)
    layer = placed.estimate if placed.clear else None
    span: tuple[int, int] | None = None
    if layer is not None:
        # every signal's own position: where the curves disagree, the range says so
        owns = [s.own for s in placed.signals if s.own is not None]
        span = (min([layer, *owns]), max([layer, *owns]))
        evidence["range"] = list(span)
    return Boundary(
        index,
        layer,
        _depth(layer, n_layers) if layer is not None else None,
        RULES[index - 1],
        evidence,
        placed.estimate,
        placed.sharpness,
        span,
    )


# --------------------------------------------------------------------------- bootstrap


def _sequence_matrix(
    sequence_means: pl.DataFrame,
) -> tuple[list[tuple[str, int]], np.ndarray, np.ndarray]:
    """(curve key, layer) columns, [n_sequences, keys] values (NaN where a sequence has none)
    and the has-value mask, from a per-sequence means table (rows with head null)."""
    rows = sequence_means.filter(pl.col("head").is_null() & pl.col("layer").is_not_null())
    keys = sorted(
        {
            (_key(m, c), int(layer))
            for m, c, layer in rows.select("metric", "component", "layer").unique().iter_rows()
        }
    )
    column = {k: i for i, k in enumerate(keys)}
    sequences = sorted(set(rows["sequence"].to_list()))
    row_of = {s: i for i, s in enumerate(sequences)}
    values = np.full((len(sequences), len(keys)), np.nan)
    for m, c, layer, seq, v in rows.select(
        "metric", "component", "layer", "sequence", "value"
    ).iter_rows():
        values[row_of[seq], column[(_key(m, c), int(layer))]] = v
    return keys, values, ~np.isnan(values)


def resampled_curves(
    sequence_means: pl.DataFrame, *, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[list[tuple[str, int]], np.ndarray]:
    """Curves recomputed from sequences drawn with replacement: (keys, [n_resamples, keys]).

    Resample r draws n sequence indices uniformly with replacement (numpy default_rng(seed),
    `integers(0, n, size=(n_resamples, n))`); each curve value is the mean of the drawn
    sequences' means (sequences without a value for that key are skipped; NaN if none drawn).
    """
    keys, values, has = _sequence_matrix(sequence_means)
    n = values.shape[0]
    if n == 0:
        return keys, np.zeros((0, len(keys)))
    draws = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    counts = np.zeros((n_resamples, n))
    np.add.at(counts, (np.arange(n_resamples)[:, None], draws), 1.0)
    totals = counts @ np.where(has, values, 0.0)
    weights = counts @ has.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return keys, np.where(weights > 0, totals / np.maximum(weights, 1.0), np.nan)


def _percentile_interval(samples: list[int], level: float) -> tuple[int, int]:
    arr = np.array(samples)
    tail = 100 * (1 - level) / 2
    return (
        int(np.percentile(arr, tail, method="lower")),
        int(np.percentile(arr, 100 - tail, method="higher")),
    )


def _bootstrap(
    boundaries: list[Boundary],
    curves: Curves,
    counts: tuple[np.ndarray, np.ndarray, str] | None,
    n_layers: int,
    sequence_means: pl.DataFrame,
    n_resamples: int,
    seed: int,
    level: float,
) -> None:
    n_sequences = sequence_means["sequence"].n_unique()
    used = sequence_means.filter(
        pl.struct("metric", "component").map_elements(
            lambda row: _key(row["metric"], row["component"]) in RULE_CURVES,
            return_dtype=pl.Boolean,
        )
    )
    keys, resampled = resampled_curves(used, n_resamples=n_resamples, seed=seed)
    estimates: list[list[int]] = [[], [], []]
    clear = [0, 0, 0]
    for r in range(resampled.shape[0]):
        # curves the table lacks stay at their record values
        sample = {k: dict(curves[k]) for k in RULE_CURVES if k in curves}
        for (key, layer), value in zip(keys, resampled[r], strict=True):
            if not math.isnan(value):
                sample.setdefault(key, {})[layer] = float(value)
        for i, placed in enumerate(_place(sample, counts, n_layers)):
            if placed.estimate is not None:
                estimates[i].append(placed.estimate)
            clear[i] += placed.clear
    for b, found, n_clear in zip(boundaries, estimates, clear, strict=True):
        info: dict[str, Any] = {
            "n_resamples": n_resamples,
            "seed": seed,
            "level": level,
            "n_sequences": n_sequences,
            "resampled": "sequences",
            "clear_fraction": n_clear / max(n_resamples, 1),
            "placed_fraction": len(found) / max(n_resamples, 1),
        }
        if found:
            b.interval = _percentile_interval(found, level)
            info["interval"] = list(b.interval)
            info["interval_relative_depth"] = [_depth(v, n_layers) for v in b.interval]
        b.evidence["bootstrap"] = info


def infer_stages(
    records: pl.DataFrame,
    n_layers: int,
    sequence_means: pl.DataFrame | None = None,
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> list[Boundary]:
    """Place the three boundaries of one model from its record table.

    `sequence_means` (metric, layer, component, head, sequence, value: the run's per-sequence
    means) adds a seeded percentile bootstrap interval over sequences to every boundary;
    without it (runs computed before the table existed) boundaries have no interval and their
    evidence says so.
    """
    if n_layers < 2:
        raise SpecError("stages need a model with at least 2 layers")
    missing = {"metric", "layer", "component", "head", "neuron", "value"} - set(records.columns)
    if missing:
        raise SpecError(f"records lack columns: {', '.join(sorted(missing))}")
    curves = curves_of(records)
    counts = neuron_counts(curves, n_layers)
    placed = _place(curves, counts, n_layers)
    boundaries = [_boundary(i + 1, p, curves, n_layers) for i, p in enumerate(placed)]
    if counts is not None and counts[2] == "fixed":
        boundaries[2].evidence["note"] = (
            "no width-calibrated neuron counts in this run: the fixed study classes were used"
        )
    if sequence_means is not None and sequence_means.height > 0:
        missing = {"metric", "layer", "component", "head", "sequence", "value"} - set(
            sequence_means.columns
        )
        if missing:
            raise SpecError(f"sequence means lack columns: {', '.join(sorted(missing))}")
        _bootstrap(boundaries, curves, counts, n_layers, sequence_means, n_resamples, seed, level)
    else:
        for b in boundaries:
            b.evidence["bootstrap"] = {"reason": "no per-sequence means for this run: no interval"}
    for b in boundaries:
        b.evidence["interval"] = list(b.interval) if b.interval else None
    return boundaries


def stage_records(boundaries: list[Boundary], n_layers: int) -> list[Record]:
    """Clear boundaries as records (`stages.boundary_k`, value = relative depth)."""
    return [
        Record.of(f"stages.boundary_{b.index}", b.relative_depth or 0.0, n_layers, layer=b.layer)
        for b in boundaries
        if b.clear
    ]


def n_layers_of(records: pl.DataFrame) -> int:
    """Block count of the model a record table describes (from intervention or norms rows)."""
    blocks = records.filter(
        pl.col("metric").str.starts_with("intervention.")
        | pl.col("metric").str.starts_with("norms.")
    )
    layers = blocks["layer"].drop_nulls()
    if layers.len() == 0:
        lens = records.filter(pl.col("metric") == "logit_lens.kl_to_final")["layer"]
        if lens.len() == 0:
            raise SpecError(
                "cannot tell the number of layers: no intervention, norms or logit_lens rows"
            )
        return int(lens.max())  # type: ignore[arg-type]
    return int(layers.max()) + 1  # type: ignore[arg-type]
