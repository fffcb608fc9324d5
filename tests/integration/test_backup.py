"""Online backup and restore with real processes: `strata serve` holding a real DuckDB file,
ingests arriving over HTTP from several threads while `strata db backup` (a real CLI process,
which must go through the service: it cannot open the held file) makes the copy; then
`strata db restore` into a fresh deployment and a second `strata serve` on the restored file."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from service.store.backup import backups_in
from tests import launcher
from tests.integration.api_server import arrow_body
from tests.integration.jobs_harness import KEY, V1, Deployment, make_broker
from tests.integration.synthetic import synthetic_result

LAYERS, NEURONS = 4, 1500  # 6,000 neurons (rows) per run, 24,000 records: ingests take a while
ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}


def cli(d: Deployment, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    return launcher.run(args, env or d.env(), timeout=300)


@pytest.fixture
def served() -> Iterator[Deployment]:
    d = Deployment(make_broker("filesystem"))
    try:
        d.start_api()
        yield d
    finally:
        d.close()


def bodies(count: int, prefix: str) -> list[tuple[str, bytes]]:
    base = synthetic_result(LAYERS, NEURONS, name=f"{prefix}0")
    out = []
    for i in range(count):
        result = synthetic_result(LAYERS, NEURONS, name=f"{prefix}{i}", seed=i) if i else base
        out.append((result.config.model.name, arrow_body(result)))
    return out


def backup_rows(path: Path) -> dict[str, tuple[str, int]]:
    """model name -> (run status, neuron rows) in a backup file, read with DuckDB directly."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.execute(
            "SELECT m.name, r.status, (SELECT count(*) FROM neurons n WHERE n.run_id = r.id) "
            "FROM runs r JOIN models m ON m.id = r.model_id").fetchall()
    finally:
        con.close()
    return {name: (status, count) for name, status, count in rows}


def answers(d: Deployment, model: str) -> dict[str, Any]:
    """What the service answers about a model's run: the run, its top neurons, its counts."""
    (run,) = d.client.get(f"{V1}/runs", params={"model": model}).json()["items"]
    out: dict[str, Any] = {"run": d.client.get(f"{V1}/runs/{run['id']}").json()}
    for cls in ("prediction", "suppression"):
        answer = d.client.get(f"{V1}/models/{model}/neurons",
                              params={"class": cls, "top": 25, "format": "json"})
        assert answer.status_code == 200, answer.text
        out[cls] = answer.json()
    return out


def test_backup_during_ingests_restores_every_finished_run(served: Deployment) -> None:
    d = served
    before = bodies(3, "early")
    for _name, body in before:
        assert d.client.post(f"{V1}/runs/ingest", content=body, headers=ARROW).status_code == 201
    during = bodies(8, "late")
    finished: dict[str, float] = {}  # model -> when its ingest was acknowledged
    failures: list[str] = []

    def ingest(share: list[tuple[str, bytes]]) -> None:
        import httpx

        with httpx.Client(base_url=d.base, timeout=120, headers={"X-API-Key": KEY}) as client:
            for name, body in share:
                answer = client.post(f"{V1}/runs/ingest", content=body, headers=ARROW)
                if answer.status_code != 201:
                    failures.append(f"{name}: {answer.status_code} {answer.text}")
                finished[name] = time.monotonic()

    threads = [threading.Thread(target=ingest, args=(during[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    # Back up once the first concurrent ingests are through, while the rest still arrive.
    deadline = time.monotonic() + 120
    while len(finished) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    folder = d.tmp / "backups"
    folder.mkdir()
    started = time.monotonic()
    done = cli(d, "db", "backup", str(folder), "--keep", "2")
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert done.returncode == 0, done.stderr
    acknowledged_before = {name for name, at in finished.items() if at < started}
    assert len(acknowledged_before) >= 2
    assert any(at > started for at in finished.values()), \
        "some ingests should still have been arriving during the backup"

    (path,) = backups_in(folder)
    assert f"backup {path}" in done.stdout
    stored = backup_rows(path)
    # every run acknowledged before the backup began is in it; every run in it is whole
    assert {name for name, _ in before} | acknowledged_before <= set(stored)
    for name, (status, count) in stored.items():
        assert (status, count) == ("succeeded", LAYERS * NEURONS), name
    assert set(stored) <= {name for name, _ in before + during}

    # the service kept serving: every ingest landed, reads answer
    assert len(d.runs()) == len(before) + len(during)
    original = {name: answers(d, name) for name in stored}

    # restore is refused while a service holds the database: exit 2, nothing changed
    refused = cli(d, "db", "restore", str(path))
    assert refused.returncode == 2, refused.stderr
    assert "Stop the Strata service" in refused.stderr
    assert len(d.runs()) == len(before) + len(during)

    # into a fresh deployment: restore, serve, same answers for every run of the backup
    fresh = Deployment(make_broker("filesystem"))
    try:
        put = cli(fresh, "db", "restore", str(path))
        assert put.returncode == 0, put.stderr
        assert f"{len(stored)} runs" in put.stdout
        fresh.start_api()
        assert sorted(r["model"] for r in fresh.runs()) == sorted(stored)
        for name in stored:
            assert answers(fresh, name) == original[name], name
        # and the restored service takes new ingests (its sequences continue after the copy's)
        _, extra = bodies(1, "after")[0]
        assert fresh.client.post(f"{V1}/runs/ingest", content=extra,
                                 headers=ARROW).status_code == 201
        assert len(fresh.runs()) == len(stored) + 1
    finally:
        fresh.close()


def test_backup_retention_and_refusals(served: Deployment) -> None:
    d = served
    name, body = bodies(1, "solo")[0]
    assert d.client.post(f"{V1}/runs/ingest", content=body, headers=ARROW).status_code == 201
    folder = d.tmp / "kept"
    folder.mkdir()
    made = []
    for _ in range(4):
        answer = d.client.post(f"{V1}/admin/backup", json={"path": str(folder), "keep": 3})
        assert answer.status_code == 201, answer.text
        made.append(answer.json()["path"])
        assert answer.json()["runs"] == 1
    assert [str(p) for p in backups_in(folder)] == made[1:], "the three newest are kept"
    # a key is needed; relative paths, missing folders and existing files are refused
    assert d.client.post(f"{V1}/admin/backup", json={"path": str(folder)},
                         headers={"X-API-Key": "wrong"}).status_code == 401
    rel = d.client.post(f"{V1}/admin/backup", json={"path": "relative.duckdb"})
    assert rel.status_code == 422
    assert "absolute" in rel.json()["detail"]
    missing = d.client.post(f"{V1}/admin/backup", json={"path": str(d.tmp / "no" / "x.duckdb")})
    assert missing.status_code == 422
    assert "does not exist" in missing.json()["detail"]
    exists = d.client.post(f"{V1}/admin/backup", json={"path": made[-1]})
    assert exists.status_code == 409
    keep_file = d.client.post(f"{V1}/admin/backup",
                              json={"path": str(d.tmp / "one.duckdb"), "keep": 2})
    assert keep_file.status_code == 422
    assert sorted(p.name for p in folder.iterdir()) == sorted(Path(p).name for p in made[1:]), \
        "a refused backup leaves nothing behind"
    # the CLI with the service stopped opens the file itself
    d.stop_api()
    alone = cli(d, "db", "backup", str(d.tmp / "offline.duckdb"))
    assert alone.returncode == 0, alone.stderr
    assert backup_rows(d.tmp / "offline.duckdb") == {name: ("succeeded", LAYERS * NEURONS)}
    again = cli(d, "db", "backup", str(d.tmp / "offline.duckdb"))
    assert again.returncode == 2
    assert "exists already" in again.stderr
    # restore refuses what is not a Strata database, and keeps the file it replaces
    junk = d.tmp / "junk.duckdb"
    junk.write_text("not a database")
    bad = cli(d, "db", "restore", str(junk))
    assert bad.returncode == 2
    assert "not a DuckDB database" in bad.stderr
    put = cli(d, "db", "restore", str(d.tmp / "offline.duckdb"))
    assert put.returncode == 0, put.stderr
    kept = list(d.tmp.glob("strata.duckdb.pre-restore-*"))
    assert len(kept) == 1
    assert backup_rows(kept[0]) == backup_rows(d.db)


def test_a_backup_that_does_not_fit_leaves_nothing(tmp_path: Path) -> None:
    """Disk full while copying: DiskFullError (HTTP 507), no file that looks like a backup, and
    the database goes on as before."""
    from service.store import Store
    from service.store.backup import DiskFullError, backup
    from service.store.ingest import ingest_result
    from service.store.migrate import upgrade
    from tests.integration.test_faults import small_disk

    with Store.open(tmp_path / "strata.duckdb", threads=1) as store:
        upgrade(store)
        ingest_result(store, synthetic_result(LAYERS, NEURONS, name="whole"))
        with small_disk(tmp_path / "tiny", 1) as disk:
            with pytest.raises(DiskFullError, match="no space left"):
                backup(store, disk, keep=3)
            assert list(disk.iterdir()) == []
        again = backup(store, tmp_path / "fits.duckdb")
    assert again.runs == 1
    assert backup_rows(tmp_path / "fits.duckdb") == {"whole": ("succeeded", LAYERS * NEURONS)}
