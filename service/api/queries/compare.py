"""One metric across models, aligned on relative depth (Polars).

Models of different depth line up on relative depth (docs/metrics.md: l/(L-1) for blocks, i/L for
logit-lens points). [0, 1] is cut into `bins` equal bins [lo, hi) (the last one closed), and each
model's per-layer curve gives one value per bin, by one of two methods:

- `interpolate` (default): the curve, linear between consecutive layers, read at the bin's
  centre. Every bin inside the model's depth range has a value, however few layers the model has.
  `stderr` is interpolated the same way between the two neighbouring layers: an approximation
  (it is not the standard error of the interpolated value, which would be smaller).
- `mean`: the mean of the layers whose depth falls in the bin; `stderr` is that of the mean,
  sqrt(sum stderr_l^2) / k, treating layers as independent. A bin with no layer has no value.

Either way `n_points` counts the model's layers inside the bin and `n` is the smallest token
count among them. Every model gets all `bins` rows, so curves of any depth plot on one grid.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from compute.run import METRIC_VERSION
from service.api.errors import UnprocessableError
from service.api.queries.answers import (
    Answer,
    check_component,
    check_metric,
    check_models,
    family_needed,
)
from service.api.queries.cache import Reader
from service.api.queries.index import RunEntry, Snapshot
from service.api.schemas.results import CompareModel, CompareRow, Comparison, columns

Method = Literal["interpolate", "mean"]


def bin_grid(bins: int) -> pl.DataFrame:
    edges = [i / bins for i in range(bins + 1)]
    return pl.DataFrame({
        "bin": pl.Series(range(bins), dtype=pl.Int64),
        "bin_lo": edges[:-1], "bin_hi": edges[1:],
        "relative_depth": [(edges[i] + edges[i + 1]) / 2 for i in range(bins)],
    })


def align(rows: pl.DataFrame, bins: int, method: Method) -> pl.DataFrame:
    """Per-layer rows (run_id, relative_depth, value, stderr, n, unit) of several runs -> one
    row per run and bin (`CompareRow` columns but model names)."""
    rows = rows.filter(pl.col("relative_depth").is_not_null())
    grid = bin_grid(bins)
    in_bin = rows.with_columns(
        bin=(pl.col("relative_depth") * bins).floor().cast(pl.Int64).clip(0, bins - 1))
    per_bin = in_bin.group_by("run_id", "bin").agg(
        n_points=pl.len().cast(pl.Int64),
        n=pl.col("n").min(),
        mean=pl.col("value").mean(),
        mean_stderr=pl.when(pl.col("stderr").null_count() == 0)
        .then((pl.col("stderr") ** 2).sum().sqrt() / pl.len()),
    )
    runs = rows.select("run_id", "unit").unique("run_id")
    full = runs.join(grid, how="cross")
    if method == "interpolate":
        centres = full.select("run_id", "bin", "relative_depth",
                              value=pl.lit(None, pl.Float64), stderr=pl.lit(None, pl.Float64),
                              is_centre=pl.lit(True))
        points = rows.select("run_id", pl.lit(None, pl.Int64).alias("bin"), "relative_depth",
                             "value", pl.col("stderr").cast(pl.Float64),
                             is_centre=pl.lit(False))
        curve = (pl.concat([points, centres])
                 .sort("run_id", "relative_depth", "is_centre")
                 .with_columns(pl.col("value", "stderr")
                               .interpolate_by("relative_depth").over("run_id"))
                 .filter(pl.col("is_centre"))
                 .select("run_id", "bin", "value", "stderr"))
        # interpolate_by extends the end values flat; outside a model's range there is no curve
        span = rows.group_by("run_id").agg(lo=pl.col("relative_depth").min(),
                                           hi=pl.col("relative_depth").max())
        full = (full.join(curve, on=["run_id", "bin"], how="left").join(span, on="run_id")
                .with_columns([pl.when(pl.col("relative_depth").is_between("lo", "hi"))
                               .then(pl.col(c)).alias(c) for c in ("value", "stderr")])
                .drop("lo", "hi"))
        full = full.join(per_bin.select("run_id", "bin", "n_points", "n"),
                         on=["run_id", "bin"], how="left")
    else:
        full = full.join(per_bin, on=["run_id", "bin"], how="left").rename(
            {"mean": "value", "mean_stderr": "stderr"})
    return (full.with_columns(pl.col("n_points").fill_null(0))
            .sort("run_id", "bin"))


def _id(run: RunEntry | None) -> int | None:
    return None if run is None else run.id


def compare(reader: Reader, snap: Snapshot, *, metric: str, component: str | None,
            models: list[str], bins: int, method: Method, metric_version: str | None
            ) -> Answer:
    check_metric(metric)
    check_component(component)
    check_models(models, "a,b,c")
    entries = snap.models_named(models)
    family = family_needed(metric)
    runs: dict[int, RunEntry | None] = {}
    version = metric_version or METRIC_VERSION
    for model in entries:
        runs[model.id] = snap.current_run(model.id, family=family, metric_version=version)
    found = [r for r in runs.values() if r is not None]

    def load() -> pl.DataFrame:
        rows = reader.rows(found, [metric], component=component)
        present = rows["component"].drop_nulls().unique().to_list()
        if component is None and len(present) > 1:
            raise UnprocessableError(f"{metric} has rows for components "
                                     f"{', '.join(sorted(present))}"
                                     ": choose one with component=")
        aligned = align(rows, bins, method)
        names = pl.DataFrame({"run_id": [r.id for r in found],
                              "model_id": [r.model_id for r in found],
                              "model": [snap.models[r.model_id].name for r in found]},
                             schema={"run_id": pl.Int64, "model_id": pl.Int64,
                                     "model": pl.String})
        points = dict(rows.group_by("run_id").agg(pl.len()).iter_rows())
        for model in context.models:
            model.n_points = int(points.get(model.run_id, 0))
        return aligned.join(names, on="run_id").sort("model", "model_id", "bin")

    context = Comparison(metric, component, bins, method, [
        CompareModel(m.id, m.name, m.n_layers, _id(runs[m.id]), 0) for m in entries], [])
    return Answer(context, columns(CompareRow), found, False, load)
