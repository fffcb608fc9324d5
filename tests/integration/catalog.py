"""The schema of a DuckDB database as DuckDB's own catalog describes it (SQLAlchemy reflection
does not work on DuckDB), and database contents as comparable values."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

IGNORED_TABLES = ("alembic_version",)


def catalog(conn: sa.Connection) -> dict[str, Any]:
    def rows(sql: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(map(_hashable, r)) for r in conn.exec_driver_sql(sql).fetchall())

    skip = ", ".join(f"'{t}'" for t in IGNORED_TABLES)
    return {
        "tables": rows(f"SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
                       f"AND table_name NOT IN ({skip})"),
        "columns": rows(f"SELECT table_name, column_name, data_type, is_nullable, column_default "
                        f"FROM duckdb_columns() WHERE NOT internal AND table_name NOT IN ({skip})"),
        "constraints": rows(f"SELECT table_name, constraint_type, constraint_text, "
                            f"constraint_column_names, referenced_table, referenced_column_names "
                            f"FROM duckdb_constraints() WHERE table_name NOT IN ({skip})"),
        "indexes": rows("SELECT table_name, sql FROM duckdb_indexes()"),
        "sequences": rows("SELECT sequence_name, start_value, increment_by, cycle "
                          "FROM duckdb_sequences()"),
        "views": rows("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"),
    }


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def contents(conn: sa.Connection, tables: tuple[str, ...]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of each table, sorted (JSON and lists made comparable)."""
    out = {}
    for table in tables:
        result = conn.exec_driver_sql(f"SELECT * FROM {table}").fetchall()
        out[table] = sorted(tuple(repr(v) for v in row) for row in result)
    return out
