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
from service.api.queries.index import ModelEntry, Pick, RunEntry, Snapshot
from service.schemas.common import ModelRef, RunRef
from service.store.repositories import family_of


@dataclass
class Answer:
    context: msgspec.Struct  # the JSON answer, without its rows
    columns: tuple[str, ...]  # the row type's fields
    runs: list[RunEntry]  # read from (for the ETag)
    pinned: bool  # the request named its run(s): the answer cannot change
    load: Callable[[], pl.DataFrame]
    # the runs read and why each (X-Strata-Run, and the ETag: the same rows may become the
    # canonical ones, which the context says); default: `runs`, named by the request
    picks: list[Pick] | None = None

    def chosen(self) -> list[Pick]:
        if self.picks is not None:
            return self.picks
        return [Pick(run, "run_id", False) for run in self.runs]


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
) -> Pick:
    """The run to read: `run_id` if given (it must be one of the model's succeeded runs), else
    the model's canonical run for `family` under `metric_version` (default: current)."""
    version = metric_version or METRIC_VERSION
    if run_id is not None:
        run = checked_run(snap, model, run_id, family)
        canonical = snap.canonical(model.id, family=family, metric_version=run.metric_version)
        is_canonical = canonical is not None and canonical.canonical and canonical.run == run
        return Pick(run, "run_id", is_canonical)
    pick = snap.canonical(model.id, family=family, metric_version=version)
    if pick is None:
        raise NotFoundHttpError(
            f"model {model.name!r} (id {model.id}) has no succeeded run with "
            f"{what} under metric version {version}"
        )
    return pick


def checked_run(snap: Snapshot, model: ModelEntry, run_id: int, family: str | None) -> RunEntry:
    """Run `run_id`, which must be a succeeded run of `model` that computed `family`; a 404
    that says what it is otherwise."""
    run = snap.runs.get(run_id)
    if run is None or run.model_id != model.id:
        owner = "" if run is None else f" (run {run_id} is model {run.model_id}'s)"
        raise NotFoundHttpError(
            f"model {model.name!r} (id {model.id}) has no run {run_id}{owner}; "
            f"GET /api/v1/runs?model={model.id} lists its runs"
        )
    if run.status != "succeeded":
        raise NotFoundHttpError(f"run {run_id} is {run.status}: it has no results to read")
    if family is not None and family not in run.families:
        raise NotFoundHttpError(
            f"run {run_id} did not compute {family} (it computed {', '.join(sorted(run.families))})"
        )
    return run


def chosen_runs(
    snap: Snapshot, entries: list[ModelEntry], run_ids: list[int] | None
) -> dict[int, int]:
    """`run_ids` of a cross-model query by model: each must be a run of one of the listed
    models (at most one per model); it replaces that model's canonical run."""
    out: dict[int, int] = {}
    listed = {m.id for m in entries}
    for run_id in run_ids or ():
        run = snap.runs.get(run_id)
        if run is None or run.model_id not in listed:
            raise NotFoundHttpError(
                f"run {run_id} is not a run of the listed models "
                f"({', '.join(m.name for m in entries)}); GET /api/v1/runs lists the runs"
            )
        if run.model_id in out:
            raise UnprocessableHttpError(
                f"runs {out[run.model_id]} and {run_id} are both runs of model "
                f"{snap.models[run.model_id].name!r}: give at most one run per model"
            )
        out[run.model_id] = run_id
    return out


def family_needed(metric: str) -> str | None:
    return family_of(metric)


def model_ref(model: ModelEntry) -> ModelRef:
    return ModelRef(model.id, model.name, model.n_layers)


def run_ref(pick: Pick | RunEntry) -> RunRef:
    """What an answer says about the run it was read from (a bare run: named by its
    request, as a family's stability run is)."""
    if isinstance(pick, RunEntry):
        pick = Pick(pick, "run_id", False)
    run = pick.run
    finished = None if run.finished_at is None else run.finished_at.replace(tzinfo=UTC)
    return RunRef(
        run.id,
        run.metric_version,
        finished,
        stderr_basis(run.metric_version),
        selected_by=pick.basis,
        canonical=pick.canonical,
        config_hash=run.config_hash,
        tokens=run.tokens,
        n_sequences=run.n_sequences,
        seq_len=run.seq_len,
        dtype=run.dtype,
        families=sorted(run.families),
    )


def run_header(picks: list[Pick]) -> str:
    """The `X-Strata-Run` header of an answer: each run it was read from as
    `ID; model=MODEL_ID; selected_by=...; canonical=true|false; metric_version=...;
    config_hash=...; tokens=...; n_sequences=...; seq_len=...; dtype=...`, runs separated by
    commas (every value is a number or a word: no quoting needed)."""
    parts = []
    for pick in picks:
        run = pick.run
        fields = {
            "model": run.model_id,
            "selected_by": pick.basis,
            "canonical": "true" if pick.canonical else "false",
            "metric_version": run.metric_version,
            "config_hash": run.config_hash,
            "tokens": run.tokens,
            "n_sequences": run.n_sequences,
            "seq_len": run.seq_len,
            "dtype": run.dtype,
        }
        text = "; ".join(f"{k}={v}" for k, v in fields.items() if v is not None and v != "")
        parts.append(f"{run.id}; {text}")
    return ", ".join(parts)
