"""Models and runs as the API shows them (from the store's ORM rows)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from compute.run import METRIC_VERSION, stderr_basis
from service.api.errors import NotFoundHttpError
from service.api.queries.index import Pick, Snapshot
from service.schemas.models import (
    AppliedProcessing,
    Model,
    ModelDetail,
    ModelPage,
    ParityReport,
)
from service.schemas.runs import Run, RunPage, RunResources, Timings
from service.store import Store
from service.store import repositories as repo
from service.store.tables import RegisteredModelRow, RunRow


def utc(value: datetime | None) -> datetime | None:
    """Stored timestamps are naive UTC; answers say so."""
    return None if value is None else value.replace(tzinfo=UTC)


def model_out(
    model: RegisteredModelRow,
    families: list[str],
    canonical: dict[str, Pick],
    parity: tuple[dict[str, object], int] | None = None,
) -> Model:
    return Model(
        id=model.id,
        name=model.name,
        source=model.source,
        revision=model.revision,
        spec=model.spec,
        architecture=model.architecture,
        n_layers=model.n_layers,
        d_model=model.d_model,
        n_heads=model.n_heads,
        d_mlp=model.d_mlp,
        d_vocab=model.d_vocab,
        d_vocab_real=model.d_vocab_real,
        n_ctx=model.n_ctx,
        n_params=model.n_params,
        normalization_type=model.normalization_type,
        parallel_attn_mlp=model.parallel_attn_mlp,
        processing=AppliedProcessing(
            model.fold_ln,
            model.center_writing_weights,
            model.center_unembed,
            model.fold_value_biases,
            list(model.processing_notes or []),
        ),
        refit_families=families,
        registered_at=utc(model.registered_at),  # type: ignore[arg-type]
        current_runs={f: pick.run.id for f, pick in canonical.items()},
        current_run_basis={f: pick.basis for f, pick in canonical.items()},
        parity=msgspec.convert(parity[0], ParityReport) if parity else None,
        n_experts=parity[1] if parity else None,
    )


def list_models(
    store: Store,
    snap: Snapshot,
    *,
    source: str | None,
    family: str | None,
    architecture: str | None,
    name: str | None,
    min_layers: int | None,
    max_layers: int | None,
    limit: int,
    offset: int,
) -> ModelPage:
    with store.read() as conn:
        models, total = repo.filter_models(
            conn,
            source=source,
            refit_family=family,
            architecture=architecture,
            name=name,
            min_layers=min_layers,
            max_layers=max_layers,
            limit=limit,
            offset=offset,
        )
        families = repo.model_families(conn, [m.id for m in models])
        parity = repo.model_parity(conn, [m.id for m in models])
    items = [
        model_out(m, families.get(m.id, []), snap.canonical_runs(m.id), parity.get(m.id))
        for m in models
    ]
    return ModelPage(
        items, total, limit, offset, offset + limit if offset + limit < total else None
    )


def get_model(store: Store, snap: Snapshot, ref: str, model_id: int | None) -> ModelDetail:
    entry = snap.model(ref, model_id)
    with store.read() as conn:
        model = repo.get_model(conn, entry.id)
        if model is None:  # registered and removed since the snapshot: cannot happen today
            raise NotFoundHttpError(f"model {ref!r} is gone")
        families = repo.model_families(conn, [entry.id]).get(entry.id, [])
        n_runs = repo.count_runs(conn, model_id=entry.id)
        parity = repo.model_parity(conn, [entry.id]).get(entry.id)
    current = snap.current_run(entry.id, metric_version=METRIC_VERSION)
    default = snap.default_run(entry.id)
    base = model_out(model, families, snap.canonical_runs(entry.id), parity)
    return ModelDetail(
        **{f: getattr(base, f) for f in base.__struct_fields__},
        n_runs=n_runs,
        current_run_id=current.id if current else None,
        same_name_ids=[i for i in snap.by_name.get(entry.name, []) if i != entry.id],
        default_run_id=default.id if default else None,
        pinned={f: pin.run_id for f, pin in snap.model_pins(entry.id).items()},
    )


def run_out(
    run: RunRow,
    model_name: str,
    parity: dict[str, object] | None = None,
    lens: dict[str, Any] | None = None,
    resources: dict[str, Any] | None = None,
) -> Run:
    return Run(
        id=run.id,
        model_id=run.model_id,
        model=model_name,
        status=run.status,
        progress=run.progress,
        error=run.error,
        families=list(run.families),
        config_hash=run.config_hash,
        metric_version=run.metric_version,
        stderr_basis=stderr_basis(run.metric_version),
        code_version=run.code_version,
        config=run.config,
        device=run.device,
        dtype=run.dtype,
        tokens_evaluated=run.tokens_evaluated,
        n_records=run.n_records,
        token_source_id=run.token_source_id,
        timings=Timings(
            utc(run.created_at),  # type: ignore[arg-type]
            utc(run.started_at),
            utc(run.finished_at),
            run.wall_s,
        ),
        environment=run.environment,
        parity=msgspec.convert(parity, ParityReport) if parity else None,
        tuned_lens=lens,
        resources=msgspec.convert(resources, RunResources) if resources else None,
    )


def list_runs(
    store: Store,
    snap: Snapshot,
    *,
    model: str | None,
    model_id: int | None,
    status: str | None,
    family: str | None,
    metric_version: str | None,
    limit: int,
    offset: int,
) -> RunPage:
    owner = snap.model(model, model_id).id if model is not None else model_id
    if owner is not None and owner not in snap.models:
        raise NotFoundHttpError(f"no model with id {owner}")
    with store.read() as conn:
        runs = repo.list_runs(
            conn,
            model_id=owner,
            status=status,
            family=family,
            metric_version=metric_version,
            limit=limit,
            offset=offset,
        )
        total = repo.count_runs(
            conn, model_id=owner, status=status, family=family, metric_version=metric_version
        )
        parity = repo.run_parity(conn, [r.id for r in runs])
        lenses = repo.run_lenses(conn, [r.id for r in runs])
        resources = repo.run_resources(conn, [r.id for r in runs])
    items = [
        run_out(
            r,
            snap.models[r.model_id].name if r.model_id in snap.models else "?",
            parity.get(r.id),
            lenses.get(r.id),
            resources.get(r.id),
        )
        for r in runs
    ]
    return RunPage(items, total, limit, offset, offset + limit if offset + limit < total else None)


def get_run(store: Store, snap: Snapshot, run_id: int) -> Run:
    with store.read() as conn:
        run = repo.get_run(conn, run_id)
        parity = repo.run_parity(conn, [run_id]).get(run_id)
        lens = repo.run_lenses(conn, [run_id]).get(run_id)
        resources = repo.run_resources(conn, [run_id]).get(run_id)
    if run is None:
        raise NotFoundHttpError(f"there is no run {run_id} (GET /api/v1/runs lists them)")
    name = snap.models[run.model_id].name if run.model_id in snap.models else "?"
    return run_out(run, name, parity, lens, resources)
