"""`strata db ...`: the results database's schema, and storing a computed run from the CLI.

The CLI opens the database (STRATA_DATABASE) only when no service holds it; when one does, it
says so and exits with code 5 instead of showing DuckDB's lock error.

Wiring (service/cli.py): `main.add_command(db)`; `strata compute --store` calls
`check_store_writable(settings)` before computing and `store_result(result, settings)` after.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import click

from service.cli_errors import exit_code_of
from service.settings import Settings, get_settings
from service.store.errors import StoreError

if TYPE_CHECKING:
    from compute.run import RunResult
    from service.store.db import Store

T = TypeVar("T")


@contextmanager
def _open(settings: Settings) -> Iterator[Store]:
    from service.store.db import Store

    with Store.open(settings.database) as store:
        yield store


def check_store_writable(settings: Settings) -> None:
    """Fail fast, before hours of compute, if the results could not be stored afterwards.

    Raises `DatabaseHeldError` or `SchemaOutOfDateError` (a new file is initialised).
    """
    from service.store.migrate import ensure_current

    with _open(settings) as store:
        ensure_current(store)


def store_result(result: RunResult, settings: Settings) -> int:
    """Store a computed run in the database; returns its run id.

    A new database is initialised to the current schema. Same configuration hash and metric
    version as a stored run -> that run is replaced. Raises `DatabaseHeldError` (exit 5),
    `IngestError` (exit 2, nothing stored), `SchemaOutOfDateError` (exit 2).
    """
    from service.store.ingest import ingest_result
    from service.store.migrate import ensure_current

    with _open(settings) as store:
        ensure_current(store)
        return ingest_result(store, result).run_id


def _run(action: Callable[[Store], T]) -> T:
    try:
        with _open(get_settings()) as store:
            return action(store)
    except StoreError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exit_code_of(exc))


@click.group("db")
def db() -> None:
    """The results database (STRATA_DATABASE, default ./strata.duckdb)."""


@db.command()
@click.argument("revision", default="head")
def upgrade(revision: str) -> None:
    """Migrate the schema up to REVISION (default: the newest)."""
    from service.store import migrate

    reached = _run(lambda store: migrate.upgrade(store, revision))
    click.echo(f"{get_settings().database}: at revision {reached}")


@db.command()
@click.argument("revision", default="-1")
def downgrade(revision: str) -> None:
    """Migrate the schema down to REVISION (default: one step back; `base`: empty)."""
    from service.store import migrate

    reached = _run(lambda store: migrate.downgrade(store, revision))
    click.echo(f"{get_settings().database}: at revision {reached or 'base (empty)'}")


@db.command()
def current() -> None:
    """Show the schema revision of the database and the newest this code knows."""
    from service.store import migrate

    revision = _run(migrate.current_revision)
    head = migrate.head_revision()
    state = "up to date" if revision == head else "run `strata db upgrade`"
    click.echo(f"{get_settings().database}: revision {revision or 'none (empty)'}; code head "
               f"{head} ({state})")
