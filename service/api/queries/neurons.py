"""Neurons of a model's run: the top neurons of a class per layer, and class counts per layer."""

from __future__ import annotations

from typing import Literal

import polars as pl

from service.api.queries.answers import Answer, check_layers, model_ref, pick_run, run_ref
from service.api.queries.cache import Reader
from service.api.queries.index import Snapshot
from service.schemas.neurons import NeuronCountRow, NeuronCounts, NeuronRow, Neurons
from service.schemas.results import columns
from service.store import repositories as repo

NeuronClass = Literal["prediction", "suppression", "partition"]
COUNT_METRICS = tuple(
    f"neurons.{kind}_{cls}"
    for kind in ("n", "frac")
    for cls in ("prediction", "suppression", "partition")
)


def top_neurons(
    reader: Reader,
    snap: Snapshot,
    model_ref_: str,
    *,
    neuron_class: NeuronClass,
    top: int,
    layer: int | None,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
) -> Answer:
    """The `top` neurons of a class in each layer (or one layer) with moments and tokens:
    prediction / suppression ranked by kurtosis, partition by variance."""
    model = snap.model(model_ref_, model_id)
    pick = pick_run(
        snap, model, family="neurons", run_id=run_id, metric_version=metric_version, what="neurons"
    )
    run = pick.run
    context = Neurons(model_ref(model), run_ref(pick), neuron_class, top, [])

    def load() -> pl.DataFrame:
        return repo.neurons(
            reader.cursor(), run.id, layer=layer, neuron_class=neuron_class, top_k=top
        )

    return Answer(context, columns(NeuronRow), [run], run_id is not None, load, [pick])


def neuron_counts(
    reader: Reader,
    snap: Snapshot,
    model_ref_: str,
    *,
    layer_min: int | None,
    layer_max: int | None,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
) -> Answer:
    """Per layer: how many neurons are of each class, and as fractions of d_mlp."""
    check_layers(layer_min, layer_max)
    model = snap.model(model_ref_, model_id)
    pick = pick_run(
        snap, model, family="neurons", run_id=run_id, metric_version=metric_version, what="neurons"
    )
    run = pick.run
    context = NeuronCounts(model_ref(model), run_ref(pick), [])

    def load() -> pl.DataFrame:
        rows = reader.rows([run], COUNT_METRICS, layer_min=layer_min, layer_max=layer_max)
        wide = (
            rows.pivot(
                "metric",
                index=["layer", "relative_depth"],
                values="value",
                aggregate_function="first",
            )
            if rows.height
            else pl.DataFrame(schema={"layer": pl.Int32, "relative_depth": pl.Float64})
        )
        for metric in COUNT_METRICS:
            name = metric.removeprefix("neurons.")
            dtype = pl.Int64 if name.startswith("n_") else pl.Float64
            wide = wide.with_columns(
                (pl.col(metric) if metric in wide.columns else pl.lit(None)).cast(dtype).alias(name)
            )
        return wide.sort("layer")

    return Answer(context, columns(NeuronCountRow), [run], run_id is not None, load, [pick])
