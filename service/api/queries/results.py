"""One model's per-layer and per-head rows of a metric."""

from __future__ import annotations

import polars as pl

from compute.records import unit_of
from compute.run import stderr_basis
from service.api.errors import UnprocessableHttpError
from service.api.queries.answers import (
    Answer,
    check_component,
    check_layers,
    check_metric,
    family_needed,
    model_ref,
    pick_run,
    run_ref,
)
from service.api.queries.cache import Reader
from service.api.queries.index import ModelEntry, Pick, Snapshot
from service.schemas.results import (
    HeadRow,
    HeadRows,
    MetricRow,
    MetricRows,
    SequenceRow,
    SequenceRows,
    columns,
)
from service.store import repositories as repo

PER_HEAD_FAMILIES = ("heads", "heads_atp", "heads_screen", "attention")
PER_NEURON_METRICS = (
    "neurons.vocab_mean",
    "neurons.vocab_var",
    "neurons.vocab_skew",
    "neurons.vocab_kurt",
)


def _per_layer_run(
    snap: Snapshot,
    model_ref_: str,
    metric: str,
    component: str | None,
    layer_min: int | None,
    layer_max: int | None,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
    *,
    per_neuron: str,
) -> tuple[ModelEntry, Pick]:
    """The checked request of a per-layer metric and the run it is read from; a per-neuron
    metric is refused with `per_neuron` (what to do instead)."""
    check_metric(metric)
    check_component(component)
    check_layers(layer_min, layer_max)
    if metric in PER_NEURON_METRICS:
        raise UnprocessableHttpError(f"{metric} is per neuron: {per_neuron}")
    model = snap.model(model_ref_, model_id)
    pick = pick_run(
        snap,
        model,
        family=family_needed(metric),
        run_id=run_id,
        metric_version=metric_version,
        what=metric,
    )
    return model, pick


def metric_rows(
    reader: Reader,
    snap: Snapshot,
    model_ref_: str,
    *,
    metric: str,
    component: str | None,
    layer_min: int | None,
    layer_max: int | None,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
) -> Answer:
    """Per-layer rows of `metric` (all components unless one is given) from one run."""
    model, pick = _per_layer_run(
        snap,
        model_ref_,
        metric,
        component,
        layer_min,
        layer_max,
        run_id,
        metric_version,
        model_id,
        per_neuron="read it from /models/{model}/neurons",
    )
    run = pick.run
    context = MetricRows(model_ref(model), run_ref(pick), metric, component, [])
    return Answer(
        context,
        columns(MetricRow),
        [run],
        run_id is not None,
        lambda: reader.rows(
            [run], [metric], component=component, layer_min=layer_min, layer_max=layer_max
        ),
        [pick],
    )


def head_rows(
    reader: Reader,
    snap: Snapshot,
    model_ref_: str,
    *,
    metric: str,
    layer_min: int | None,
    layer_max: int | None,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
) -> Answer:
    """Per-head rows of `metric` (a heads.*, heads_atp.*, heads_screen.* or attention.*
    metric) from one run."""
    check_metric(metric)
    check_layers(layer_min, layer_max)
    family = family_needed(metric)
    if family not in PER_HEAD_FAMILIES:
        raise UnprocessableHttpError(
            f"{metric} has no per-head rows; per-head metrics are heads.*, heads_atp.*, "
            "heads_screen.* and attention.*"
        )
    model = snap.model(model_ref_, model_id)
    pick = pick_run(
        snap, model, family=family, run_id=run_id, metric_version=metric_version, what=metric
    )
    run = pick.run
    context = HeadRows(model_ref(model), run_ref(pick), metric, [])
    return Answer(
        context,
        columns(HeadRow),
        [run],
        run_id is not None,
        lambda: reader.rows([run], [metric], layer_min=layer_min, layer_max=layer_max, heads=True),
        [pick],
    )


def sequence_rows(
    reader: Reader,
    snap: Snapshot,
    model_ref_: str,
    *,
    metric: str,
    component: str | None,
    layer_min: int | None,
    layer_max: int | None,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
) -> Answer:
    """Per-sequence means of `metric` (all components and heads unless a component is given)
    from one run: the samples behind each per-layer row's value and stderr."""
    model, pick = _per_layer_run(
        snap,
        model_ref_,
        metric,
        component,
        layer_min,
        layer_max,
        run_id,
        metric_version,
        model_id,
        per_neuron="it has no per-sequence means",
    )
    run = pick.run
    if stderr_basis(run.metric_version) == "token":
        raise UnprocessableHttpError(
            f"run {run.id} is of metric version 1, which kept no per-sequence means; its errors "
            "are token-level (stderr_basis: token)"
        )
    context = SequenceRows(model_ref(model), run_ref(pick), metric, component, [])

    def load() -> pl.DataFrame:
        frame = repo.sequence_means(reader.cursor(), run.id, [metric])
        if component is not None:
            frame = frame.filter(pl.col("component") == component)
        if layer_min is not None:
            frame = frame.filter(pl.col("layer") >= layer_min)
        if layer_max is not None:
            frame = frame.filter(pl.col("layer") <= layer_max)
        return frame.with_columns(pl.lit(unit_of(metric)).alias("unit"))

    return Answer(context, columns(SequenceRow), [run], run_id is not None, load, [pick])
