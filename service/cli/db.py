"""`strata db ...`: the results database's schema, and storing a computed run from the CLI.

The CLI opens the database (STRATA_DATABASE) only when no service holds it; when one does, it
says so and exits with code 5 instead of showing DuckDB's lock error — except `strata db backup`,
which then asks the service to make the backup (POST /api/v1/admin/backup). `strata db restore`
refuses a running service (exit 2).

Wiring (service/cli/__init__.py): `main.add_command(db)`; `strata compute --store` calls
`check_store_writable(settings)` before computing and `store_result(result, settings)` after.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from service.cli.errors import EXIT_BAD_INPUT, EXIT_HELD, EXIT_UNREACHABLE, exit_code_of, fail
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
    click.echo(
        f"{get_settings().database}: revision {revision or 'none (empty)'}; code head "
        f"{head} ({state})"
    )


@db.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=None,
    help="PATH is a folder of backups: keep only the newest KEEP of them",
)
@click.option(
    "--url",
    default=None,
    help="make the backup through this service (default: "
    "through STRATA_API_URL when a service holds the database, else directly)",
)
def backup(path: Path, keep: int | None, url: str | None) -> None:
    """Copy a consistent snapshot of the database to PATH (a new file, or a folder: then
    strata-<UTC time>.duckdb inside it), while the service keeps running.

    With a service running (it alone may open the file) the service writes the backup: PATH is
    then a path on its machine. Without one, the CLI opens the file itself.
    """
    from service.store.backup import BackupError, DiskFullError
    from service.store.backup import backup as make_backup
    from service.store.db import Store
    from service.store.errors import DatabaseHeldError

    settings = get_settings()
    if url is None and not settings.database.exists():
        fail(
            f"no database at {settings.database} (STRATA_DATABASE): nothing to back up",
            EXIT_BAD_INPUT,
        )
    if url is None:
        try:
            store = Store.open(settings.database)
        except DatabaseHeldError as held:
            done = _backup_through_service(settings.api_url, path, keep, held)
        except StoreError as exc:
            fail(str(exc), exit_code_of(exc))
        else:
            try:
                summary = make_backup(store, path, keep=keep)
            except DiskFullError as exc:
                fail(str(exc), 1)
            except BackupError as exc:
                fail(str(exc), EXIT_BAD_INPUT)
            finally:
                store.close()
            done = {
                "path": summary.path,
                "bytes": summary.bytes,
                "seconds": summary.seconds,
                "runs": summary.runs,
                "revision": summary.revision,
                "removed": list(summary.removed),
            }
    else:
        done = _backup_through_service(url, path, keep, None)
    click.echo(
        f"backup {done['path']}: {done['runs']} runs, {done['bytes'] / 2**20:.1f} MiB, "
        f"schema {done['revision']}, {done['seconds']:.2f} s"
    )
    for old in done["removed"]:
        click.echo(f"removed old backup {old}")


def _backup_through_service(
    url: str, path: Path, keep: int | None, held: StoreError | None
) -> dict[str, Any]:
    from service.cli.http import send
    from service.client.errors import ApiError, UnreachableError

    body: dict[str, Any] = {"path": str(path.absolute())}
    if keep is not None:
        body["keep"] = keep
    try:
        answer = send(url, "POST", "/api/v1/admin/backup", json=body, timeout=3600)
    except UnreachableError as exc:
        if held is not None:
            fail(
                f"{held} No service answers at {url} to make the backup ({exc.reason}): give "
                "--url, or stop the process and run this again.",
                EXIT_HELD,
            )
        fail(f"the service at {url} cannot be reached ({exc.reason})", EXIT_UNREACHABLE)
    except ApiError as exc:
        fail(
            f"the service refused the backup: {exc.detail} (HTTP {exc.status})",
            EXIT_BAD_INPUT if exc.status < 500 else 1,
        )
    result: dict[str, Any] = answer.json()
    return result


@db.command()
@click.argument("path", type=click.Path(path_type=Path))
def restore(path: Path) -> None:
    """Put the backup PATH in place of the database (STRATA_DATABASE). The service must be
    stopped; the database it replaces is kept beside it as <name>.pre-restore-<UTC time>."""
    from service.store.backup import BackupError, DiskFullError
    from service.store.backup import restore as put_back
    from service.store.errors import DatabaseHeldError

    settings = get_settings()
    try:
        done = put_back(path, settings.database)
    except DatabaseHeldError as exc:
        fail(
            f"{exc} Stop the Strata service before restoring (a restore replaces the file it "
            "serves); nothing was changed.",
            EXIT_BAD_INPUT,
        )
    except DiskFullError as exc:
        fail(str(exc), 1)
    except BackupError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    click.echo(
        f"restored {done.source} into {done.database}: {done.runs} runs, schema {done.revision}"
    )
    if done.kept:
        click.echo(f"the database it replaced is kept as {done.kept}")
    from service.store.migrate import head_revision

    if done.revision != head_revision():
        click.echo(
            f"the backup's schema is {done.revision}, this code's is {head_revision()}: "
            "run `strata db upgrade` before `strata serve`"
        )
