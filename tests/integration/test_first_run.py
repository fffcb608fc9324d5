"""The README's first command, run as written: it installs (idempotently: CI has just run the
same setup), starts the service on the one-machine default — API, a local worker and beat on
Celery's filesystem broker, DuckDB — registers the zoo models on first start and computes them.
The test waits until zoo results are queryable over HTTP, checks that a local worker killed
with SIGKILL is started again, then stops the service with Ctrl-C and checks every process it
started is gone. The default run is made small through the environment (STRATA_JOBS__*), the
one thing that differs from a person's first run.

The console of that first start carries Strata's own lines only. What libraries say
(TransformerLens loading each model, kombu's warning about the filesystem broker's URL,
uvicorn's start-up lines) goes to the log file, at its own level."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import httpx

from tests.integration.jobs_harness import V1
from tests.serving import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHATTER = ["Loading model config from local directory", "No hostname was supplied",
           "Changing model dtype", "Loading weights", "Uvicorn running on"]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks[:2]]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in \
        Path(f"/proc/{pid}/status").read_text().lower()


def test_readme_opens_with_the_service_and_the_tests() -> None:
    first, second = readme_commands()
    assert first.endswith("strata serve"), first
    assert "pytest" in second
    assert second in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


def test_first_command_serves_zoo_results_quietly_and_stops_cleanly(tmp_path: Path) -> None:
    first, _ = readme_commands()
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "STRATA_DATABASE": str(tmp_path / "strata.duckdb"),
           "STRATA_DATA_DIR": str(tmp_path / "state"), "STRATA_PORT": str(port),
           "STRATA_API_URL": f"http://127.0.0.1:{port}",
           "STRATA_JOBS__FAMILIES": '["intervention", "logit_lens"]',
           "STRATA_JOBS__N_SEQUENCES": "2", "STRATA_JOBS__SEQ_LEN": "16",
           "STRATA_WORKER__HEARTBEAT_S": "1", "STRATA_JOBS__PROGRESS_LOG_S": "2"}
    for name in ("STRATA_API_KEYS", "STRATA_API_KEY", "STRATA_BROKER_URL",
                 "HF_HUB_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)
    state = tmp_path / "state"
    log = tmp_path / "console.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(["bash", "-c", first], cwd=ROOT, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    worker_pids: set[int] = set()
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            return client.get(f"{V1}/ready").status_code == 200

        wait_for("the service", up, timeout=600, every=1)
        zoo = {m["name"] for m in client.get(f"{V1}/models").json()["items"]}
        assert {"tiny-4l-s0", "tiny-2l-s0"} <= zoo

        def zoo_results() -> list[dict[str, object]]:
            answer = client.get(f"{V1}/models/tiny-2l-s0/metrics",
                                params={"metric": "intervention.kl", "component": "drop"})
            return list(answer.json()["rows"]) if answer.status_code == 200 else []

        rows = wait_for("tiny-2l-s0's results", zoo_results, timeout=600, every=1)
        assert [r["layer"] for r in rows] == [0, 1]
        # the user's own checkpoint, anywhere on this machine, registers with nothing set
        # (the service listens on loopback only) and its default run is queued
        import shutil

        from compute.zoo.paths import zoo_path

        mine = tmp_path / "elsewhere" / "my-checkpoint"
        shutil.copytree(zoo_path("tiny-2l-s0"), mine)
        added = subprocess.run([str(ROOT / ".venv" / "bin" / "strata"), "models", "add",
                                str(mine)], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=300)
        assert added.returncode == 0, added.stderr
        assert "registered my-checkpoint" in added.stdout

        def queued() -> list[dict[str, object]]:
            jobs = client.get(f"{V1}/jobs", params={"model": "my-checkpoint"}).json()
            return list(jobs["items"])

        assert wait_for("my-checkpoint's default run", queued, timeout=120, every=1)
        console = log.read_text()
        assert f"http://127.0.0.1:{port}/" in console
        assert "first start: registered" in console
        assert re.search(r"jobs: .*succeeded", console), console[-2000:]
        # the local worker is restarted when it dies
        workers = client.get(f"{V1}/workers").json()
        local = [w for w in workers if w["name"].startswith("local")]
        assert local, workers
        os.kill(local[0]["pid"], signal.SIGKILL)
        worker_pids.add(local[0]["pid"])

        def restarted() -> bool:
            now = [w for w in client.get(f"{V1}/workers").json()
                   if w["name"].startswith("local") and w["pid"] != local[0]["pid"]
                   and w["seen_s_ago"] < 2]
            worker_pids.update(w["pid"] for w in now)
            return bool(now)

        wait_for("the local worker to be started again", restarted, timeout=120, every=1)
        worker_pids.update(w["pid"] for w in client.get(f"{V1}/workers").json())
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal reaches the whole group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        client.close()
    wait_for("every process the service started to stop",
             lambda: not any(alive(pid) for pid in worker_pids), timeout=30)
    assert_console_is_stratas(log.read_text(), state / "logs" / "api.log", tmp_path, port)


def assert_console_is_stratas(console: str, api_log: Path, tmp_path: Path, port: int) -> None:
    """What the service printed (after setup.sh's own lines) is Strata's; the libraries' lines
    are in the API's log file."""
    text = console[console.index("Strata: serving"):]
    for line in CHATTER:
        assert line not in text, f"{line!r} on the console:\n{text}"
    assert f"Strata: serving {tmp_path / 'strata.duckdb'} on http://127.0.0.1:{port}" in text
    assert f"logs:      {(tmp_path / 'state').resolve() / 'logs'}" in text
    logged = api_log.read_text()
    # the libraries' own lines, kept off the console, are in the log
    assert "Uvicorn running on" in logged
    assert "alembic.runtime.migration" in logged
    assert "WARNING kombu.connection: No hostname was supplied" in logged
    assert "Uvicorn running on" in logged
    # every console line is Strata's: its announcement, its log records, its progress
    for line in text.splitlines():
        assert (line.startswith(("Strata: ", "  ", "first start: ", "jobs: ", "INFO strata.",
                                 "WARNING strata.", "ERROR ", "Aborted!"))), line
