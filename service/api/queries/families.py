"""Refit families and their head stability (stored by `strata stability --store`)."""

from __future__ import annotations

import polars as pl

from compute.run import METRIC_VERSION
from service.api.errors import NotFoundHttpError, UnprocessableHttpError
from service.api.queries.answers import Answer, check_layers, check_metric, model_ref, run_ref
from service.api.queries.cache import Reader
from service.api.queries.index import Snapshot
from service.api.queries.models_and_runs import utc
from service.api.schemas.families import Family, Stability, StabilityRow
from service.api.schemas.results import columns
from service.store import repositories as repo

STABILITY_METRICS = (
    "heads.stability",
    "heads.stability_std",
    "heads.stability_null",
    "heads.stability_null_std",
    "heads.residual_cka.linear",
    "heads.residual_cka.rbf",
)


def list_families(reader: Reader, snap: Snapshot) -> list[Family]:
    with reader.store.read() as conn:
        families = repo.list_families(conn)
        members = {f.id: repo.family_members(conn, f.id) for f in families}
    return [_family(snap, f, [m.id for m in members[f.id]]) for f in families]


def _family(snap: Snapshot, family: object, member_ids: list[int]) -> Family:
    anchor = snap.models[family.anchor_model_id]  # type: ignore[attr-defined]
    return Family(
        family.id,  # type: ignore[attr-defined]
        family.name,  # type: ignore[attr-defined]
        family.description,  # type: ignore[attr-defined]
        model_ref(anchor),
        [model_ref(snap.models[m]) for m in member_ids],
        utc(family.created_at),  # type: ignore[attr-defined, arg-type]
    )


def get_family(reader: Reader, snap: Snapshot, name: str) -> Family:
    with reader.store.read() as conn:
        family = repo.family_by_name(conn, name)
        if family is None:
            known = ", ".join(f.name for f in repo.list_families(conn)) or "none stored yet"
            raise NotFoundHttpError(
                f"no refit family {name!r} (known: {known}); `strata stability --store` stores one"
            )
        members = repo.family_members(conn, family.id)
    return _family(snap, family, [m.id for m in members])


def stability(
    reader: Reader,
    snap: Snapshot,
    name: str,
    *,
    metric: str | None,
    per_head: bool,
    layer_min: int | None,
    layer_max: int | None,
    metric_version: str | None,
) -> Answer:
    """The family's latest stability rows: per layer, and per head with `per_head`."""
    if metric is not None:
        check_metric(metric)
        if metric not in STABILITY_METRICS:
            raise UnprocessableHttpError(
                f"{metric} is not a stability metric; one of " + ", ".join(STABILITY_METRICS)
            )
    check_layers(layer_min, layer_max)
    family = get_family(reader, snap, name)
    run = snap.stability_run(name, metric_version or METRIC_VERSION)
    if run is None:
        raise NotFoundHttpError(
            f"refit family {name!r} has no stored stability run under this metric version"
        )
    metrics = [metric] if metric else list(STABILITY_METRICS)
    context = Stability(family, run_ref(run), [])

    def load() -> pl.DataFrame:
        layers = reader.rows([run], metrics, layer_min=layer_min, layer_max=layer_max)
        if not per_head:
            return layers
        heads = reader.rows([run], metrics, layer_min=layer_min, layer_max=layer_max, heads=True)
        return pl.concat([layers, heads]).sort("metric", "layer", "head", nulls_last=False)

    return Answer(context, columns(StabilityRow), [run], False, load)
