"""Alembic environment for the Strata results store (DuckDB through duckdb-engine).

Migrations are written by hand: reflection, and so `--autogenerate`, does not work on DuckDB.
Each upgrade or downgrade runs in one transaction (DuckDB's DDL is transactional), so a failed
migration leaves the file at the revision it started from.

Used programmatically by `service.store.migrate` (which passes an open connection in
`config.attributes["connection"]`), or as `alembic upgrade head` from the repository root, which
opens `STRATA_DATABASE`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

# Importing it registers `AlembicDuckDBImpl(DefaultImpl)` for the "duckdb" dialect.
from service.store.migrate import AlembicDuckDBImpl  # noqa: F401


def run_migrations(connection: sa.Connection) -> None:
    context.configure(connection=connection, target_metadata=None, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    if context.is_offline_mode():
        raise SystemExit("offline (--sql) migrations are not supported: run them on the file")
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    from service.settings import get_settings
    from service.store.db import Store

    with Store.open(get_settings().database) as store, store.engine.begin() as conn:
        run_migrations(conn)


main()
