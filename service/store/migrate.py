"""Schema migrations, run programmatically (`strata db ...`, the API's readiness check).

The migrations are the hand-written Alembic versions in `migrations/`; the schema they produce must
equal what `service.store.tables` declares (a test checks it through DuckDB's catalog).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.ddl.impl import DefaultImpl
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from service.store.db import Store
from service.store.errors import RevisionError, SchemaOutOfDateError, StoreError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class AlembicDuckDBImpl(DefaultImpl):
    """Teaches Alembic the `duckdb` dialect (defining the class registers it). DuckDB's DDL is
    transactional, so each upgrade or downgrade runs in one transaction."""

    __dialect__ = "duckdb"
    transactional_ddl = True


def _config(conn: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if conn is not None:
        config.attributes["connection"] = conn
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise StoreError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def current_revision(store: Store) -> str | None:
    """The revision the database is at (None: a new, empty database)."""
    with store.read() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(store: Store, revision: str = "head") -> str | None:
    """Migrate up to `revision`, in one transaction. Returns the revision reached."""
    _run(store, "upgrade", revision)
    return current_revision(store)


def downgrade(store: Store, revision: str = "-1") -> str | None:
    """Migrate down to `revision` (`-1`: one step; `base`: nothing), in one transaction."""
    _run(store, "downgrade", revision)
    return current_revision(store)


def _run(store: Store, direction: str, revision: str) -> None:
    with store.write() as conn:
        try:
            getattr(command, direction)(_config(conn), revision)
        except CommandError as exc:
            raise RevisionError(f"cannot {direction} to {revision!r}: {exc}") from None


def is_empty(store: Store) -> bool:
    with store.read() as conn:
        return not conn.exec_driver_sql(
            "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary"
        ).scalar()


def ensure_current(store: Store, *, initialise_empty: bool = True) -> None:
    """Check the schema is at the head revision; a new, empty file is initialised to it.

    A database at an older (or unknown, newer) revision is not migrated behind the user's back:
    `SchemaOutOfDateError` says which command to run.
    """
    head = head_revision()
    current = current_revision(store)
    if current == head:
        return
    if current is None and initialise_empty and is_empty(store):
        upgrade(store, head)
        return
    if current is None:
        raise SchemaOutOfDateError(
            f"{store.path} holds tables but no schema revision: it was not made by Strata"
        )
    raise SchemaOutOfDateError(
        f"{store.path} is at schema revision {current}; this code needs {head}: run "
        "`strata db upgrade` (or deploy the code that matches the database)"
    )
