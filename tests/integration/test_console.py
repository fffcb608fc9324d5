"""`strata serve`'s console, started as a person starts it (first start: the zoo is registered,
the local worker and beat start, jobs are queued): Strata's own lines only. What libraries say
(TransformerLens loading each model, kombu's warning about the filesystem broker's URL,
uvicorn's start-up lines) goes to the log file, at its own level."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path

import httpx

from service.serve import _ConsoleFilter
from tests.integration.jobs_harness import V1
from tests.serving import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHATTER = ["Loading model config from local directory", "No hostname was supplied",
           "Changing model dtype", "Loading weights", "Uvicorn running on"]


def test_first_start_console_has_only_stratas_lines(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "STRATA_DATABASE": str(tmp_path / "strata.duckdb"),
           "STRATA_DATA_DIR": str(state), "STRATA_PORT": str(port),
           "STRATA_API_URL": f"http://127.0.0.1:{port}",
           "STRATA_JOBS__FAMILIES": '["intervention"]', "STRATA_JOBS__N_SEQUENCES": "2",
           "STRATA_JOBS__SEQ_LEN": "16", "STRATA_JOBS__PROGRESS_LOG_S": "1"}
    for name in ("STRATA_API_KEYS", "STRATA_API_KEY", "STRATA_BROKER_URL",
                 "HF_HUB_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)
    console = tmp_path / "console.txt"
    api_log = state / "logs" / "api.log"
    with console.open("wb") as sink:
        proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "strata"), "serve"], cwd=tmp_path,
                                env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def up() -> bool:
            assert proc.poll() is None, console.read_text()
            return httpx.get(f"http://127.0.0.1:{port}{V1}/ready", timeout=10).status_code == 200

        wait_for("the service", up, timeout=600, every=1)
        # the API process has sent a job through the filesystem broker (kombu warns then)
        wait_for("a job sent to the broker", lambda: "No hostname was supplied" in
                 api_log.read_text(), timeout=120, every=1)
        wait_for("a progress line", lambda: "jobs: " in console.read_text(), timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    text = console.read_text()
    for line in CHATTER:
        assert line not in text, f"{line!r} on the console:\n{text}"
    assert "first start: registered" in text
    assert f"Strata: serving {tmp_path / 'strata.duckdb'} on http://127.0.0.1:{port}" in text
    assert f"logs:      {state.resolve() / 'logs'}" in text
    assert "jobs: " in text
    logged = api_log.read_text()
    assert logged.count("Loading model config from local directory") >= 3
    assert "WARNING kombu.connection: No hostname was supplied" in logged
    assert "Uvicorn running on" in logged
    assert "Changing model dtype" in logged  # TransformerLens's print(), kept in the file
    # every console line is Strata's: its announcement, its log records, its progress
    for line in text.splitlines():
        assert (line.startswith(("Strata: ", "  ", "first start: ", "jobs: ", "INFO strata.",
                                 "WARNING strata.", "ERROR ", "Aborted!"))), line


def test_the_console_filter_keeps_stratas_records_and_everyones_errors() -> None:
    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "m", None, None)

    keep = _ConsoleFilter().filter
    assert keep(record("strata.jobs", logging.INFO))
    assert keep(record("strata", logging.WARNING))
    assert keep(record("kombu.connection", logging.ERROR))
    assert not keep(record("kombu.connection", logging.WARNING))
    assert not keep(record("root", logging.INFO))
    assert not keep(record("stratasphere", logging.WARNING))
    assert not keep(record("uvicorn.error", logging.INFO))
