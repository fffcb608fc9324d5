"""Migrations: every revision up and down on a real DuckDB file; the migrated schema equals what
the SQLAlchemy tables declare (compared through DuckDB's catalog); upgrading and downgrading a
database that holds results loses nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from compute.records import RECORD_COLUMNS
from compute.run import RunResult
from service.store import RevisionError, Store, migrate
from service.store.ingest import ingest_result
from service.store.tables import Base
from tests.integration.catalog import catalog, contents

CORE_TABLES = ("models", "token_sources", "runs", "results", "neurons", "neuron_tokens")


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(migrate._config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _declared_catalog(tmp_path: Path) -> dict[str, object]:
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'declared.duckdb'}")
    try:
        Base.metadata.create_all(engine)
        with engine.connect() as conn:
            return catalog(conn)
    finally:
        engine.dispose()


def test_revisions_form_one_line() -> None:
    assert _revisions()[0] == "0001"
    assert _revisions()[-1] == migrate.head_revision()


def test_every_migration_up_and_down_matches_models(tmp_path: Path, db_path: Path) -> None:
    declared = _declared_catalog(tmp_path)
    with Store.open(db_path, threads=1) as store:
        assert migrate.current_revision(store) is None
        seen: dict[str, dict[str, object]] = {}
        for revision in _revisions():
            assert migrate.upgrade(store, revision) == revision
            with store.read() as conn:
                seen[revision] = catalog(conn)
        assert seen[migrate.head_revision()] == declared
        for previous in reversed([None, *_revisions()[:-1]]):
            assert migrate.downgrade(store, "-1") == previous
            with store.read() as conn:
                now = catalog(conn)
            if previous is None:
                assert now["tables"] == []
                assert now["sequences"] == []
            else:  # downgrading lands on exactly the schema the upgrade made
                assert now == seen[previous]
        assert migrate.upgrade(store) == migrate.head_revision()
        with store.read() as conn:
            assert catalog(conn) == declared


def test_unknown_revision_is_refused(store: Store) -> None:
    with pytest.raises(RevisionError, match="zzz"):
        migrate.upgrade(store, "zzz")
    assert migrate.current_revision(store) == migrate.head_revision()


def _fill_at_0001(store: Store, result: RunResult) -> None:
    """Rows as revision 0001 stored them, written with revision 0001's own columns."""
    rows = result.records.to_pylist()
    moments = [r for r in rows if r["metric"].startswith("neurons.vocab_")]
    others = [r for r in rows if not r["metric"].startswith("neurons.vocab_")]
    neurons: dict[tuple[int, int], dict[str, float]] = {}
    for r in moments:
        neurons.setdefault((r["layer"], r["neuron"]), {"n": r["n"]})[r["metric"][8:]] = r["value"]
    with store.write() as conn:
        raw = conn.connection.driver_connection
        raw.execute("""INSERT INTO models (id, spec_hash, name, source, spec, n_layers, d_mlp,
                       registered_at) VALUES (nextval('models_id_seq'), 'h', 'm', 'random', '{}',
                       3, 64, now())""")
        raw.execute("""INSERT INTO token_sources VALUES (nextval('token_sources_id_seq'), 't',
                       'npy', NULL, 6, 16, 0, NULL, '{}', now())""")
        raw.execute("""INSERT INTO runs (id, model_id, token_source_id, config_hash,
                       metric_version, code_version, families, config, status, progress,
                       created_at, dtype) VALUES (nextval('runs_id_seq'), 1, 1, 'c', '1', '0',
                       '["neurons"]', '{}', 'succeeded', 1, now(), 'float32')""")
        raw.executemany(f"INSERT INTO results (run_id, {', '.join(RECORD_COLUMNS)}) "
                        f"VALUES (1, {', '.join('?' * len(RECORD_COLUMNS))})",
                        [[r[c] for c in RECORD_COLUMNS] for r in others])
        raw.executemany("INSERT INTO neurons VALUES (1, ?, ?, ?, ?, ?, ?, ?, false, false, true)",
                        [[layer, neuron, m["vocab_mean"], m["vocab_var"], m["vocab_skew"],
                          m["vocab_kurt"], m["n"]] for (layer, neuron), m in neurons.items()])


def test_upgrade_keeps_results_and_backfills_depth(tmp_path: Path, run_result: RunResult) -> None:
    with Store.open(tmp_path / "old.duckdb", threads=1) as old:
        migrate.upgrade(old, "0001")
        _fill_at_0001(old, run_result)
        with old.read() as conn:
            before = contents(conn, CORE_TABLES)
        migrate.upgrade(old)
        with old.read() as conn:
            depth_cols = {t: conn.exec_driver_sql(
                f"SELECT * EXCLUDE (relative_depth) FROM {t}").fetchall() for t in
                ("results", "neurons")}
            after = contents(conn, tuple(t for t in CORE_TABLES
                                         if t not in ("results", "neurons")))
            backfilled = conn.exec_driver_sql(
                "SELECT metric, layer, component, head, relative_depth FROM results "
                "ORDER BY ALL").fetchall()
    for table in ("results", "neurons"):
        assert sorted(tuple(repr(v) for v in row) for row in depth_cols[table]) == before[table]
    for table, rows in after.items():
        assert rows == before[table]
    # The backfill gives the depth the ingest of the newest code computes.
    with Store.open(tmp_path / "new.duckdb", threads=1) as new:
        migrate.upgrade(new)
        ingest_result(new, run_result)
        with new.read() as conn:
            ingested = conn.exec_driver_sql(
                "SELECT metric, layer, component, head, relative_depth FROM results "
                "ORDER BY ALL").fetchall()
    assert backfilled == ingested


def test_downgrade_and_upgrade_keep_ingested_results(store: Store,
                                                      run_result: RunResult) -> None:
    ingest_result(store, run_result)
    with store.read() as conn:
        before = contents(conn, CORE_TABLES)
    migrate.downgrade(store, "0001")
    migrate.upgrade(store)
    with store.read() as conn:
        assert contents(conn, CORE_TABLES) == before
