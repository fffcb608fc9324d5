"""The queries the API serves, in SQL. Entities come back as ORM objects, row sets as Polars
frames (or Arrow, for exports in the record format).

"Current" results of a model are those of its latest succeeded run under the current
`METRIC_VERSION` that computed the metric's family; older runs stay queryable by id.
Row queries first resolve the run ids (a small lookup in `runs`), then filter `results` or
`neurons` by run id: a run's rows sit together, so DuckDB's zone maps skip other runs' row groups
and the cost of a query does not grow with the number of runs stored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import polars as pl
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.metrics import FAMILIES
from compute.records import RECORD_SCHEMA
from compute.run import METRIC_VERSION
from service.store.db import raw_connection
from service.store.tables import (
    RefitFamily,
    RefitFamilyMember,
    RegisteredModel,
    Run,
    StageBoundary,
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


def list_models(conn: sa.Connection) -> list[RegisteredModel]:
    with Session(bind=conn) as session:
        return list(session.scalars(sa.select(RegisteredModel)
                                    .order_by(RegisteredModel.name, RegisteredModel.id)))


def filter_models(conn: sa.Connection, *, source: str | None = None,
                  refit_family: str | None = None, architecture: str | None = None,
                  name: str | None = None, min_layers: int | None = None,
                  max_layers: int | None = None, limit: int = 100, offset: int = 0
                  ) -> tuple[list[RegisteredModel], int]:
    """A page of models (by name, then id) matching every filter given, and how many match.

    `refit_family`: members of that refit family; `architecture`: case-insensitive equality;
    `min_layers` / `max_layers`: inclusive bounds (models whose layer count is not known yet
    match neither).
    """
    query = sa.select(RegisteredModel)
    if source is not None:
        query = query.where(RegisteredModel.source == source)
    if name is not None:
        query = query.where(RegisteredModel.name == name)
    if architecture is not None:
        query = query.where(sa.func.lower(RegisteredModel.architecture) == architecture.lower())
    if min_layers is not None:
        query = query.where(RegisteredModel.n_layers >= min_layers)
    if max_layers is not None:
        query = query.where(RegisteredModel.n_layers <= max_layers)
    if refit_family is not None:
        members = (sa.select(RefitFamilyMember.model_id)
                   .join(RefitFamily, RefitFamily.id == RefitFamilyMember.family_id)
                   .where(RefitFamily.name == refit_family))
        query = query.where(RegisteredModel.id.in_(members))
    with Session(bind=conn) as session:
        total = session.scalar(sa.select(sa.func.count()).select_from(query.subquery())) or 0
        page = session.scalars(query.order_by(RegisteredModel.name, RegisteredModel.id)
                               .limit(limit).offset(offset))
        return list(page), int(total)


def model_families(conn: sa.Connection, model_ids: Sequence[int]) -> dict[int, list[str]]:
    """model id -> names of the refit families it belongs to."""
    if not model_ids:
        return {}
    rows = conn.execute(sa.select(RefitFamilyMember.model_id, RefitFamily.name)
                        .join(RefitFamily, RefitFamily.id == RefitFamilyMember.family_id)
                        .where(RefitFamilyMember.model_id.in_(list(model_ids)))
                        .order_by(RefitFamily.name)).all()
    out: dict[int, list[str]] = {}
    for model_id, name in rows:
        out.setdefault(int(model_id), []).append(name)
    return out


def get_model(conn: sa.Connection, model_id: int) -> RegisteredModel | None:
    with Session(bind=conn) as session:
        return session.get(RegisteredModel, model_id)


def find_models(conn: sa.Connection, name: str) -> list[RegisteredModel]:
    """Models registered under `name` (one per distinct processing / revision)."""
    with Session(bind=conn) as session:
        return list(session.scalars(sa.select(RegisteredModel)
                                    .where(RegisteredModel.name == name)
                                    .order_by(RegisteredModel.id)))


def get_run(conn: sa.Connection, run_id: int) -> Run | None:
    with Session(bind=conn) as session:
        return session.get(Run, run_id)


def _run_filters(query: sa.Select[Any], model_id: int | None, status: str | None,
                 metric_version: str | None, family: str | None) -> sa.Select[Any]:
    if model_id is not None:
        query = query.where(Run.model_id == model_id)
    if status is not None:
        query = query.where(Run.status == status)
    if metric_version is not None:
        query = query.where(Run.metric_version == metric_version)
    if family is not None:
        query = query.where(sa.func.list_contains(sa.cast(Run.families, sa.ARRAY(sa.String)),
                                                  family))
    return query


def list_runs(conn: sa.Connection, *, model_id: int | None = None, status: str | None = None,
              metric_version: str | None = None, family: str | None = None, limit: int = 100,
              offset: int = 0) -> list[Run]:
    """Runs, newest first, matching every filter given (`family`: computed that family)."""
    query = _run_filters(sa.select(Run), model_id, status, metric_version, family)
    with Session(bind=conn) as session:
        return list(session.scalars(query.order_by(Run.id.desc()).limit(limit).offset(offset)))


def count_runs(conn: sa.Connection, *, model_id: int | None = None, status: str | None = None,
               metric_version: str | None = None, family: str | None = None) -> int:
    query = _run_filters(sa.select(sa.func.count()).select_from(Run), model_id, status,
                         metric_version, family)
    return int(conn.execute(query).scalar() or 0)


def current_runs(conn: sa.Connection, *, family: str | None = None,
                 model_ids: Sequence[int] | None = None,
                 metric_version: str = METRIC_VERSION) -> dict[int, int]:
    """model id -> id of its current run (latest succeeded under `metric_version`, computing
    `family` when given)."""
    where = ["status = 'succeeded'", "metric_version = ?"]
    params: list[Any] = [metric_version]
    if family is not None:
        where.append("list_contains(CAST(families AS VARCHAR[]), ?)")
        params.append(family)
    if model_ids is not None:
        where.append(f"model_id IN ({_ids(model_ids)})")
    rows = raw_connection(conn).execute(f"""
        SELECT model_id, arg_max(id, (finished_at, id)) AS run_id FROM runs
        WHERE {' AND '.join(where)} GROUP BY model_id""", params).fetchall()
    return {int(model): int(run) for model, run in rows}


def current_run(conn: sa.Connection, model_id: int, *, family: str | None = None,
                metric_version: str = METRIC_VERSION) -> Run | None:
    run_id = current_runs(conn, family=family, model_ids=[model_id],
                          metric_version=metric_version).get(model_id)
    return None if run_id is None else get_run(conn, run_id)


# --------------------------------------------------------------------------- record rows


def run_results(conn: sa.Connection, run_id: int, *, metric: str | None = None,
                component: str | None = None, layer: int | None = None,
                heads: bool | None = None) -> pl.DataFrame:
    """A run's record rows (neuron moments excepted: see `neurons`), filtered.

    `heads=True` keeps per-head rows only, `heads=False` per-layer rows only.
    """
    where, params = [f"run_id = {int(run_id)}"], []
    for column, value in (("metric", metric), ("component", component), ("layer", layer)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if heads is not None:
        where.append("head IS NOT NULL" if heads else "head IS NULL")
    return _frame(conn, f"""
        SELECT {RECORD_SELECT} FROM results WHERE {' AND '.join(where)}
        ORDER BY metric, component, layer, head""", params)


def current_results(conn: sa.Connection, model_id: int, metric: str, *,
                    component: str | None = None, layer: int | None = None,
                    metric_version: str = METRIC_VERSION) -> pl.DataFrame:
    """The rows of `metric` from the model's current run (empty if it has none)."""
    run = current_runs(conn, family=family_of(metric), model_ids=[model_id],
                       metric_version=metric_version).get(model_id)
    frame = run_results(conn, -1 if run is None else run, metric=metric, component=component,
                        layer=layer)
    return frame.with_columns(pl.lit(run, pl.Int64).alias("run_id"))


def cross_model(conn: sa.Connection, metric: str, *, component: str | None = None,
                model_ids: Sequence[int] | None = None, heads: bool = False,
                relative_depth: tuple[float, float] | None = None,
                metric_version: str = METRIC_VERSION) -> pl.DataFrame:
    """`metric` for every model's current run, side by side: model id and name, run id, and the
    record columns with relative depth (optionally within [lo, hi])."""
    runs = current_runs(conn, family=family_of(metric), model_ids=model_ids,
                        metric_version=metric_version)
    where = ["res.metric = ?", "res.head IS NOT NULL" if heads else "res.head IS NULL"]
    params: list[Any] = [metric]
    if component is not None:
        where.append("res.component = ?")
        params.append(component)
    if relative_depth is not None:
        where.append("res.relative_depth BETWEEN ? AND ?")
        params.extend(relative_depth)
    # One equality filter per run (UNION ALL) so each branch is pruned by the run_id zone maps,
    # however scattered the current runs' ids are.
    per_run = [f"SELECT {int(run)}::BIGINT AS run_id, {RECORD_SELECT} FROM results res "
               f"WHERE res.run_id = {int(run)} AND {' AND '.join(where)}" for run in runs.values()]
    if not per_run:
        per_run = [f"SELECT NULL::BIGINT AS run_id, {RECORD_SELECT} FROM results res WHERE FALSE"]
    return _frame(conn, f"""
        WITH rows AS ({' UNION ALL '.join(per_run)})
        SELECT m.id AS model_id, m.name AS model, m.n_layers, rows.*
        FROM rows JOIN runs r ON r.id = rows.run_id JOIN models m ON m.id = r.model_id
        ORDER BY m.name, m.id, rows.component, rows.layer, rows.head""", params * len(runs))


def sequence_means(conn: Any, run_id: int, metrics: Sequence[str] | None = None
                   ) -> pl.DataFrame:
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
    return _frame(conn, f"""
        SELECT metric, layer, component, head, sequence, value FROM sequence_means
        WHERE {' AND '.join(where)}
        ORDER BY metric, component NULLS FIRST, layer NULLS FIRST, head NULLS FIRST, sequence
        """, params)


def run_records(conn: sa.Connection, run_id: int) -> pa.Table:
    """Every record of a run in the record format (docs/metrics.md) (`RECORD_SCHEMA`), for exports:
    the record rows and the per-neuron moments turned back into records."""
    moments = " UNION ALL ".join(
        f"SELECT 'neurons.{m}' AS metric, layer, NULL::VARCHAR AS component, NULL::INTEGER AS "
        f"head, neuron, {m} AS value, NULL::DOUBLE AS stderr, n, "
        f"'{_unit(m)}' AS unit FROM neurons WHERE run_id = {int(run_id)}"
        for m in ("vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt"))
    sql = f"""
        SELECT metric, layer, component, head, neuron, value, stderr, n, unit FROM results
        WHERE run_id = {int(run_id)}
        UNION ALL {moments}
        ORDER BY metric, component NULLS FIRST, layer, head, neuron"""
    table = raw_connection(conn).sql(sql).to_arrow_table()
    return table.cast(RECORD_SCHEMA)


def _unit(moment: str) -> str:
    from compute.records import unit_of

    unit = unit_of(f"neurons.{moment}")
    if unit is None:  # the catalog lost a name the store relies on: a programming error
        raise LookupError(f"neurons.{moment} is not in the catalog")
    return unit


def rows_of_runs(conn: Any, run_ids: Sequence[int], metrics: Sequence[str], *,
                 component: str | None = None, layer_min: int | None = None,
                 layer_max: int | None = None, heads: bool = False) -> pl.DataFrame:
    """Record rows of `metrics` in the given runs, per layer (`heads=False`: head and neuron
    null) or per head, with `run_id` and relative depth; ordered by run, metric, component,
    layer, head. `conn` may be a SQLAlchemy connection or a DuckDB cursor (`Store.cursor()`).

    Every value from the caller is a bound parameter; run ids are ints, inlined so that DuckDB's
    zone maps prune other runs' row groups.
    """
    if not run_ids or not metrics:
        return _frame(conn, f"SELECT NULL::BIGINT AS run_id, {RECORD_SELECT} FROM results "
                            "WHERE FALSE")
    where = [f"metric IN ({', '.join('?' for _ in metrics)})",
             "head IS NOT NULL" if heads else "head IS NULL", "neuron IS NULL"]
    params: list[Any] = list(metrics)
    for clause, value in (("component = ?", component), ("layer >= ?", layer_min),
                          ("layer <= ?", layer_max)):
        if value is not None:
            where.append(clause)
            params.append(value)
    per_run = [f"SELECT {int(run)}::BIGINT AS run_id, {RECORD_SELECT} FROM results "
               f"WHERE run_id = {int(run)} AND {' AND '.join(where)}" for run in run_ids]
    return _frame(conn, f"""
        {' UNION ALL '.join(per_run)}
        ORDER BY run_id, metric, component NULLS FIRST, layer NULLS FIRST, head""",
                  params * len(run_ids))


def all_rows_of_run(conn: Any, run_id: int) -> pl.DataFrame:
    """Every per-layer and per-head record row of a run (not per-neuron), in the column order
    of `rows_of_runs`, sorted by metric, component, layer, head: what a serving process keeps
    in memory for a run it serves often."""
    return _frame(conn, f"""
        SELECT {int(run_id)}::BIGINT AS run_id, {RECORD_SELECT} FROM results
        WHERE run_id = {int(run_id)} AND neuron IS NULL
        ORDER BY metric, component NULLS FIRST, layer NULLS FIRST, head""")


# --------------------------------------------------------------------------- serving indexes


def model_index(conn: Any) -> pl.DataFrame:
    """Every model's id, name and layer count: what a serving process resolves names with."""
    return _frame(conn, "SELECT id, name, n_layers FROM models ORDER BY id")


def run_index(conn: Any) -> pl.DataFrame:
    """Every run's id, model, status, metric version, families, finish time and refit family
    (stability runs), and whether stage boundaries were stored for it: what a serving process
    picks "current" runs with."""
    return _frame(conn, """
        SELECT r.id, r.model_id, r.status, r.metric_version,
               CAST(r.families AS VARCHAR[]) AS families, r.finished_at,
               json_extract_string(r.config, '$.refit_family') AS refit_family,
               EXISTS (SELECT 1 FROM stage_boundaries s WHERE s.run_id = r.id) AS has_stages
        FROM runs r ORDER BY r.id""")


def boundaries_of_runs(conn: Any, run_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Stage boundaries of the given runs (evidence decoded), by run and boundary."""
    if not run_ids:
        return []
    frame = _frame(conn, f"""
        SELECT run_id, boundary, found, layer, relative_depth, rule, evidence::VARCHAR AS evidence
        FROM stage_boundaries WHERE run_id IN ({_ids(run_ids)}) ORDER BY run_id, boundary""")
    rows = frame.to_dicts()
    for row in rows:
        row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else {}
    return rows


def family_by_name(conn: sa.Connection, name: str) -> RefitFamily | None:
    with Session(bind=conn) as session:
        return session.scalars(sa.select(RefitFamily).where(RefitFamily.name == name)
                               ).one_or_none()


# --------------------------------------------------------------------------- neurons and heads


def neurons(conn: Any, run_id: int, *, layer: int | None = None,
            neuron_class: NeuronClass | None = None, top_k: int | None = 20,
            with_tokens: bool = True) -> pl.DataFrame:
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
    select = ("n.layer, n.neuron, n.vocab_mean, n.vocab_var, n.vocab_skew, n.vocab_kurt, n.n, "
              'n.prediction, n.suppression, n."partition", n.relative_depth')
    ranked = f"SELECT {select} FROM neurons n WHERE {' AND '.join(where)}"
    if neuron_class is not None and top_k is not None:
        ranked = (f"SELECT * FROM ({ranked}) n QUALIFY row_number() OVER (PARTITION BY n.layer "
                  f"ORDER BY {order.split(', ', 1)[1]}) <= {int(top_k)}")
    if not with_tokens:
        return _frame(conn, f"SELECT * FROM ({ranked}) n ORDER BY {order}", params)
    token_where = f"run_id = {int(run_id)}"
    if layer is not None:
        token_where += f" AND layer = {int(layer)}"
    return _frame(conn, f"""
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
        ORDER BY {order}""", params)


def heads(conn: sa.Connection, run_id: int, metric: str, *, layer: int | None = None
          ) -> pl.DataFrame:
    """Per-head rows of `metric` in a run (e.g. `heads.induction`, `attention.prev_1`)."""
    return run_results(conn, run_id, metric=metric, layer=layer, heads=True)


# --------------------------------------------------------------------------- stages, families


def stage_boundaries(conn: sa.Connection, *, model_id: int | None = None,
                     run_id: int | None = None) -> list[StageBoundary]:
    """Stage boundaries of a run, or of a model's current run (as inferred for it)."""
    if run_id is None:
        if model_id is None:
            raise ValueError("give a model_id or a run_id")
        run_id = current_runs(conn, model_ids=[model_id]).get(model_id)
        if run_id is None:
            return []
    with Session(bind=conn) as session:
        return list(session.scalars(sa.select(StageBoundary)
                                    .where(StageBoundary.run_id == run_id)
                                    .order_by(StageBoundary.boundary)))


def list_families(conn: sa.Connection) -> list[RefitFamily]:
    with Session(bind=conn) as session:
        return list(session.scalars(sa.select(RefitFamily).order_by(RefitFamily.name)))


def family_members(conn: sa.Connection, family_id: int) -> list[RegisteredModel]:
    with Session(bind=conn) as session:
        return list(session.scalars(
            sa.select(RegisteredModel).join(RefitFamilyMember,
                                            RefitFamilyMember.model_id == RegisteredModel.id)
            .where(RefitFamilyMember.family_id == family_id).order_by(RegisteredModel.id)))
