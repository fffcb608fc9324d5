"""One metric across models, aligned on relative depth (Polars).

Models of different depth line up on relative depth (docs/metrics.md: l/(L-1) for blocks, i/L for
logit-lens points). [0, 1] is cut into `bins` equal bins [lo, hi) (the last one closed), and each
model's per-layer curve gives one value per bin, by one of two methods:

- `interpolate` (default): the curve, linear between consecutive layers, read at the bin's
  centre: (1-w) v_a + w v_b. Every bin inside the model's depth range has a value, however few
  layers the model has.
- `mean`: the mean of the layers whose depth falls in the bin, sum v_l / k. A bin with no layer
  has no value.

Either way a bin's value is a weighted sum of layer values, sum_l w_l v_l, and so is its error:
- runs with per-sequence means (metric version 2 on): the same weighted sum is taken per
  sequence, sum_l w_l m_{l,s}, over the sequences every weighted layer has; `stderr` is the
  std (ddof 1) of those per-sequence values / sqrt(n), and `n` their number. This is the exact
  sequence-level error of the bin's value: the layers of one sequence are correlated, and the
  per-sequence sums carry that correlation.
- runs without them (metric version 1, or rows ingested without them): `interpolate` reads
  `stderr` off the same line, (1-w) se_a + w se_b (the error if the two layers were perfectly
  correlated: an upper bound); `mean` gives sqrt(sum se_l^2) / k (layers treated as
  independent), and `n` is the smallest n among the layers.
`n_points` counts the model's layers inside the bin. Every model gets all `bins` rows, so curves
of any depth plot on one grid.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

from compute.run import METRIC_VERSION, stderr_basis
from service.api.errors import UnprocessableHttpError
from service.api.queries.answers import (
    Answer,
    check_component,
    check_metric,
    check_models,
    chosen_runs,
    family_needed,
    pick_run,
    run_ref,
)
from service.api.queries.cache import Reader
from service.api.queries.index import Pick, RunEntry, Snapshot
from service.schemas.common import RunRef
from service.schemas.results import CompareModel, CompareRow, Comparison, columns
from service.store import repositories as repo

Method = Literal["interpolate", "mean"]


def bin_grid(bins: int) -> pl.DataFrame:
    edges = [i / bins for i in range(bins + 1)]
    return pl.DataFrame(
        {
            "bin": pl.Series(range(bins), dtype=pl.Int64),
            "bin_lo": edges[:-1],
            "bin_hi": edges[1:],
            "relative_depth": [(edges[i] + edges[i + 1]) / 2 for i in range(bins)],
        }
    )


def align(rows: pl.DataFrame, bins: int, method: Method) -> pl.DataFrame:
    """Per-layer rows (run_id, relative_depth, value, stderr, n, unit) of several runs -> one
    row per run and bin (`CompareRow` columns but model names)."""
    rows = rows.filter(pl.col("relative_depth").is_not_null())
    grid = bin_grid(bins)
    in_bin = rows.with_columns(
        bin=(pl.col("relative_depth") * bins).floor().cast(pl.Int64).clip(0, bins - 1)
    )
    per_bin = in_bin.group_by("run_id", "bin").agg(
        n_points=pl.len().cast(pl.Int64),
        n=pl.col("n").min(),
        mean=pl.col("value").mean(),
        mean_stderr=pl.when(pl.col("stderr").null_count() == 0).then(
            (pl.col("stderr") ** 2).sum().sqrt() / pl.len()
        ),
    )
    runs = rows.select("run_id", "unit").unique("run_id")
    full = runs.join(grid, how="cross")
    if method == "interpolate":
        centres = full.select(
            "run_id",
            "bin",
            "relative_depth",
            value=pl.lit(None, pl.Float64),
            stderr=pl.lit(None, pl.Float64),
            is_centre=pl.lit(True),
        )
        points = rows.select(
            "run_id",
            pl.lit(None, pl.Int64).alias("bin"),
            "relative_depth",
            "value",
            pl.col("stderr").cast(pl.Float64),
            is_centre=pl.lit(False),
        )
        curve = (
            pl.concat([points, centres])
            .sort("run_id", "relative_depth", "is_centre")
            .with_columns(pl.col("value", "stderr").interpolate_by("relative_depth").over("run_id"))
            .filter(pl.col("is_centre"))
            .select("run_id", "bin", "value", "stderr")
        )
        # interpolate_by extends the end values flat; outside a model's range there is no curve
        span = rows.group_by("run_id").agg(
            lo=pl.col("relative_depth").min(), hi=pl.col("relative_depth").max()
        )
        full = (
            full.join(curve, on=["run_id", "bin"], how="left")
            .join(span, on="run_id")
            .with_columns(
                [
                    pl.when(pl.col("relative_depth").is_between("lo", "hi"))
                    .then(pl.col(c))
                    .alias(c)
                    for c in ("value", "stderr")
                ]
            )
            .drop("lo", "hi")
        )
        full = full.join(
            per_bin.select("run_id", "bin", "n_points", "n"), on=["run_id", "bin"], how="left"
        )
    else:
        full = full.join(per_bin, on=["run_id", "bin"], how="left").rename(
            {"mean": "value", "mean_stderr": "stderr"}
        )
    return full.with_columns(pl.col("n_points").fill_null(0)).sort("run_id", "bin")


def bin_weights(rows: pl.DataFrame, bins: int, method: Method) -> pl.DataFrame:
    """The weights w_l that make each bin's value from a run's layers: columns run_id, bin,
    layer, w (`align` computes the same values; this spells out their weights)."""
    rows = rows.filter(pl.col("relative_depth").is_not_null())
    out: dict[str, list[object]] = {"run_id": [], "bin": [], "layer": [], "w": []}

    def put(run_id: int, b: int, layer: int, w: float) -> None:
        for key, value in (("run_id", run_id), ("bin", b), ("layer", layer), ("w", w)):
            out[key].append(value)

    centres = (np.arange(bins) + 0.5) / bins
    for (run_id,), part in rows.sort("relative_depth").group_by("run_id", maintain_order=True):
        depth = part["relative_depth"].to_numpy()
        layers = part["layer"].to_list()
        if method == "mean":
            index = np.clip(np.floor(depth * bins).astype(np.int64), 0, bins - 1)
            for b in np.unique(index):
                inside = np.flatnonzero(index == b)
                for i in inside:
                    put(int(run_id), int(b), layers[i], 1.0 / inside.size)
            continue
        for b, c in enumerate(centres):
            if not depth[0] <= c <= depth[-1]:
                continue
            hi = int(np.searchsorted(depth, c, side="left"))
            if depth[hi] == c or hi == 0:
                put(int(run_id), b, layers[hi], 1.0)
                continue
            lo = hi - 1
            w = (c - depth[lo]) / (depth[hi] - depth[lo])
            put(int(run_id), b, layers[lo], float(1.0 - w))
            put(int(run_id), b, layers[hi], float(w))
    return pl.DataFrame(
        out, schema={"run_id": pl.Int64, "bin": pl.Int64, "layer": pl.Int64, "w": pl.Float64}
    )


def sequence_errors(weights: pl.DataFrame, per_sequence: pl.DataFrame) -> pl.DataFrame:
    """Per (run_id, bin): the stderr over sequences of sum_l w_l m_{l,s} and n, the number of
    sequences that every weighted layer of the bin has (columns run_id, bin, seq_stderr,
    seq_n). `per_sequence`: run_id, layer, sequence, value."""
    if per_sequence.is_empty() or weights.is_empty():
        return pl.DataFrame(
            schema={
                "run_id": pl.Int64,
                "bin": pl.Int64,
                "seq_stderr": pl.Float64,
                "seq_n": pl.Int64,
            }
        )
    # Sorted before each aggregation, and groups kept in order: the same answer to the last bit
    # on every request (a join's row order is not fixed, and float sums depend on order).
    needed = weights.group_by("run_id", "bin").agg(k=pl.len())
    combined = (
        weights.join(
            per_sequence.select(
                pl.col("run_id").cast(pl.Int64), pl.col("layer").cast(pl.Int64), "sequence", "value"
            ),
            on=["run_id", "layer"],
        )
        .sort("run_id", "bin", "sequence", "layer")
        .group_by("run_id", "bin", "sequence", maintain_order=True)
        .agg(x=(pl.col("w") * pl.col("value")).sum(), layers=pl.len())
        .join(needed, on=["run_id", "bin"])
        .filter(pl.col("layers") == pl.col("k"))
        .sort("run_id", "bin", "sequence")
    )
    return combined.group_by("run_id", "bin", maintain_order=True).agg(
        seq_stderr=pl.when(pl.len() > 1).then(pl.col("x").std(ddof=1) / pl.len().sqrt()),
        seq_n=pl.len().cast(pl.Int64),
    )


def _id(run: RunEntry | None) -> int | None:
    return None if run is None else run.id


def compare(
    reader: Reader,
    snap: Snapshot,
    *,
    metric: str,
    component: str | None,
    models: list[str],
    bins: int,
    method: Method,
    metric_version: str | None,
    run_ids: list[int] | None = None,
) -> Answer:
    check_metric(metric)
    check_component(component)
    check_models(models, "a,b,c")
    entries = snap.models_named(models)
    family = family_needed(metric)
    version = metric_version or METRIC_VERSION
    chosen = chosen_runs(snap, entries, run_ids)
    picks: dict[int, Pick | None] = {}
    for model in entries:
        if model.id in chosen:
            picks[model.id] = pick_run(
                snap,
                model,
                family=family,
                run_id=chosen[model.id],
                metric_version=None,
                what=metric,
            )
        else:
            picks[model.id] = snap.canonical(model.id, family=family, metric_version=version)
    runs: dict[int, RunEntry | None] = {m: p.run if p else None for m, p in picks.items()}
    found = [r for r in runs.values() if r is not None]

    def load() -> pl.DataFrame:
        rows = reader.rows(found, [metric], component=component)
        present = rows["component"].drop_nulls().unique().to_list()
        if component is None and len(present) > 1:
            raise UnprocessableHttpError(
                f"{metric} has rows for components "
                f"{', '.join(sorted(present))}"
                ": choose one with component="
            )
        aligned = align(rows, bins, method)
        per_sequence = _per_sequence(reader, found, metric, component)
        if not per_sequence.is_empty():  # the exact sequence-level errors where there are any
            errors = sequence_errors(bin_weights(rows, bins, method), per_sequence)
            aligned = (
                aligned.join(errors, on=["run_id", "bin"], how="left")
                .with_columns(
                    stderr=pl.when(pl.col("seq_n").is_not_null())
                    .then(pl.col("seq_stderr"))
                    .otherwise(pl.col("stderr")),
                    n=pl.when(pl.col("seq_n").is_not_null())
                    .then(pl.col("seq_n"))
                    .otherwise(pl.col("n")),
                )
                .drop("seq_stderr", "seq_n")
            )
        names = pl.DataFrame(
            {
                "run_id": [r.id for r in found],
                "model_id": [r.model_id for r in found],
                "model": [snap.models[r.model_id].name for r in found],
            },
            schema={"run_id": pl.Int64, "model_id": pl.Int64, "model": pl.String},
        )
        points = dict(rows.group_by("run_id").agg(pl.len()).iter_rows())
        for model in context.models:
            model.n_points = int(points.get(model.run_id, 0))
        return aligned.join(names, on="run_id").sort("model", "model_id", "bin")

    context = Comparison(
        metric,
        component,
        bins,
        method,
        [
            CompareModel(
                m.id,
                m.name,
                m.n_layers,
                _id(runs[m.id]),
                0,
                _basis(runs[m.id]),
                _ref(picks[m.id]),
            )
            for m in entries
        ],
        [],
    )
    chosen_picks = [p for p in picks.values() if p is not None]
    return Answer(
        context, columns(CompareRow), found, len(chosen) == len(entries), load, chosen_picks
    )


def _ref(pick: Pick | None) -> RunRef | None:
    return None if pick is None else run_ref(pick)


def _basis(run: RunEntry | None) -> str | None:
    return None if run is None else stderr_basis(run.metric_version)


def _per_sequence(
    reader: Reader, runs: list[RunEntry], metric: str, component: str | None
) -> pl.DataFrame:
    """The per-layer (head null) per-sequence means of `metric` in `runs`: run_id, layer,
    sequence, value (empty for runs that have none)."""
    parts = []
    for run in runs:
        frame = repo.sequence_means(reader.cursor(), run.id, [metric]).filter(
            pl.col("head").is_null()
        )
        if component is not None:
            frame = frame.filter(pl.col("component") == component)
        if not frame.is_empty():
            parts.append(
                frame.select(
                    pl.lit(run.id, pl.Int64).alias("run_id"),
                    pl.col("layer").cast(pl.Int64),
                    pl.col("sequence").cast(pl.Int64),
                    pl.col("value").cast(pl.Float64),
                )
            )
    if not parts:
        return pl.DataFrame(
            schema={
                "run_id": pl.Int64,
                "layer": pl.Int64,
                "sequence": pl.Int64,
                "value": pl.Float64,
            }
        )
    return pl.concat(parts)
