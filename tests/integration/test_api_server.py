"""The shared API server itself (tests/integration/api_server.py): while it serves, its process
is the one holding the DuckDB file, so a `strata` command is told who holds it and a second
`strata serve` is refused plainly; it answers health and readiness over what it was seeded
with."""

from __future__ import annotations

import os

from tests import launcher
from tests.integration.api_server import Api, _env
from tests.serving import free_port


def test_server_holds_the_database(server: Api) -> None:
    """While the server runs, its process is the one with the file: the CLI says which."""
    proc = launcher.run(["db", "current"], {**os.environ, "STRATA_DATABASE": str(server.db)},
                        timeout=120)
    assert proc.returncode == 5, proc.stderr
    assert f"held by process {os.getpid()}" in proc.stderr


def test_a_second_server_is_refused_plainly(server: Api) -> None:
    proc = launcher.run(["serve", "--port", str(free_port())], _env(server.db, server.tmp),
                        timeout=120)
    assert proc.returncode == 5, proc.stderr
    assert "held by process" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_health_and_ready(server: Api) -> None:
    assert server.get("/api/v1/health").json() == {"status": "ok"}
    ready = server.get("/api/v1/ready")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert ready.json()["revision"] == ready.json()["head"]


def test_seeded_runs_inferred_stages(server: Api) -> None:
    runs = {r["id"]: r for r in server.get("/api/v1/runs", params={"limit": 500}).json()["items"]}
    # every seeded run and the stability run is there and succeeded (other modules sharing this
    # session's server may have added runs of their own)
    assert set(server.runs.values()) <= set(runs)
    assert {runs[i]["status"] for i in server.runs.values()} == {"succeeded"}
    stability = [r for r in runs.values() if r["config"].get("refit_family") == "tiny-4l"]
    assert [r["status"] for r in stability] == ["succeeded"]
