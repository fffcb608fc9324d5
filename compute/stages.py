"""stages.* — the four stages of inference, placed from a model's stored metrics.

Stages: 1 detokenization, 2 feature engineering, 3 prediction ensembling, 4 residual sharpening.
Boundary k is the first block of stage k+1, as a layer index l (0..L-1) and relative depth
l/(L-1). The rule is deterministic and uses only stored records:

1. End of detokenization — `intervention.kl` of `drop`. The early catastrophic level is the
   drop KL of layer 0. The boundary is the first layer l >= 1 whose drop KL falls below
   DROP_FALL x that level. Not clear if layer 0 is not catastrophic (its drop KL is under
   CATASTROPHIC x the median drop KL of the other layers) or nothing falls below.
2. End of feature engineering — the knee of `logit_lens.kl_to_final` over points 0..L: with
   x = i/L and y = KL_i/KL_0, the point farthest above the chord y = 1 - x (the curve stays high,
   then collapses). Point i is the output of block i-1, so block i starts stage 3. Not clear if
   the farthest point is less than KNEE_MIN above the chord (a straight or convex curve).
3. Start of residual sharpening — the first layer at or after boundary 2 from which
   `neurons.n_suppression` > `neurons.n_prediction` holds for every later layer. Not clear if
   there is none.
Each boundary carries its evidence: the metric, the layer, the values that placed it, and the
supporting curves (swap KL, logit-lens entropy, attention prev_5, attention/MLP norm ratio) at
that layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from compute.errors import SpecError
from compute.records import Record

STAGE_NAMES = ("detokenization", "feature_engineering", "prediction_ensembling",
               "residual_sharpening")
DROP_FALL = 0.2
CATASTROPHIC = 5.0
KNEE_MIN = 0.1


@dataclass
class Boundary:
    index: int  # 1..3: boundary k ends stage k
    layer: int | None  # first block of stage k+1, or None when no clear boundary
    relative_depth: float | None
    rule: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def clear(self) -> bool:
        return self.layer is not None


def _curve(records: pl.DataFrame, metric: str, component: str | None = None) -> dict[int, float]:
    rows = records.filter(pl.col("metric") == metric)
    if component is not None:
        rows = rows.filter(pl.col("component") == component)
    rows = rows.filter(pl.col("head").is_null() & pl.col("neuron").is_null()
                       & pl.col("layer").is_not_null())
    return {int(r["layer"]): float(r["value"]) for r in rows.iter_rows(named=True)}


def _support(records: pl.DataFrame, layer: int) -> dict[str, float | None]:
    curves = {
        "intervention.kl[swap]": _curve(records, "intervention.kl", "swap"),
        "logit_lens.entropy": _curve(records, "logit_lens.entropy"),
        "attention.prev_5": _curve(records, "attention.prev_5"),
        "norms.attn_mlp_ratio": _curve(records, "norms.attn_mlp_ratio"),
    }
    return {name: curve.get(layer) for name, curve in curves.items()}


def _depth(layer: int, n_layers: int) -> float:
    return layer / (n_layers - 1) if n_layers > 1 else 0.0


def detokenization_end(records: pl.DataFrame, n_layers: int) -> Boundary:
    rule = (f"first layer l>=1 with drop KL < {DROP_FALL} x drop KL of layer 0, given layer 0 is "
            f"catastrophic (>= {CATASTROPHIC} x median of the rest)")
    drop = _curve(records, "intervention.kl", "drop")
    if len(drop) < n_layers or n_layers < 3:
        return Boundary(1, None, None, rule, {"reason": "needs intervention.kl[drop] for every "
                                              "layer of a model with >= 3 layers"})
    level = drop[0]
    rest = sorted(drop[i] for i in range(1, n_layers))
    median = rest[len(rest) // 2]
    evidence: dict[str, Any] = {"metric": "intervention.kl", "component": "drop",
                                "layer_0_kl": level, "median_other_kl": median}
    if level < CATASTROPHIC * median:
        return Boundary(1, None, None, rule, {**evidence, "reason": "layer 0 is not catastrophic"})
    for layer in range(1, n_layers):
        if drop[layer] < DROP_FALL * level:
            return Boundary(1, layer, _depth(layer, n_layers), rule,
                            {**evidence, "kl_at_layer": drop[layer],
                             "support": _support(records, layer)})
    return Boundary(1, None, None, rule, {**evidence, "reason": "drop KL never falls"})


def feature_engineering_end(records: pl.DataFrame, n_layers: int) -> Boundary:
    rule = f"knee of logit_lens.kl_to_final: farthest point above the chord, by >= {KNEE_MIN}"
    lens = _curve(records, "logit_lens.kl_to_final")
    if len(lens) < n_layers + 1 or lens.get(0, 0.0) <= 0:
        return Boundary(2, None, None, rule, {"reason": "needs logit_lens.kl_to_final at every "
                                              "point with a positive value at point 0"})
    distance = {i: lens[i] / lens[0] - (1 - i / n_layers) for i in range(1, n_layers)}
    if not distance:
        return Boundary(2, None, None, rule, {"reason": "too few layers for a knee"})
    point = max(distance, key=lambda i: distance[i])
    evidence = {"metric": "logit_lens.kl_to_final", "knee_point": point,
                "kl_at_knee": lens[point], "kl_at_point_0": lens[0],
                "distance_above_chord": distance[point]}
    if distance[point] < KNEE_MIN:
        return Boundary(2, None, None, rule, {**evidence, "reason": "no knee: the curve does not "
                                              "stay high before collapsing"})
    layer = min(point, n_layers - 1)
    return Boundary(2, layer, _depth(layer, n_layers), rule,
                    {**evidence, "support": _support(records, layer)})


def sharpening_start(records: pl.DataFrame, n_layers: int, after: int | None) -> Boundary:
    rule = ("first layer (at or after boundary 2) from which suppression neurons outnumber "
            "prediction neurons in every later layer")
    pred = _curve(records, "neurons.n_prediction")
    supp = _curve(records, "neurons.n_suppression")
    if len(pred) < n_layers or len(supp) < n_layers:
        return Boundary(3, None, None, rule, {"reason": "needs neurons.n_prediction and "
                                              "n_suppression for every layer"})
    start = after if after is not None else 1
    counts = {"n_prediction": [pred[i] for i in range(n_layers)],
              "n_suppression": [supp[i] for i in range(n_layers)]}
    for layer in range(max(start, 1), n_layers):
        if all(supp[i] > pred[i] for i in range(layer, n_layers)):
            return Boundary(3, layer, _depth(layer, n_layers), rule,
                            {"metric": "neurons.n_suppression vs neurons.n_prediction",
                             **counts, "support": _support(records, layer)})
    return Boundary(3, None, None, rule, {**counts, "reason": "suppression never dominates "
                                          "to the end"})


def infer_stages(records: pl.DataFrame, n_layers: int) -> list[Boundary]:
    """Place the three boundaries of one model from its record table."""
    if n_layers < 2:
        raise SpecError("stages need a model with at least 2 layers")
    missing = {"metric", "layer", "component", "head", "neuron", "value"} - set(records.columns)
    if missing:
        raise SpecError(f"records lack columns: {', '.join(sorted(missing))}")
    first = detokenization_end(records, n_layers)
    second = feature_engineering_end(records, n_layers)
    if first.clear and second.clear and second.layer is not None and first.layer is not None \
            and second.layer <= first.layer:
        second.evidence["note"] = "knee is not after boundary 1; stage 2 is empty"
    third = sharpening_start(records, n_layers, second.layer)
    return [first, second, third]


def stage_records(boundaries: list[Boundary], n_layers: int) -> list[Record]:
    """Clear boundaries as records (`stages.boundary_k`, value = relative depth)."""
    return [Record.of(f"stages.boundary_{b.index}", b.relative_depth or 0.0, n_layers,
                      layer=b.layer) for b in boundaries if b.clear]


def n_layers_of(records: pl.DataFrame) -> int:
    """Block count of the model a record table describes (from intervention or norms rows)."""
    blocks = records.filter(pl.col("metric").str.starts_with("intervention.")
                            | pl.col("metric").str.starts_with("norms."))
    layers = blocks["layer"].drop_nulls()
    if layers.len() == 0:
        lens = records.filter(pl.col("metric") == "logit_lens.kl_to_final")["layer"]
        if lens.len() == 0:
            raise SpecError("cannot tell the number of layers: no intervention, norms or "
                            "logit_lens rows")
        return int(lens.max())  # type: ignore[arg-type]
    return int(layers.max()) + 1  # type: ignore[arg-type]
