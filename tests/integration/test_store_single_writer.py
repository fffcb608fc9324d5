"""One writer: a second process cannot open a held file, and is told so plainly (exit code 5
from the CLI); the CLI's `db` commands and `store_result`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from compute.run import RunResult
from service.cli.db import check_store_writable, db, store_result
from service.settings import Settings, get_settings
from service.store import DatabaseHeldError, SchemaOutOfDateError, Store
from service.store import repositories as repo
from service.store.migrate import downgrade, head_revision

HOLDER = """
import sys, time
from service.store import Store
store = Store.open(sys.argv[1])
print("holding", flush=True)
time.sleep(120)
"""


@contextmanager
def held_by_another_process(path: Path) -> Iterator[int]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding"
        yield child.pid
    finally:
        child.kill()
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()


@pytest.fixture
def settings(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("STRATA_DATABASE", str(db_path))
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def test_held_file_names_the_holder(db_path: Path) -> None:
    with held_by_another_process(db_path) as pid, pytest.raises(DatabaseHeldError) as caught:
        Store.open(db_path)
    assert caught.value.pid == pid
    assert f"held by process {pid}" in str(caught.value)
    assert "python" in str(caught.value)
    assert "service" in str(caught.value)
    with Store.open(db_path):  # released when the holder is gone
        pass


def test_closing_releases_the_file(db_path: Path) -> None:
    Store.open(db_path).close()
    with held_by_another_process(db_path):
        pass


def test_cli_says_the_database_is_held(db_path: Path, settings: Settings) -> None:
    with held_by_another_process(db_path) as pid:
        result = CliRunner().invoke(db, ["current"])
        with pytest.raises(DatabaseHeldError):
            check_store_writable(settings)
    assert result.exit_code == 5
    assert f"process {pid}" in result.output
    assert "Traceback" not in result.output


def test_cli_db_commands(settings: Settings) -> None:
    runner = CliRunner()
    assert "revision none" in runner.invoke(db, ["current"]).output
    result = runner.invoke(db, ["upgrade", "0001"])
    assert result.exit_code == 0
    assert "revision 0001" in result.output
    assert runner.invoke(db, ["upgrade"]).output.strip().endswith(head_revision())
    assert "up to date" in runner.invoke(db, ["current"]).output
    result = runner.invoke(db, ["downgrade"])
    assert result.exit_code == 0
    assert f"revision {int(head_revision()) - 1:04d}" in result.output  # one step down
    bad = runner.invoke(db, ["upgrade", "nope"])
    assert bad.exit_code == 2
    assert "nope" in bad.output


def test_store_result_initialises_then_replaces(settings: Settings,
                                                run_result: RunResult) -> None:
    check_store_writable(settings)  # creates the file at the newest schema
    first = store_result(run_result, settings)
    assert store_result(run_result, settings) == first
    with Store.open(settings.database) as store, store.read() as conn:
        assert [r.id for r in repo.list_runs(conn)] == [first]


def test_store_result_refuses_an_old_schema(settings: Settings, run_result: RunResult) -> None:
    check_store_writable(settings)
    with Store.open(settings.database) as store:
        downgrade(store, "0001")
    with pytest.raises(SchemaOutOfDateError, match="strata db upgrade"):
        store_result(run_result, settings)


def test_error_message_without_a_pid() -> None:
    from service.store.db import held_error

    error = held_error(Path("x.duckdb"), 'IO Error: Could not set lock on file "x.duckdb"')
    assert error is not None
    assert error.pid is None
    assert "another process" in str(error)
    assert held_error(Path("x.duckdb"), "Catalog Error: no table") is None
    text = textwrap.dedent("""IO Error: Could not set lock on file "/x.duckdb": Conflicting lock
        is held in /usr/bin/python3.11 (PID 4242). See also https://duckdb.org/docs""")
    held = held_error(Path("/x.duckdb"), " ".join(text.split()))
    assert held is not None
    assert held.pid == 4242
