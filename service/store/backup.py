"""Online backup and restore of the results database.

`backup(store, path)` copies a consistent snapshot of the open database into a new DuckDB file
while the process that holds it keeps serving: under the store's write lock (so no ingest is half
way: every run is in the copy whole, or not at all — an ingest is one transaction), DuckDB
attaches the new file and copies the whole database into it (`COPY FROM DATABASE`: tables, rows,
sequences with their current values, indexes). Reads go on meanwhile; writes wait for the copy.
The copy is written beside its destination under a temporary name, checkpointed, and renamed into
place, so a failed backup (disk full, killed) leaves no file that looks like a backup.

`path` may be an existing folder: the backup is then `strata-YYYYmmddTHHMMSSZ.duckdb` inside it,
and with `keep=N` only the newest N such files are kept (retention).

`restore(path, database)` puts a backup in place of the database file. It refuses while another
process holds the file (a running service: stop it first), checks that the file is a Strata
database, and keeps the file it replaces beside it as `<name>.pre-restore-<stamp>` (with its
write-ahead log, if one was left), so a restore loses nothing either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.store.db import Store, duckdb_connection
from service.store.errors import StoreError

BACKUP_GLOB = "strata-*.duckdb"
_BACKUP_NAME = re.compile(r"^strata-\d{8}T\d{6}(\d{6})?Z\.duckdb$")
_DISK_FULL = re.compile(
    r"no space left on device|disk is full|not enough space|"
    r"could not write all bytes|ENOSPC|errno 28|quota exceeded",
    re.I,
)


class BackupError(StoreError):
    """A backup or restore could not be made; the message says why and what to do."""


class BackupExistsError(BackupError):
    """The destination file exists already (a backup never overwrites one)."""


class DiskFullError(BackupError):
    """The disk holding the file ran out of space; nothing was written."""


@dataclass(frozen=True)
class BackupSummary:
    path: str
    bytes: int
    seconds: float
    runs: int
    revision: str | None
    removed: tuple[str, ...] = ()  # older backups removed by retention


def is_disk_full(exc: BaseException) -> bool:
    """Whether an exception (DuckDB's, or an OSError) says the disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _DISK_FULL.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def destination(path: Path) -> Path:
    """The file a backup to `path` writes: `path` itself, or a stamped name in a folder."""
    path = Path(path)
    if path.is_dir():
        return path / f"strata-{_stamp()}.duckdb"
    if not path.parent.is_dir():
        raise BackupError(f"cannot write the backup {path}: folder {path.parent} does not exist")
    if path.exists():
        raise BackupExistsError(
            f"{path} exists already: a backup never overwrites a file; give a new name or a folder"
        )
    return path


def backups_in(folder: Path) -> list[Path]:
    """Backups that `backup(store, folder)` made in `folder`, oldest first."""
    return sorted(p for p in Path(folder).glob(BACKUP_GLOB) if _BACKUP_NAME.match(p.name))


def backup(store: Store, path: Path | str, *, keep: int | None = None) -> BackupSummary:
    """Copy a consistent snapshot of `store` to `path` (a new file, or a folder).

    Raises `BackupExistsError`, `DiskFullError` (nothing left behind), `BackupError`.
    """
    path = Path(path)
    if keep is not None and keep < 1:
        raise BackupError("keep is at least 1 (the backup just made)")
    if keep is not None and not path.is_dir():
        raise BackupError("keep applies to a folder of backups: give a folder as the path")
    target = destination(path)
    if target.resolve() == Path(store.path).resolve():
        raise BackupError("the backup cannot be the database itself")
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
    alias = f"strata_backup_{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    try:
        # The write lock: no ingest runs while the copy is made, so none is half in it (the copy
        # is one transaction anyway, which sees only committed runs).
        with store.write() as conn:
            con = duckdb_connection(conn).cursor()
            try:
                source = con.execute("SELECT current_database()").fetchone()[0]
                con.execute(f"ATTACH '{_quote(partial)}' AS {alias}")
                try:
                    con.execute(f'COPY FROM DATABASE "{source}" TO {alias}')
                    runs = con.execute(f"SELECT count(*) FROM {alias}.runs").fetchone()[0]
                    revision = _revision(con, alias)
                    con.execute(f"CHECKPOINT {alias}")
                finally:
                    con.execute(f"DETACH {alias}")
            finally:
                con.close()
        _fsync(partial)
        os.replace(partial, target)
        _fsync_dir(target.parent)
    except BaseException as exc:
        for leftover in (partial, partial.with_name(partial.name + ".wal")):
            with contextlib.suppress(OSError):
                leftover.unlink()
        if isinstance(exc, StoreError):
            raise
        if isinstance(exc, Exception) and is_disk_full(exc):
            raise DiskFullError(
                f"no space left on the disk of {target.parent} for the backup; "
                "nothing was written: free space or choose another place"
            ) from exc
        if isinstance(exc, Exception):
            raise BackupError(f"the backup to {target} failed: {exc}") from exc
        raise
    removed: tuple[str, ...] = ()
    if keep is not None:
        old = backups_in(target.parent)[:-keep]
        for file in old:
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
        removed = tuple(str(p) for p in old)
    return BackupSummary(
        str(target),
        target.stat().st_size,
        time.perf_counter() - started,
        int(runs),
        revision,
        removed,
    )


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def _revision(con: Any, alias: str) -> str | None:
    try:
        row = con.execute(f"SELECT version_num FROM {alias}.alembic_version").fetchone()
    except Exception:  # a database never migrated has no version table
        return None
    return row[0] if row else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        _fsync(folder)


def check_backup(path: Path) -> tuple[str | None, int]:
    """(schema revision, number of runs) of a backup file; `BackupError` if it is not one."""
    import duckdb

    path = Path(path)
    if not path.is_file():
        raise BackupError(f"no backup file {path}")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise BackupError(f"{path} is not a DuckDB database: {exc}") from None
    try:
        tables = {
            r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
        }
        if not {"runs", "alembic_version"} <= tables:
            raise BackupError(
                f"{path} is a DuckDB database but not a Strata results database "
                "(no runs / alembic_version tables)"
            )
        row = con.execute("SELECT version_num FROM alembic_version").fetchone()
        (runs,) = con.execute("SELECT count(*) FROM runs").fetchone() or (0,)
    finally:
        con.close()
    return (row[0] if row else None), int(runs)


@dataclass(frozen=True)
class RestoreSummary:
    database: str
    source: str
    revision: str | None
    runs: int
    kept: str | None  # where the replaced database went


def restore(source: Path | str, database: Path | str) -> RestoreSummary:
    """Put the backup `source` in place of `database`.

    Raises `DatabaseHeldError` when a process (a running service) holds the database,
    `BackupError` when `source` is not a Strata database or cannot be copied.
    """
    source, database = Path(source), Path(database)
    revision, runs = check_backup(source)
    if source.resolve() == database.resolve():
        raise BackupError("the backup is the database itself: nothing to restore")
    if not database.parent.is_dir():
        raise BackupError(f"folder {database.parent} of the database does not exist")
    partial = database.with_name(f".{database.name}.{uuid.uuid4().hex[:8]}.restoring")
    try:
        shutil.copyfile(source, partial)
        _fsync(partial)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        if is_disk_full(exc):
            raise DiskFullError(
                f"no space left beside {database} for the restored copy; nothing was changed"
            ) from exc
        raise BackupError(f"cannot copy {source} beside {database}: {exc}") from exc
    kept: Path | None = None
    try:
        # Holding the file while swapping: no service can open it meanwhile, and opening it
        # replays (then checkpoints, on close) a write-ahead log a killed service left.
        if database.exists():
            Store.open(database).close()
        if database.exists():
            kept = database.with_name(f"{database.name}.pre-restore-{_stamp()}")
            os.replace(database, kept)
            wal = database.with_name(database.name + ".wal")
            if wal.exists():
                os.replace(wal, kept.with_name(kept.name + ".wal"))
        os.replace(partial, database)
        _fsync_dir(database.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return RestoreSummary(str(database), str(source), revision, runs, str(kept) if kept else None)
