"""Opening the DuckDB file: one process, read-write, for the life of that process.

DuckDB lets exactly one process open a file read-write, and while it does, no other process can
open it at all (not even read-only). Strata makes that the design instead of an accident: the API
service holds the file while it runs; the CLI holds it for one command when no service runs.
`Store.open` turns DuckDB's lock error into `DatabaseHeldError`, naming the holder.

Inside the process, SQLAlchemy's pool hands each thread its own DuckDB connection to the one
database instance; writes go through `Store.write()`, which serialises them on a lock so two
ingests never race for the same run. Read-heavy callers (the API's handlers) take
`Store.cursor()` instead: the calling thread's own DuckDB cursor, made once per thread and kept,
so a request pays no pool checkout. `Store.generation` counts committed writes: everything a
process caches about the database is valid while it stays the same (this process is the only
writer, so no write can happen behind its back).

>>> with Store.open(tmp_path / "strata.duckdb") as store:      # doctest: +SKIP
...     with store.read() as conn:
...         conn.exec_driver_sql("SELECT 42").scalar()
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy as sa

from service.store.errors import DatabaseHeldError, StoreError

_LOCK_MESSAGE = re.compile(r"Could not set lock on file|Conflicting lock is held", re.I)
_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.*?) \(PID (?P<pid>\d+)\)")


def _process_name(pid: int) -> str | None:
    """The command line of a local process, if this machine can see it (Linux /proc)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    words = [" ".join(w.decode(errors="replace").split()) for w in raw.split(b"\0") if w]
    if not words:
        return None
    # `python -m service.cli serve` or `.venv/bin/strata serve`: show what a person would type.
    text = " ".join(Path(words[0]).name if i == 0 else w for i, w in enumerate(words))
    return text if len(text) <= 120 else text[:117] + "..."


def held_error(path: Path, message: str) -> DatabaseHeldError | None:
    """A `DatabaseHeldError` if `message` is DuckDB's file-lock error, else None."""
    if not _LOCK_MESSAGE.search(message):
        return None
    match = _HOLDER.search(message)
    if match is None:
        return DatabaseHeldError(path)
    pid = int(match["pid"])
    return DatabaseHeldError(path, pid, _process_name(pid) or Path(match["exe"]).name)


class Store:
    """The results database of this process. Open it with `Store.open`, close it when done."""

    def __init__(self, engine: sa.Engine, path: Path) -> None:
        self.engine = engine
        self.path = path
        self.generation = 0
        self._write_lock = threading.RLock()
        self._cursor_lock = threading.Lock()
        self._local = threading.local()
        self._root: Any = None  # a pool connection held for the life of the store
        self._cursors: list[Any] = []

    @classmethod
    def open(cls, path: Path | str, *, threads: int | None = None) -> Store:
        """Open (creating if needed) the DuckDB file read-write.

        Raises `DatabaseHeldError` when another process holds it, `StoreError` when it is not a
        DuckDB database or its folder does not exist.
        """
        path = Path(path)
        if not path.parent.is_dir():
            raise StoreError(
                f"cannot create the database {path}: folder {path.parent} does not exist"
            )
        config: dict[str, Any] = {}
        if threads is not None:
            config["threads"] = threads
        engine = sa.create_engine(
            f"duckdb:///{path}", connect_args={"config": config}, pool_size=4, max_overflow=4
        )
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except sa.exc.DBAPIError as exc:
            engine.dispose()
            message = str(exc.orig)
            held = held_error(path, message)
            if held is not None:
                raise held from None
            raise StoreError(f"cannot open the database {path}: {message}") from exc
        return cls(engine, path)

    @contextlib.contextmanager
    def read(self) -> Iterator[sa.Connection]:
        """A connection for queries (the thread's own DuckDB connection, from the pool)."""
        with self.engine.connect() as conn:
            yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[sa.Connection]:
        """A connection inside one transaction, committed on success, rolled back on error.

        Writers take turns: a second `write()` in another thread waits for the first.
        """
        with self._write_lock:
            with self.engine.begin() as conn:
                yield conn
            self.generation += 1

    def cursor(self) -> Any:
        """The calling thread's own DuckDB cursor (a connection to this database), for reads.

        Made on a thread's first call and reused by every later call on that thread; each
        statement runs in its own transaction, so it sees every committed write.
        """
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            with self._cursor_lock:
                if self._root is None:
                    self._root = self.engine.raw_connection()
                cursor = duckdb_connection(self._root).cursor()
                self._cursors.append(cursor)
            self._local.cursor = cursor
        return cursor

    def close(self) -> None:
        """Close every connection, releasing the file for other processes."""
        with self._cursor_lock:
            for cursor in self._cursors:
                cursor.close()
            self._cursors.clear()
            if self._root is not None:
                self._root.close()
                self._root = None
            self._local = threading.local()
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def duckdb_connection(conn: Any) -> Any:
    """The `duckdb.DuckDBPyConnection` itself under a pool connection.

    duckdb-engine wraps it (`ConnectionWrapper`), forwarding attribute access to it but not
    `cursor()`, which it answers with a DB-API cursor on the *same* connection. A DuckDB cursor
    (another connection to the same database) comes from the wrapped connection.
    """
    wrapper = raw_connection(conn)
    return getattr(wrapper, "_ConnectionWrapper__c", wrapper)


def raw_connection(conn: Any) -> Any:
    """The DuckDB connection under a SQLAlchemy connection (same transaction), for Arrow I/O.

    Also accepts a pool connection (`engine.raw_connection()`) or a DuckDB connection itself
    (`Store.cursor()`), which is returned as it is.
    """
    if isinstance(conn, sa.Connection):
        return conn.connection.driver_connection
    return getattr(conn, "driver_connection", conn)
