"""A process killed in the middle of an ingest: the database opens afterwards, the run's previous
results are intact and none of the new ones are visible."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.store import Store
from service.store import repositories as repo
from service.store.ingest import ingest_result
from service.store.migrate import ensure_current
from tests.integration.stored import MOMENTS, stored_records
from tests.integration.synthetic import synthetic_result

# 3 x 40,000 neurons: 480k records, 120k neuron rows -- enough that DuckDB writes row groups to
# the file before the commit (optimistic writes), so the kill leaves uncommitted blocks behind.
LAYERS, NEURONS = 3, 40_000
METRICS = [f"neurons.{m}" for m in MOMENTS]  # what a synthetic result stores

CHILD = """
import pickle, sys, time
from pathlib import Path
from service.store import Store, ingest
result = pickle.loads(Path(sys.argv[2]).read_bytes())
marker = Path(sys.argv[3])
def pause():
    marker.write_text("rows written, not committed")
    time.sleep(120)
ingest.before_commit = pause
with Store.open(sys.argv[1], threads=1) as store:
    ingest.ingest_result(store, result)
"""


def _kill_mid_ingest(db: Path, result: object, tmp_path: Path) -> None:
    payload, marker = tmp_path / "result.pickle", tmp_path / "marker"
    payload.write_bytes(pickle.dumps(result))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(payload), str(marker)],
                             env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while not marker.exists():
        if child.poll() is not None:
            pytest.fail(f"ingest process ended early: {child.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail("ingest process never reached the commit")
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("same_run", [True, False], ids=["replacing", "new-run"])
def test_kill_during_ingest_leaves_previous_results(tmp_path: Path, db_path: Path,
                                                    same_run: bool) -> None:
    original = synthetic_result(LAYERS, NEURONS, seed=1)
    with Store.open(db_path, threads=1) as store:
        ensure_current(store)
        run_id = ingest_result(store, original).run_id
        with store.read() as conn:
            before = stored_records(conn, run_id, METRICS)
    # Same model and configuration (so the same run) with other values, or another run.
    replacement = (synthetic_result(LAYERS, NEURONS, seed=1, scale=2.0) if same_run
                   else synthetic_result(LAYERS, NEURONS, seed=2, name="other"))
    _kill_mid_ingest(db_path, replacement, tmp_path)

    with Store.open(db_path, threads=1) as store:
        ensure_current(store)
        with store.read() as conn:
            assert [r.id for r in repo.list_runs(conn)] == [run_id]
            assert repo.filter_models(conn)[1] == 1
            assert stored_records(conn, run_id, METRICS).equals(before)
            counts = conn.exec_driver_sql(
                "SELECT (SELECT count(*) FROM neurons), (SELECT count(*) FROM results)").one()
        assert tuple(counts) == (LAYERS * NEURONS, 0)
        # and the file still takes writes
        again = ingest_result(store, replacement)
        with store.read() as conn:
            assert stored_records(conn, again.run_id, METRICS).num_rows == 4 * LAYERS * NEURONS
