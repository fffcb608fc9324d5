"""Stage boundaries of models, and a metric aggregated over each stage (Polars).

Boundaries come from the model's latest succeeded run that has them (inferred at ingest for
runs with intervention, logit_lens and neurons: `service.store.boundaries`). Boundary k is
the first block of stage k+1, so stage k spans blocks [b_{k-1}, b_k - 1] with b_0 = 0 and
b_4 = L. Each boundary also carries, lifted out of its stored evidence, its sharpness, the range
of layers its signals give and its bootstrap interval over sequences (`boundary`). A stage is
`clear` when both its bounds are known; when a boundary falls at or before the previous one the
stage between them is empty (clear, but no span and n_points 0). Only clear stages get spans and
aggregates — an unknown boundary leaves both stages it separates without one.

A metric's rows come from the model's current run computing that metric (`metric_run_id`; it
may differ from the run the boundaries were inferred from). Logit-lens point i (the output of
block i-1; point 0 the embeddings) counts for block max(i-1, 0). Per stage: `value` is the mean of
the per-layer values, `stderr` that of the mean (sqrt(sum stderr_l^2) / k, null if any layer has
none), `layer_std` the spread of the layer values (ddof 1), `n_points` the layers averaged.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from compute.records import LENS_PREFIXES
from compute.run import METRIC_VERSION
from compute.stages import STAGE_NAMES
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
from service.api.queries.index import ModelEntry, Pick, RunEntry, Snapshot
from service.schemas.common import RunRef
from service.schemas.results import columns
from service.schemas.stages import Boundary, ModelStages, StageRow, Stages
from service.store import repositories as repo


def _spans(model: ModelEntry, found: dict[int, int | None]) -> list[dict[str, Any]]:
    """The four stages of one model: bounds, clear or not."""
    n_layers = model.n_layers or 0
    bounds: list[int | None] = [0, found.get(1), found.get(2), found.get(3), n_layers]
    spans = []
    reached = 0  # boundaries never move a stage backwards: a late one empties the stage before
    for stage in range(1, 5):
        lo, hi = bounds[stage - 1], bounds[stage]
        clear = lo is not None and hi is not None and n_layers > 0
        if lo is not None:
            reached = max(reached, lo)
        start = reached if clear else None
        end = hi - 1 if clear and hi is not None else None
        if start is not None and end is not None and end < start:  # an empty stage
            start = end = None
        spans.append(
            {
                "model_id": model.id,
                "model": model.name,
                "stage": stage,
                "stage_name": STAGE_NAMES[stage - 1],
                "clear": clear,
                "layer_start": start,
                "layer_end": end,
                "relative_depth_start": _depth(start, n_layers),
                "relative_depth_end": _depth(end, n_layers),
            }
        )
    return spans


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    return None


def boundary(row: dict[str, Any]) -> Boundary:
    """A stored boundary with its interval, sharpness and range lifted out of the evidence
    (where `compute.stages` puts them; boundaries stored before they existed have none)."""
    evidence: dict[str, Any] = row["evidence"] or {}
    found = evidence.get("bootstrap")
    boot: dict[str, Any] = found if isinstance(found, dict) else {}
    sharpness = evidence.get("sharpness")
    estimate = evidence.get("estimate")
    depths = boot.get("interval_relative_depth")
    return Boundary(
        row["boundary"],
        STAGE_NAMES[row["boundary"] - 1],
        row["found"],
        row["layer"],
        row["relative_depth"],
        row["rule"],
        evidence,
        clear=bool(row["found"]),
        estimate=estimate if isinstance(estimate, int) else row["layer"],
        sharpness=float(sharpness) if isinstance(sharpness, int | float) else None,
        range=_ints(evidence.get("range")),
        interval=_ints(boot.get("interval")),
        interval_relative_depth=[float(d) for d in depths]
        if isinstance(depths, list) and len(depths) == 2
        else None,
        interval_level=float(boot["level"])
        if isinstance(boot.get("level"), int | float) and boot.get("interval") is not None
        else None,
    )


def _depth(layer: int | None, n_layers: int) -> float | None:
    if layer is None:
        return None
    return layer / (n_layers - 1) if n_layers > 1 else 0.0


def aggregate(spans: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """Per-stage mean, stderr of the mean, spread and count of per-layer rows (with model_id)."""
    blocks = rows.filter(pl.col("layer").is_not_null()).with_columns(
        block=pl.when(pl.any_horizontal(pl.col("metric").str.starts_with(p) for p in LENS_PREFIXES))
        .then((pl.col("layer") - 1).clip(lower_bound=0))
        .otherwise(pl.col("layer"))
    )
    inside = (
        spans.select("model_id", "stage", "layer_start", "layer_end")
        .join(blocks, on="model_id")
        .filter(pl.col("block").is_between("layer_start", "layer_end"))
    )
    stats = inside.group_by("model_id", "stage").agg(
        value=pl.col("value").mean(),
        stderr=pl.when(pl.col("stderr").null_count() == 0).then(
            (pl.col("stderr") ** 2).sum().sqrt() / pl.len()
        ),
        layer_std=pl.col("value").std(ddof=1),
        n_points=pl.len().cast(pl.Int64),
        unit=pl.col("unit").first(),
    )
    return spans.join(stats, on=["model_id", "stage"], how="left").with_columns(
        pl.col("n_points").fill_null(0)
    )


def stages(
    reader: Reader,
    snap: Snapshot,
    *,
    models: list[str],
    metric: str | None,
    component: str | None,
    metric_version: str | None,
    model_id: int | None = None,
    run_ids: list[int] | None = None,
) -> Answer:
    if metric is not None:
        check_metric(metric)
    check_component(component)
    check_models(models, "a,b")
    entries = (
        [snap.model(models[0], model_id)] if model_id is not None else snap.models_named(models)
    )
    version = metric_version or METRIC_VERSION
    chosen = chosen_runs(snap, entries, run_ids)
    family = family_needed(metric) if metric is not None else None
    staged_picks: dict[int, Pick | None] = {}
    measured_picks: dict[int, Pick | None] = {}
    for m in entries:
        if m.id in chosen:  # the named run gives both, where it has them
            pick = pick_run(
                snap, m, family=None, run_id=chosen[m.id], metric_version=None, what="stages"
            )
            staged_picks[m.id] = pick if pick.run.has_stages else None
            if metric is not None:
                has = family is None or family in pick.run.families
                measured_picks[m.id] = pick if has else None
            continue
        staged_picks[m.id] = snap.canonical(m.id, staged=True, metric_version=version)
        if metric is not None:
            measured_picks[m.id] = snap.canonical(m.id, family=family, metric_version=version)
    staged = {m: p.run if p else None for m, p in staged_picks.items()}
    measured: dict[int, RunEntry | None] = {
        m: p.run if p else None for m, p in measured_picks.items()
    }
    runs = [r for r in (*staged.values(), *measured.values()) if r is not None]
    picks = [p for p in (*staged_picks.values(), *measured_picks.values()) if p is not None]
    context = Stages(metric, component, [], [])

    def load() -> pl.DataFrame:
        bounds = repo.boundaries_of_runs(reader.cursor(), [r.id for r in staged.values() if r])
        by_run: dict[int, list[dict[str, Any]]] = {}
        for row in bounds:
            by_run.setdefault(row["run_id"], []).append(row)
        spans: list[dict[str, Any]] = []
        for model in entries:
            run, metric_run = staged[model.id], measured.get(model.id)
            rows = by_run.get(run.id, []) if run else []
            context.models.append(
                ModelStages(
                    model.id,
                    model.name,
                    model.n_layers,
                    run.id if run else None,
                    metric_run.id if metric_run else None,
                    [boundary(r) for r in rows],
                    _ref(staged_picks[model.id]),
                    _ref(measured_picks.get(model.id)),
                )
            )
            spans += _spans(model, {r["boundary"]: r["layer"] for r in rows})
        frame = pl.DataFrame(
            spans,
            schema={
                "model_id": pl.Int64,
                "model": pl.String,
                "stage": pl.Int64,
                "stage_name": pl.String,
                "clear": pl.Boolean,
                "layer_start": pl.Int64,
                "layer_end": pl.Int64,
                "relative_depth_start": pl.Float64,
                "relative_depth_end": pl.Float64,
            },
        )
        metric_runs = {r.id: m for m, r in measured.items() if r is not None}
        values = reader.rows(
            [r for r in measured.values() if r is not None],
            [metric] if metric else [],
            component=component,
        )
        present = values["component"].drop_nulls().unique().to_list()
        if component is None and len(present) > 1:
            raise UnprocessableHttpError(
                f"{metric} has rows for components "
                f"{', '.join(sorted(present))}"
                ": choose one with component="
            )
        values = values.with_columns(
            model_id=pl.col("run_id").replace_strict(
                metric_runs, default=None, return_dtype=pl.Int64
            )
        )
        out = aggregate(frame, values)
        return out.with_columns(
            metric=pl.lit(metric, pl.String), component=pl.lit(component, pl.String)
        ).sort("model", "model_id", "stage")

    return Answer(context, columns(StageRow), runs, len(chosen) == len(entries), load, picks)


def _ref(pick: Pick | None) -> RunRef | None:
    return None if pick is None else run_ref(pick)
