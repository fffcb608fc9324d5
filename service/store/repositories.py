"""The queries the API serves, in SQL, and only those. Entities come back as ORM objects, row
sets as Polars frames.

Which run is a model's canonical run for a metric family is decided once, by the serving index
(`service.api.queries.index.Snapshot.canonical`, from `model_index`, `run_index` and the pins
in force, `service.store.pins.in_force`), and told to clients in the model answers
(`current_runs`); the queries here take run ids.
Row queries filter `results` or `neurons` by run id: a run's rows sit together, so DuckDB's
zone maps skip other runs' row groups and the cost of a query does not grow with the number of
runs stored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import polars as pl
import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.metrics import FAMILIES
from service.store.db import raw_connection
from service.store.tables import (
    ParityReportRow,
    RefitFamily,
    RefitFamilyMember,
    RegisteredModelRow,
    RunLens,
    RunResource,
    RunRow,
)

NeuronClass = Literal["prediction", "suppression", "partition"]
RECORD_SELECT = "metric, layer, component, head, neuron, value, stderr, n, unit, relative_depth"


def _frame(conn: Any, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
    return raw_connection(conn).sql(sql, params=list(params) or None).pl()


def _ids(ids: Sequence[int]) -> str:
    """A literal id list (ints from the database: safe to inline, and lets DuckDB prune)."""
    return ", ".join(str(int(i)) for i in ids) or "NULL"


def family_of(metric: str) -> str | None:
    """The metric family that computes `metric` (None for metrics no run family computes)."""
    family = metric.split(".", 1)[0]
    return family if family in FAMILIES else None


# --------------------------------------------------------------------------- models and runs


def filter_models(
    conn: sa.Connection,
    *,
    source: str | None = None,
    refit_family: str | None = None,
    architecture: str | None = None,
    name: str | None = None,
    min_layers: int | None = None,
    max_layers: int | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[RegisteredModelRow], int]:
    """A page of models (by name, then id) matching every filter given, and how many match.

    `refit_family`: members of that refit family; `architecture`: case-insensitive equality;
    `min_layers` / `max_layers`: inclusive bounds (models whose layer count is not known yet
    match neither).
    """
    query = sa.select(RegisteredModelRow)
    if source is not None:
        query = query.where(RegisteredModelRow.source == source)
    if name is not None:
        query = query.where(RegisteredModelRow.name == name)
    if architecture is not None:
        query = query.where(sa.func.lower(RegisteredModelRow.architecture) == architecture.lower())
    if min_layers is not None:
        query = query.where(RegisteredModelRow.n_layers >= min_layers)
    if max_layers is not None:
        query = query.where(RegisteredModelRow.n_layers <= max_layers)
    if refit_family is not None:
        members = (
            sa.select(RefitFamilyMember.model_id)
            .join(RefitFamily, RefitFamily.id == RefitFamilyMember.family_id)
            .where(RefitFamily.name == refit_family)
        )
        query = query.where(RegisteredModelRow.id.in_(members))
    with Session(bind=conn) as session:
        total = session.scalar(sa.select(sa.func.count()).select_from(query.subquery())) or 0
        page = session.scalars(
            query.order_by(RegisteredModelRow.name, RegisteredModelRow.id)
            .limit(limit)
            .offset(offset)
        )
        return list(page), int(total)


def model_families(conn: sa.Connection, model_ids: Sequence[int]) -> dict[int, list[str]]:
    """model id -> names of the refit families it belongs to."""
    if not model_ids:
        return {}
    rows = conn.execute(
        sa.select(RefitFamilyMember.model_id, RefitFamily.name)
        .join(RefitFamily, RefitFamily.id == RefitFamilyMember.family_id)
        .where(RefitFamilyMember.model_id.in_(list(model_ids)))
        .order_by(RefitFamily.name)
    ).all()
    out: dict[int, list[str]] = {}
    for model_id, name in rows:
        out.setdefault(int(model_id), []).append(name)
    return out


def model_parity(
    conn: sa.Connection, model_ids: Sequence[int]
) -> dict[int, tuple[dict[str, Any], int]]:
    """model id -> (parity report, experts per layer) of its latest float32 load (else of its
    latest load at any dtype); models never measured are absent."""
    if not model_ids:
        return {}
    rows = conn.execute(
        sa.select(ParityReportRow.model_id, ParityReportRow.report, ParityReportRow.n_experts)
        .where(ParityReportRow.model_id.in_(list(model_ids)))
        .order_by(
            ParityReportRow.model_id,
            (ParityReportRow.dtype == "float32").desc(),
            ParityReportRow.id.desc(),
        )
    ).all()
    out: dict[int, tuple[dict[str, Any], int]] = {}
    for model_id, report, n_experts in rows:
        out.setdefault(int(model_id), (_json(report), int(n_experts)))
    return out


def run_parity(conn: sa.Connection, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """run id -> the parity report of that run's own load (runs without one are absent)."""
    if not run_ids:
        return {}
    rows = conn.execute(
        sa.select(ParityReportRow.run_id, ParityReportRow.report)
        .where(ParityReportRow.run_id.in_(list(run_ids)))
        .order_by(ParityReportRow.id.desc())
    ).all()
    out: dict[int, dict[str, Any]] = {}
    for run_id, report in rows:
        out.setdefault(int(run_id), _json(report))
    return out


def run_lenses(conn: sa.Connection, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """run id -> what the run reported about the tuned lens it evaluated (`key`, `trained`,
    the budget used); runs without one are absent."""
    if not run_ids:
        return {}
    rows = conn.execute(
        sa.select(RunLens.run_id, RunLens.info).where(RunLens.run_id.in_(list(run_ids)))
    ).all()
    return {int(run_id): _json(info) for run_id, info in rows}


def run_resources(conn: sa.Connection, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """run id -> where its time went and its measured peak memory (`run_resources`); runs
    stored before revision 0009 are absent."""
    if not run_ids:
        return {}
    rows = conn.execute(
        sa.select(
            RunResource.run_id,
            RunResource.timings_s,
            RunResource.host_peak_rss_mib,
            RunResource.host_peak_scope,
            RunResource.device_peak_allocated_mib,
        ).where(RunResource.run_id.in_(list(run_ids)))
    ).all()
    return {
        int(run_id): {
            "timings_s": _json(timings),
            "host_peak_rss_mib": host,
            "host_peak_scope": scope,
            "device_peak_allocated_mib": device,
        }
        for run_id, timings, host, scope, device in rows
    }


def _json(value: Any) -> dict[str, Any]:
    return dict(json.loads(value) if isinstance(value, str) else value)


def get_model(conn: sa.Connection, model_id: int) -> RegisteredModelRow | None:
    with Session(bind=conn) as session:
        return session.get(RegisteredModelRow, model_id)


def get_run(conn: sa.Connection, run_id: int) -> RunRow | None:
    with Session(bind=conn) as session:
        return session.get(RunRow, run_id)


def _run_filters(
    query: sa.Select[Any],
    model_id: int | None,
    status: str | None,
    metric_version: str | None,
    family: str | None,
) -> sa.Select[Any]:
    if model_id is not None:
        query = query.where(RunRow.model_id == model_id)
    if status is not None:
        query = query.where(RunRow.status == status)
    if metric_version is not None:
        query = query.where(RunRow.metric_version == metric_version)
    if family is not None:
        query = query.where(
            sa.func.list_contains(sa.cast(RunRow.families, sa.ARRAY(sa.String)), family)
        )
    return query


def list_runs(
    conn: sa.Connection,
    *,
    model_id: int | None = None,
    status: str | None = None,
    metric_version: str | None = None,
    family: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[RunRow]:
    """Runs, newest first, matching every filter given (`family`: computed that family)."""
    query = _run_filters(sa.select(RunRow), model_id, status, metric_version, family)
    with Session(bind=conn) as session:
        return list(session.scalars(query.order_by(RunRow.id.desc()).limit(limit).offset(offset)))


def count_runs(
    conn: sa.Connection,
    *,
    model_id: int | None = None,
    status: str | None = None,
    metric_version: str | None = None,
    family: str | None = None,
) -> int:
    query = _run_filters(
        sa.select(sa.func.count()).select_from(RunRow), model_id, status, metric_version, family
    )
    return int(conn.execute(query).scalar() or 0)


# --------------------------------------------------------------------------- record rows


def sequence_means(conn: Any, run_id: int, metrics: Sequence[str] | None = None) -> pl.DataFrame:
    """A run's per-sequence means (docs/metrics.md: uncertainty): columns metric, layer,
    component, head, sequence, value, ordered by metric, component, layer, head, sequence;
    only `metrics` if given. `conn` may be a SQLAlchemy connection or session, or a DuckDB
    cursor. Runs of metric version 1 have none (an empty frame)."""
    if isinstance(conn, Session):
        conn = conn.connection()
    where: list[str] = [f"run_id = {int(run_id)}"]
    params: list[Any] = []
    if metrics is not None:
        if not metrics:
            where.append("FALSE")
        else:
            where.append(f"metric IN ({', '.join('?' for _ in metrics)})")
            params.extend(metrics)
    return _frame(
        conn,
        f"""
        SELECT metric, layer, component, head, sequence, value FROM sequence_means
        WHERE {" AND ".join(where)}
        ORDER BY metric, component NULLS FIRST, layer NULLS FIRST, head NULLS FIRST, sequence
        """,
        params,
    )


def rows_of_runs(
    conn: Any,
    run_ids: Sequence[int],
    metrics: Sequence[str],
    *,
    component: str | None = None,
    layer_min: int | None = None,
    layer_max: int | None = None,
    heads: bool = False,
) -> pl.DataFrame:
    """Record rows of `metrics` in the given runs, per layer (`heads=False`: head and neuron
    null) or per head, with `run_id` and relative depth; ordered by run, metric, component,
    layer, head. `conn` may be a SQLAlchemy connection or a DuckDB cursor (`Store.cursor()`).

    Every value from the caller is a bound parameter; run ids are ints, inlined so that DuckDB's
    zone maps prune other runs' row groups.
    """
    if not run_ids or not metrics:
        return _frame(
            conn, f"SELECT NULL::BIGINT AS run_id, {RECORD_SELECT} FROM results WHERE FALSE"
        )
    where = [
        f"metric IN ({', '.join('?' for _ in metrics)})",
        "head IS NOT NULL" if heads else "head IS NULL",
        "neuron IS NULL",
    ]
    params: list[Any] = list(metrics)
    for clause, value in (
        ("component = ?", component),
        ("layer >= ?", layer_min),
        ("layer <= ?", layer_max),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    per_run = [
        f"SELECT {int(run)}::BIGINT AS run_id, {RECORD_SELECT} FROM results "
        f"WHERE run_id = {int(run)} AND {' AND '.join(where)}"
        for run in run_ids
    ]
    return _frame(
        conn,
        f"""
        {" UNION ALL ".join(per_run)}
        ORDER BY run_id, metric, component NULLS FIRST, layer NULLS FIRST, head""",
        params * len(run_ids),
    )


def all_rows_of_run(conn: Any, run_id: int) -> pl.DataFrame:
    """Every per-layer and per-head record row of a run (not per-neuron), in the column order
    of `rows_of_runs`, sorted by metric, component, layer, head: what a serving process keeps
    in memory for a run it serves often."""
    return _frame(
        conn,
        f"""
        SELECT {int(run_id)}::BIGINT AS run_id, {RECORD_SELECT} FROM results
        WHERE run_id = {int(run_id)} AND neuron IS NULL
        ORDER BY metric, component NULLS FIRST, layer NULLS FIRST, head""",
    )


# --------------------------------------------------------------------------- serving indexes


def model_index(conn: Any) -> pl.DataFrame:
    """Every model's id, name, layer count, spec (JSON text) and context length: what a serving
    process resolves names with and works out each model's default configuration from."""
    return _frame(
        conn, "SELECT id, name, n_layers, spec::VARCHAR AS spec, n_ctx FROM models ORDER BY id"
    )


def run_index(conn: Any) -> pl.DataFrame:
    """Every run's id, model, status, metric version, families, finish time and refit family
    (stability runs), whether stage boundaries were stored for it, and what its configuration
    is (hash, token source, sequences, length, dtype): what a serving process picks a model's
    canonical runs with and describes them by."""
    return _frame(
        conn,
        """
        SELECT r.id, r.model_id, r.status, r.metric_version,
               CAST(r.families AS VARCHAR[]) AS families, r.finished_at,
               json_extract_string(r.config, '$.refit_family') AS refit_family,
               EXISTS (SELECT 1 FROM stage_boundaries s WHERE s.run_id = r.id) AS has_stages,
               r.config_hash, r.dtype,
               json_extract_string(r.config, '$.tokens.source') AS tokens,
               TRY_CAST(json_extract(r.config, '$.tokens.n_sequences') AS BIGINT) AS n_sequences,
               TRY_CAST(json_extract(r.config, '$.tokens.seq_len') AS BIGINT) AS seq_len,
               r.tokens_evaluated
        FROM runs r ORDER BY r.id""",
    )


def boundaries_of_runs(conn: Any, run_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Stage boundaries of the given runs (evidence decoded), by run and boundary."""
    if not run_ids:
        return []
    frame = _frame(
        conn,
        f"""
        SELECT run_id, boundary, found, layer, relative_depth, rule, evidence::VARCHAR AS evidence
        FROM stage_boundaries WHERE run_id IN ({_ids(run_ids)}) ORDER BY run_id, boundary""",
    )
    rows = frame.to_dicts()
    for row in rows:
        row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else {}
    return rows


def family_by_name(conn: sa.Connection, name: str) -> RefitFamily | None:
    with Session(bind=conn) as session:
        return session.scalars(sa.select(RefitFamily).where(RefitFamily.name == name)).one_or_none()


# --------------------------------------------------------------------------- neurons


def neurons(
    conn: Any,
    run_id: int,
    *,
    layer: int | None = None,
    neuron_class: NeuronClass | None = None,
    top_k: int | None = 20,
    with_tokens: bool = True,
) -> pl.DataFrame:
    """A run's neurons with moments and class flags, optionally of one layer and class.

    With a class, the top `top_k` per layer: by kurtosis for prediction/suppression, by variance
    for partition (as `compute.metrics.neurons` chooses which neurons get top tokens). With
    `with_tokens`, lists of top promoted and suppressed token strings (and ids) are attached.
    """
    where = [f"n.run_id = {int(run_id)}"]
    params: list[Any] = []
    if layer is not None:
        where.append("n.layer = ?")
        params.append(layer)
    order = "n.layer, n.neuron"
    if neuron_class is not None:
        if neuron_class not in ("prediction", "suppression", "partition"):
            raise ValueError(f"unknown neuron class {neuron_class!r}")
        where.append(f'n."{neuron_class}"')
        score = "n.vocab_var" if neuron_class == "partition" else "n.vocab_kurt"
        order = f"n.layer, {score} DESC, n.neuron"
    select = (
        "n.layer, n.neuron, n.vocab_mean, n.vocab_var, n.vocab_skew, n.vocab_kurt, n.n, "
        'n.prediction, n.suppression, n."partition", n.relative_depth'
    )
    ranked = f"SELECT {select} FROM neurons n WHERE {' AND '.join(where)}"
    if neuron_class is not None and top_k is not None:
        ranked = (
            f"SELECT * FROM ({ranked}) n QUALIFY row_number() OVER (PARTITION BY n.layer "
            f"ORDER BY {order.split(', ', 1)[1]}) <= {int(top_k)}"
        )
    if not with_tokens:
        return _frame(conn, f"SELECT * FROM ({ranked}) n ORDER BY {order}", params)
    token_where = f"run_id = {int(run_id)}"
    if layer is not None:
        token_where += f" AND layer = {int(layer)}"
    return _frame(
        conn,
        f"""
        WITH picked AS ({ranked}),
        tokens AS (
            SELECT layer, neuron,
                list(token ORDER BY rank) FILTER (WHERE direction = 'promoted') AS promoted,
                list(token_id ORDER BY rank) FILTER (WHERE direction = 'promoted') AS promoted_ids,
                list(token ORDER BY rank) FILTER (WHERE direction = 'suppressed') AS suppressed,
                list(token_id ORDER BY rank) FILTER (WHERE direction = 'suppressed')
                    AS suppressed_ids
            FROM (SELECT DISTINCT layer, neuron, direction, rank, token_id, token
                  FROM neuron_tokens WHERE {token_where})
            GROUP BY layer, neuron)
        SELECT n.*, t.promoted, t.promoted_ids, t.suppressed, t.suppressed_ids
        FROM picked n LEFT JOIN tokens t USING (layer, neuron)
        ORDER BY {order}""",
        params,
    )


# --------------------------------------------------------------------------- families


def list_families(conn: sa.Connection) -> list[RefitFamily]:
    with Session(bind=conn) as session:
        return list(session.scalars(sa.select(RefitFamily).order_by(RefitFamily.name)))


def family_members(conn: sa.Connection, family_id: int) -> list[RegisteredModelRow]:
    from service.store.families import members_of

    with Session(bind=conn) as session:
        return members_of(session, family_id)
