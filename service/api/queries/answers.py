"""What every data query shares: checking a metric name, picking the run to read, and the
`Answer` a handler turns into a response.

An `Answer` knows its runs before it reads any row, so the handler can answer a matching
`If-None-Match` with 304 without reading; `load()` reads the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC

import msgspec
import polars as pl

from compute.records import COMPONENTS, unit_of
from compute.run import METRIC_VERSION, stderr_basis
from service.api.errors import NotFoundHttpError, UnprocessableHttpError
from service.api.queries.index import ModelEntry, RunEntry, Snapshot
from service.schemas.common import ModelRef, RunRef
from service.store.repositories import family_of


@dataclass
class Answer:
    context: msgspec.Struct  # the JSON answer, without its rows
    columns: tuple[str, ...]  # the row type's fields
    runs: list[RunEntry]  # read from (for the ETag)
    pinned: bool  # the request named its run(s): the answer cannot change
    load: Callable[[], pl.DataFrame]


def check_metric(metric: str) -> str:
    if unit_of(metric) is None:
        raise UnprocessableHttpError(
            f"unknown metric {metric!r}: names are family.metric as in "
            "docs/metrics.md, e.g. intervention.kl, logit_lens.kl_to_final"
        )
    return metric


def check_component(component: str | None) -> str | None:
    if component is not None and component not in COMPONENTS:
        raise UnprocessableHttpError(
            f"unknown component {component!r}; one of " + ", ".join(sorted(COMPONENTS))
        )
    return component


MAX_MODELS = 100  # models in one cross-model query


def check_models(models: list[str], example: str) -> list[str]:
    """The model list of a cross-model query: present and at most MAX_MODELS long."""
    if not models:
        raise UnprocessableHttpError(f"give the models: models={example} (names or ids)")
    if len(models) > MAX_MODELS:
        raise UnprocessableHttpError(f"at most {MAX_MODELS} models at once")
    return models


def check_layers(layer_min: int | None, layer_max: int | None) -> None:
    if layer_min is not None and layer_max is not None and layer_min > layer_max:
        raise UnprocessableHttpError(f"layer_min {layer_min} is above layer_max {layer_max}")


def pick_run(
    snap: Snapshot,
    model: ModelEntry,
    *,
    family: str | None,
    run_id: int | None,
    metric_version: str | None,
    what: str,
) -> RunEntry:
    """The run to read: `run_id` if given (it must be one of the model's succeeded runs), else
    the model's current run computing `family` under `metric_version` (default: current)."""
    if run_id is not None:
        run = snap.runs.get(run_id)
        if run is None or run.model_id != model.id:
            raise NotFoundHttpError(f"model {model.name!r} (id {model.id}) has no run {run_id}")
        if run.status != "succeeded":
            raise NotFoundHttpError(f"run {run_id} is {run.status}: it has no results to read")
        if family is not None and family not in run.families:
            raise NotFoundHttpError(
                f"run {run_id} did not compute {family} (it computed "
                f"{', '.join(sorted(run.families))})"
            )
        return run
    version = metric_version or METRIC_VERSION
    run = snap.current_run(model.id, family=family, metric_version=version)
    if run is None:
        raise NotFoundHttpError(
            f"model {model.name!r} (id {model.id}) has no succeeded run with "
            f"{what} under metric version {version}"
        )
    return run


def family_needed(metric: str) -> str | None:
    return family_of(metric)


def model_ref(model: ModelEntry) -> ModelRef:
    return ModelRef(model.id, model.name, model.n_layers)


def run_ref(run: RunEntry) -> RunRef:
    finished = None if run.finished_at is None else run.finished_at.replace(tzinfo=UTC)
    return RunRef(run.id, run.metric_version, finished, stderr_basis(run.metric_version))
