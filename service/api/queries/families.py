"""Refit families and their head stability (stored by `strata stability --store`)."""

from __future__ import annotations

import polars as pl

from compute.run import METRIC_VERSION
from service.api.errors import NotFoundHttpError, UnprocessableHttpError
from service.api.queries.answers import Answer, check_layers, check_metric, model_ref, run_ref
from service.api.queries.cache import Reader
from service.api.queries.index import Snapshot
from service.api.queries.models_and_runs import utc
from service.schemas.families import (
    Family,
    Stability,
    StabilityImportance,
    StabilityImportanceRow,
    StabilityRow,
)
from service.schemas.results import columns
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


IMPORTANCE_METRICS = ("heads.ablation_kl", "heads.ablation_loss_delta", "heads.ablation_top1")


def stability_importance(
    reader: Reader,
    snap: Snapshot,
    name: str,
    *,
    importance: str,
    metric_version: str | None,
) -> Answer:
    """Per layer, the correlation over heads between each head's stability across the family's
    refits (`heads.stability`, per head) and its ablation importance on the anchor (`importance`,
    per head, from the anchor's current heads run): the question of claim (3) of the
    head-stability paper — do unstable heads matter more than their peers in the same layer?"""
    if importance not in IMPORTANCE_METRICS:
        raise UnprocessableHttpError(
            f"importance {importance!r} is not a per-head ablation metric; one of "
            + ", ".join(IMPORTANCE_METRICS)
        )
    family = get_family(reader, snap, name)
    version = metric_version or METRIC_VERSION
    run = snap.stability_run(name, version)
    if run is None:
        raise NotFoundHttpError(
            f"refit family {name!r} has no stored stability run under this metric version"
        )
    heads_run = snap.current_run(family.anchor.id, family="heads", metric_version=version)
    if heads_run is None:
        raise NotFoundHttpError(
            f"the family's anchor {family.anchor.name!r} has no heads run under this metric "
            f'version: submit one (POST /api/v1/jobs with metrics ["heads"]) first'
        )
    context = StabilityImportance(family, run_ref(run), run_ref(heads_run), importance, [])

    def load() -> pl.DataFrame:
        stab = reader.rows([run], ["heads.stability"], heads=True).select(
            "layer", "head", "relative_depth", pl.col("value").alias("stability")
        )
        imp = reader.rows([heads_run], [importance], heads=True).select(
            "layer", "head", pl.col("value").alias("importance")
        )
        return correlate_by_layer(stab.join(imp, on=["layer", "head"], how="inner"))

    return Answer(context, columns(StabilityImportanceRow), [run, heads_run], False, load)


def correlate_by_layer(joined: pl.DataFrame) -> pl.DataFrame:
    """Per layer over heads: Pearson r with its Fisher-z 95% interval, Spearman rho, the means.
    A correlation needs 3 heads and two non-constant columns (else null); the interval 4."""
    z = 1.959963984540054
    out = (
        joined.group_by("layer")
        .agg(
            pl.col("relative_depth").first(),
            pl.len().alias("n_heads"),
            pl.corr("stability", "importance").alias("pearson"),
            pl.corr("stability", "importance", method="spearman").alias("spearman"),
            pl.col("stability").mean().alias("mean_stability"),
            pl.col("importance").mean().alias("mean_importance"),
            (pl.col("stability").std() > 0).alias("_s"),
            (pl.col("importance").std() > 0).alias("_i"),
        )
        .with_columns(
            pl.when((pl.col("n_heads") >= 3) & pl.col("_s") & pl.col("_i"))
            .then(pl.col("pearson"))
            .alias("pearson"),
            pl.when((pl.col("n_heads") >= 3) & pl.col("_s") & pl.col("_i"))
            .then(pl.col("spearman"))
            .alias("spearman"),
        )
        .with_columns(
            # clipped away from +-1, where atanh is infinite
            pl.col("pearson").clip(-0.999999, 0.999999).arctanh().alias("_z"),
            (1.0 / (pl.col("n_heads") - 3).cast(pl.Float64).sqrt()).alias("_se"),
        )
        .with_columns(
            pl.when(pl.col("n_heads") >= 4)
            .then((pl.col("_z") - z * pl.col("_se")).tanh())
            .alias("pearson_low"),
            pl.when(pl.col("n_heads") >= 4)
            .then((pl.col("_z") + z * pl.col("_se")).tanh())
            .alias("pearson_high"),
        )
        .sort("layer")
    )
    return out.select(columns(StabilityImportanceRow))
