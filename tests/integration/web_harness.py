"""The service behind the dashboard and client tests: a real `strata serve` (with the local
worker it starts when no broker is configured) on a real DuckDB file, seeded through the real
ingest path with results that compute produced for two zoo models of different depths
(tiny-2l-s0: 2 layers, tiny-4l-s0: 4 layers), plus a refit family's head stability stored by
`strata stability --store` (fam4l-adamw-s0 vs s1) and a heads run of its anchor.

The session-scoped `web` fixture (tests/integration/conftest.py) starts it once and stops it
when the session ends. Reconciliation is off, so the store holds only what was seeded and what
the tests submit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from compute.metrics.base import EngineOptions
from compute.models import resolve_model_spec
from compute.run import RunConfig, RunResult, compute_run
from compute.tokens import TokenSpec
from tests.integration.api_server import arrow_body, store_stability
from tests.serving import Proc, start_service

KEY = "dashboard-key-0123456789"
MODELS = {"tiny-2l-s0": 2, "tiny-4l-s0": 4}
FAMILY = "fam4l-adamw"


@dataclass
class Service:
    base: str
    proc: Proc
    log: Path
    tmp: Path
    results: dict[str, RunResult] = field(default_factory=dict)
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.base, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()

    def ingest(self, result: RunResult) -> None:
        """Deliver a computed run over HTTP (POST /api/v1/runs/ingest), as a worker would."""
        response = self.client.post(
            "/api/v1/runs/ingest", content=arrow_body(result),
            headers={"X-API-Key": KEY, "Content-Type": "application/vnd.apache.arrow.stream"})
        assert response.status_code == 201, response.text


def zoo_result(name: str, tokens: Path) -> RunResult:
    """Every family of a shipped zoo model on a few sequences (a few seconds on a CPU)."""
    config = RunConfig(model=resolve_model_spec(f"zoo:{name}"),
                       tokens=TokenSpec(source="npy", path=str(tokens), n_sequences=0,
                                        seq_len=0),
                       options=EngineOptions(induction_n=6, induction_sequences=2))
    return compute_run(config)


def service_env(db: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "STRATA_DATABASE": str(db), "STRATA_API_KEYS": KEY,
            # its own broker folder: a worker of another service on this machine must not take
            # this service's jobs (the default is ./.strata, shared by every checkout user)
            "STRATA_DATA_DIR": str(db.parent / "state"),
            "STRATA_API__DUCKDB_THREADS": "1", "OMP_NUM_THREADS": "1",
            # only what a test submits is computed (no default runs of registered models)
            "STRATA_JOBS__RECONCILE": "false", "STRATA_JOBS__RECONCILE_INTERVAL_S": "86400",
            "STRATA_JOBS__REGISTER_ZOO": "false",
            # progress reaches the API twice a second (a test job runs for a few seconds)
            "STRATA_WORKER__HEARTBEAT_S": "0.5"}


def start_web_service() -> Service:
    """Store a refit family's stability (the CLI, in this process), start `strata serve`, and
    deliver the two zoo runs over HTTP with POST /api/v1/runs/ingest, as a worker would."""
    tmp = Path(tempfile.mkdtemp(prefix="strata-dashboard-"))
    db = tmp / "strata.duckdb"
    env = service_env(db)
    store_stability(env, ("zoo:fam4l-adamw-s0", "zoo:fam4l-adamw-s1"))
    np.save(tmp / "tokens.npy", np.random.default_rng(0).integers(1, 4000, (4, 24)))
    results = {name: zoo_result(name, tmp / "tokens.npy") for name in MODELS}
    # the family anchor's heads run: what the stability-against-importance panel joins with
    anchor = compute_run(RunConfig(
        model=resolve_model_spec("zoo:fam4l-adamw-s0"),
        tokens=TokenSpec(source="npy", path=str(tmp / "tokens.npy"), n_sequences=0, seq_len=0),
        families=("heads",), options=EngineOptions(induction_n=6, induction_sequences=2)))
    served = start_service(env, log=tmp / "serve.log", inherit=False, forked=True)
    service = Service(served.base, served.proc, served.log, tmp, results)
    for result in [*results.values(), anchor]:
        service.ingest(result)
    return service
