"""Every documented command runs as written: the shell commands of README.md's Quickstart and
SmolLM2 sections, and every `strata ...` or `curl ...` line in a ```bash block of docs/*.md, on a
fresh data folder against one started `strata serve` (the README's first command, on its
default address http://127.0.0.1:8000, with nothing configured but the hub kept offline and the
documented default run made small through `STRATA_JOBS__*`, as tests/integration/test_first_run.py
does).

A command that cannot run here says so in the doc, on its first line: `# not in CI: <why>` (the
hub, a GPU, hours of CPU). The test skips exactly those, and checks the list of them, so a new
mark is a visible change. Placeholders a reader replaces (`/path/to/my-checkpoint`, a lab's
backup folder) are replaced by the test with real things of its own (`PLACEHOLDERS`).

The commands that need no service (`WITHOUT_SERVICE`, a checked list like the marks) run as
tests of their own, each in a fresh folder, so the suite's processes run them beside the
service's; the rest run in order against the one service.

A command passes when it exits 0 and, for `curl`, answers no error body (`curl -s` exits 0 on a
404). The commands of one block share its exported variables, as in one shell session; the
README's `export KEY=... API=...` is in force for every command after it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from compute.zoo.paths import zoo_path
from tests.integration.real_models import data_dir_beside, gguf_path
from tests.integration.test_smollm2 import FILE as SMOLLM2_FILE
from tests.launcher import forking, write_command
from tests.serving import wait_for

# Each test on its own (not the module in one process): the commands without a service run
# beside the service's test.
pytestmark = pytest.mark.spread

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:8000"
V1 = f"{BASE}/api/v1"
SKIP = re.compile(r"#.*\bnot in CI\b")
COMMAND = re.compile(r"^(\.venv/bin/)?(strata|curl)\b")
# What the docs mark as not runnable here (the test fails if the marks change unnoticed).
MARKED = {
    ".venv/bin/strata models add gpt2",
    ".venv/bin/python scripts/study_figures.py --model SmolLM2-135M-Instruct.Q4_1",
    "strata compute --model pythia-410m-deduped --pile",
    # docs/study-smollm2.md's reproduction: a second service and SmolLM2's whole default run
    ".venv/bin/strata serve &",
    ".venv/bin/strata models add zoo:demo-4l",
    '.venv/bin/strata models add "$(bash scripts/fetch_smollm2.sh)"',
    # docs/study-pruning.md: each real model's pruning run, minutes of CPU per model
    "strata compute --model ~/.cache/strata/models/<file>.gguf --metrics pruning,pruning_drops",
    # docs/study-gemma3.md's and docs/study-two-families.md's: the study's service and Gemma 3's
    # 46-minute default run
    '.venv/bin/strata models add "$(bash scripts/fetch_gemma3.sh)"',
    ".venv/bin/strata jobs submit --model gemma-3-270m-q4_k_m",
    'curl -s "$API/compare?metric=intervention.kl&component=drop&models=SmolLM2',
    # docs/api.md's family examples that need a third refit of the zoo's 4-layer architecture
    "strata families add tiny-4l my-refit",
    "strata families remove tiny-4l my-refit",
}
# Commands the docs say run without a service, and whose outputs no later command reads: each
# runs as its own test, in a fresh folder of its own with no `strata serve` anywhere (so it shows
# it needs none), beside the service's test rather than in its line. SmolLM2's first look was
# half of the commands' time; run in line it was the suite's floor. (The demo-4l computes of
# docs/performance.md stay in line: the block's next command compares their outputs.)
WITHOUT_SERVICE = {
    '.venv/bin/strata compute --model "$GGUF"',
    ".venv/bin/strata zoo show planted-stages",
}


@dataclass
class Command:
    where: str  # file:line
    text: str  # the command, continuation lines joined
    exports: list[str]  # the block's export / assignment lines before it

    @property
    def skipped(self) -> bool:
        return bool(SKIP.search(self.text))


def _blocks(path: Path, sections: tuple[str, ...] | None = None) -> list[tuple[int, list[str]]]:
    """The ```bash blocks of `path` (those under a `## ` heading starting with one of `sections`
    when given): (first line number, lines)."""
    lines = path.read_text().splitlines()
    found, current, heading, start = [], None, "", 0
    for number, line in enumerate(lines, 1):
        if line.startswith("## "):
            heading = line[3:]
        if current is None and line.strip() == "```bash":
            current, start = [], number + 1
        elif current is not None and line.strip() == "```":
            if sections is None or heading.startswith(sections):
                found.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return found


def _commands(path: Path, *, every_line: bool, sections: tuple[str, ...] | None = None
              ) -> list[Command]:
    """The commands of `path`'s bash blocks: every shell command (`every_line`) or only the
    `strata` / `curl` ones; continuation lines joined."""
    out: list[Command] = []
    for start, lines in _blocks(path, sections):
        exports: list[str] = []
        i = 0
        while i < len(lines):
            first = i
            text = lines[i]
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            stripped = text.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if re.match(r"^(export\s+)?[A-Z_]+=", stripped):
                exports.append(stripped)
                continue
            piped = stripped.split("|")[-1].strip() if "|" in stripped else stripped
            if every_line or COMMAND.match(stripped) or COMMAND.match(piped):
                out.append(Command(f"{path.name}:{start + first}", stripped, list(exports)))
    return out


def documented() -> list[Command]:
    readme = ROOT / "README.md"
    commands = _commands(readme, every_line=True,
                         sections=("Quickstart", "A real pretrained model"))
    for doc in sorted((ROOT / "docs").glob("*.md")):
        commands += _commands(doc, every_line=False)
    return commands


def test_the_docs_commands_are_found_and_marked() -> None:
    """What this file runs, read from the docs (cheap: no service)."""
    commands = documented()
    texts = [c.text for c in commands]
    assert any(t.startswith(".venv/bin/strata models add /path/to/my-checkpoint") for t in texts)
    assert any(t.startswith('.venv/bin/strata models add "$GGUF"') for t in texts)
    assert any(t.startswith("strata db backup") for t in texts)
    assert any("runs/ingest" in t for t in texts)
    marked = {next(m for m in MARKED if c.text.startswith(m)) for c in commands if c.skipped
              if any(c.text.startswith(m) for m in MARKED)}
    assert marked == MARKED
    assert all(any(c.text.startswith(m) for m in MARKED) for c in commands if c.skipped), \
        [c.text for c in commands if c.skipped]
    for prefix in WITHOUT_SERVICE:  # each names one runnable command, which runs on its own
        assert len([c for c in commands if c.text.startswith(prefix) and not c.skipped]) == 1, \
            prefix


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _without_service(command: Command) -> bool:
    return any(command.text.startswith(prefix) for prefix in WITHOUT_SERVICE)


def _venv(home: Path) -> None:
    """The clone's `.venv`: the project's, whose `bin/strata` runs each command in a process
    forked by the session's zygote (`tests.launcher.write_command`: the same `strata` with the
    same arguments, environment, folder and streams, without a new interpreter's imports of
    torch and TransformerLens, which were half of these commands' CPU). The real entry point
    is what `strata serve` runs here, and what the README's first command runs
    (test_first_run.py); with PYTEST_STRATA_LAUNCH=exec it is every command's."""
    venv = ROOT / ".venv"
    if not forking():
        (home / ".venv").symlink_to(venv)
        return
    (home / ".venv" / "bin").mkdir(parents=True)
    for entry in venv.iterdir():
        if entry.name != "bin":
            (home / ".venv" / entry.name).symlink_to(entry)
    for entry in (venv / "bin").iterdir():
        if entry.name != "strata":
            (home / ".venv" / "bin" / entry.name).symlink_to(entry)
    write_command(home / ".venv" / "bin" / "strata")


def _home(tmp_path: Path) -> Path:
    """A fresh working folder, as a clone is: its own ./strata.duckdb and ./.strata, but for
    the dequantized real models (`.strata/gguf`), which are the tests' machine-wide copies, as
    in a clone that has loaded them before: dequantizing SmolLM2 again was a third of its
    first look's time, and tests/unit/test_gguf.py holds the dequantization itself."""
    home = tmp_path / "clone"
    home.mkdir()
    _venv(home)
    (home / "scripts").symlink_to(ROOT / "scripts")
    smollm2 = gguf_path(SMOLLM2_FILE, "STRATA_SMOLLM2_GGUF")
    if smollm2 is not None:
        shared = data_dir_beside(smollm2) / "gguf"
        shared.mkdir(parents=True, exist_ok=True)
        (home / ".strata").mkdir()
        (home / ".strata" / "gguf").symlink_to(shared)
    return home


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                # one thread per process: the suite runs this beside other test workers on a
                # 2-core machine, where a two-thread matmul waits at every barrier for a core
                # another process holds (SmolLM2's command ran past 600 s that way)
                "OMP_NUM_THREADS": "1",
                "PATH": f"{home / '.venv' / 'bin'}:{env.get('PATH', '')}",
                # the default run of each registered model, made small (documented settings)
                "STRATA_JOBS__FAMILIES": '["intervention", "logit_lens"]',
                "STRATA_JOBS__N_SEQUENCES": "2", "STRATA_JOBS__SEQ_LEN": "16"})
    return env


def _run(command: Command, home: Path, env: dict[str, str], exports: list[str],
         placeholders: dict[str, str]) -> str:
    """Run one command as a reader would, in `home`; fail on a non-zero exit or an error body.
    Returns the command as run (placeholders replaced)."""
    text = command.text
    for placeholder, real in placeholders.items():
        text = text.replace(placeholder, real)
    script = "\n".join(["set -euo pipefail", *exports, *command.exports, text])
    done = subprocess.run(["bash", "-c", script], cwd=home, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (command.where, text, done.stdout[-2000:], done.stderr[-3000:])
    if re.match(r"^curl\b", text.split("|")[-1].strip()) and done.stdout.strip():
        answer = json.loads(done.stdout)
        error_body = isinstance(answer, dict) and {"error", "detail", "status"} <= set(answer)
        assert not error_body, (command.where, answer)
    return text


@pytest.mark.parametrize("prefix", sorted(WITHOUT_SERVICE))
def test_a_documented_command_without_a_service_runs_as_written(prefix: str,
                                                                 tmp_path: Path) -> None:
    """The docs' commands that need no service, each in a fresh folder that no service uses
    (the assignments of its block before it, such as `GGUF=...`, in force)."""
    command = next(c for c in documented() if c.text.startswith(prefix))
    home = _home(tmp_path)
    _run(command, home, _environment(home), [], {})
    assert not (home / ".strata" / "api-key").exists()  # no service was started for it


def test_every_documented_command_runs_as_written(tmp_path: Path) -> None:
    """Every other runnable command, in order, against one started `strata serve`."""
    if not _port_free(8000):
        pytest.fail("port 8000 is taken: the docs' commands name http://127.0.0.1:8000")
    home = _home(tmp_path)
    mine = tmp_path / "elsewhere" / "my-checkpoint"
    shutil.copytree(zoo_path("tiny-2l-s0"), mine)
    (tmp_path / "backups").mkdir()  # a lab's backup folder, which exists
    placeholders = {"/path/to/my-checkpoint": str(mine),
                    "/srv/strata/backups": str(tmp_path / "backups"),
                    "/tmp/before-upgrade.duckdb": str(tmp_path / "before-upgrade.duckdb")}
    env = _environment(home)
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen([str(ROOT / ".venv" / "bin" / "strata"), "serve"], cwd=home,
                                 env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    client = httpx.Client(timeout=30)
    try:
        def healthy() -> bool:
            if serve.poll() is not None:
                raise AssertionError(f"strata serve exited:\n{log.read_text()[-4000:]}")
            try:
                return client.get(f"{V1}/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("strata serve", healthy, timeout=180, every=0.5)

        def computed(name: str) -> bool:
            model = client.get(f"{V1}/models/{name}").json()
            return {"intervention", "logit_lens"} <= set(model.get("current_runs") or {})

        def queued(name: str) -> list[dict[str, object]]:
            """The model's jobs: registration answers first and queues its default run from
            a background reconciliation just after."""
            return list(client.get(f"{V1}/jobs", params={"model": name}).json()["items"])

        # the first results are queryable within a minute or two (the README): wait for the
        # two models the commands read
        for name in ("tiny-2l-s0", "tiny-4l-s0"):
            wait_for(f"{name}'s default run", lambda n=name: computed(n), timeout=600, every=1)

        readme_exports = ["export KEY=$(cat .strata/api-key) API=http://127.0.0.1:8000/api/v1"]
        ran: list[str] = []
        for command in documented():
            if command.skipped or _without_service(command):
                continue
            text = _run(command, home, env, readme_exports, placeholders)
            ran.append(command.where)
            if text.startswith('.venv/bin/strata models add "$GGUF"'):
                # registered, and its default run queued; cancelled here (it would compute
                # SmolLM2 for minutes), which is the test's business, not the docs'
                name = "SmolLM2-135M-Instruct.Q4_1"
                jobs = wait_for(f"{name}'s default run to be queued",
                                lambda n=name: queued(n), timeout=60, every=0.5)
                key = (home / ".strata" / "api-key").read_text().strip()
                for job in jobs:
                    client.delete(f"{V1}/jobs/{job['id']}", headers={"X-API-Key": key})
            if text.startswith(f".venv/bin/strata models add {mine}"):
                wait_for("my-checkpoint's default run to be queued",
                         lambda: queued("my-checkpoint"), timeout=60, every=0.5)
        assert len(ran) >= 15, ran
    finally:
        client.close()
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
