"""Refit families and their head stability (made through the API or stored by `strata
stability --store`; computed by a worker's stability job or by `strata stability --store`)."""

from __future__ import annotations

import json

import polars as pl
from sqlalchemy.orm import Session

from compute.run import METRIC_VERSION
from service.api.errors import NotFoundHttpError, UnprocessableHttpError
from service.api.queries.answers import Answer, check_layers, check_metric, model_ref, run_ref
from service.api.queries.cache import Reader
from service.api.queries.index import Pick, RunEntry, Snapshot
from service.api.queries.models_and_runs import utc
from service.schemas.common import ModelRef
from service.schemas.families import (
    Family,
    FamilyJob,
    FamilyMember,
    FamilySettings,
    Stability,
    StabilityImportance,
    StabilityImportanceRow,
    StabilityRow,
)
from service.schemas.results import columns
from service.store import families as stored_families
from service.store import job_rows
from service.store.families import StoredFamily
from service.store.tables import RegisteredModelRow, RunRow

STABILITY_METRICS = (
    "heads.stability",
    "heads.stability_std",
    "heads.stability_null",
    "heads.stability_null_std",
    "heads.residual_cka.linear",
    "heads.residual_cka.rbf",
    "heads.residual_cka_null.linear",
    "heads.residual_cka_null.rbf",
    "heads.peer_similarity",
)


def list_families(reader: Reader, snap: Snapshot) -> list[Family]:
    with reader.store.read() as conn, Session(bind=conn) as session:
        return [family_out(session, snap, f) for f in stored_families.all_families(session)]


def get_family(reader: Reader, snap: Snapshot, name: str) -> Family:
    """One family (`FamilyNotFoundError`, 404, naming the known ones)."""
    with reader.store.read() as conn, Session(bind=conn) as session:
        return family_out(session, snap, stored_families.load(session, name))


def _run_members(session: Session, run: RunEntry) -> set[str]:
    row = session.get(RunRow, run.id)
    return {
        json.dumps(m, sort_keys=True)
        for m in ((row.config or {}) if row else {}).get("members", [])
    }


def current_stability_run(
    session: Session, snap: Snapshot, stored: StoredFamily, metric_version: str = METRIC_VERSION
) -> RunEntry | None:
    """The family's current stability run: the newest of its present members (a run of an
    earlier membership that finished late does not displace it, and reconciliation, which
    finds the present configuration computed, would never replace it again); else the newest."""
    runs = snap.stability_runs(stored.family.name, metric_version)
    present = {json.dumps(m.spec, sort_keys=True) for m in stored.members}
    return next((r for r in runs if _run_members(session, r) == present), runs[0] if runs else None)


def _current_run(reader: Reader, snap: Snapshot, name: str, version: str) -> RunEntry | None:
    with reader.store.read() as conn, Session(bind=conn) as session:
        return current_stability_run(session, snap, stored_families.load(session, name), version)


def family_out(session: Session, snap: Snapshot, stored: StoredFamily) -> Family:
    """A family as the API shows it: anchor, members with their state, settings, its current
    stability run and newest stability job."""
    name = stored.family.name
    run = current_stability_run(session, snap, stored)
    computed = _run_members(session, run) if run is not None else set()
    job = job_rows.latest_stability_job(session, name)

    def ref(model: RegisteredModelRow) -> ModelRef:
        entry = snap.models.get(model.id)
        return model_ref(entry) if entry is not None else ModelRef(model.id, model.name, None)

    states = [
        FamilyMember(
            ref(m),
            m.id == stored.anchor_id,
            "current" if json.dumps(m.spec, sort_keys=True) in computed else "pending",
            m.architecture,
            m.n_heads,
            m.d_model,
        )
        for m in stored.members
    ]
    opts = stored.options
    return Family(
        stored.family.id,
        name,
        stored.family.description,
        ref(stored.anchor),
        [ref(m) for m in stored.members],
        utc(stored.family.created_at),  # type: ignore[arg-type]
        FamilySettings(opts.n_prompts, opts.prompt_len, opts.seed, opts.n_null, opts.cka_tokens),
        states,
        run.id if run is not None else None,
        FamilyJob(job.id, job.state, job.reason, job.run_id) if job is not None else None,
        stored.origin,
    )


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
    run = _current_run(reader, snap, name, metric_version or METRIC_VERSION)
    if run is None:
        raise NotFoundHttpError(
            f"refit family {name!r} has no stored stability run under this metric version"
        )
    metrics = [metric] if metric else list(STABILITY_METRICS)
    context = Stability(family, run_ref(Pick(run, "latest", True)), [])

    def load() -> pl.DataFrame:
        layers = reader.rows([run], metrics, layer_min=layer_min, layer_max=layer_max)
        if not per_head:
            return layers
        heads = reader.rows([run], metrics, layer_min=layer_min, layer_max=layer_max, heads=True)
        return pl.concat([layers, heads]).sort("metric", "layer", "head", nulls_last=False)

    return Answer(context, columns(StabilityRow), [run], False, load, [Pick(run, "latest", True)])


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
    run = _current_run(reader, snap, name, version)
    if run is None:
        raise NotFoundHttpError(
            f"refit family {name!r} has no stored stability run under this metric version"
        )
    heads_pick = snap.canonical(family.anchor.id, family="heads", metric_version=version)
    if heads_pick is None:
        raise NotFoundHttpError(
            f"the family's anchor {family.anchor.name!r} has no heads run under this metric "
            f'version: submit one (POST /api/v1/jobs with metrics ["heads"]) first'
        )
    heads_run = heads_pick.run
    stability_pick = Pick(run, "latest", True)
    context = StabilityImportance(
        family, run_ref(stability_pick), run_ref(heads_pick), importance, []
    )

    def load() -> pl.DataFrame:
        stab = reader.rows([run], ["heads.stability"], heads=True).select(
            "layer", "head", "relative_depth", pl.col("value").alias("stability")
        )
        imp = reader.rows([heads_run], [importance], heads=True).select(
            "layer", "head", pl.col("value").alias("importance")
        )
        return correlate_by_layer(stab.join(imp, on=["layer", "head"], how="inner"))

    return Answer(
        context,
        columns(StabilityImportanceRow),
        [run, heads_run],
        False,
        load,
        [stability_pick, heads_pick],
    )


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
