"""The API under test, in the test's own process: the app `strata serve` serves
(`service.serve.build_app`, with its job service and upkeep) on a real DuckDB file, behind
uvicorn on a loopback port, seeded through the real ingest paths and driven over HTTP with
httpx. Nothing is spawned, so the contract tests pay for no process start; what only a separate
process can show (signals, the one-writer lock between processes, the worker's delivery) is in
test_api_server.py, test_jobs.py and test_lifetime.py.

One server serves every `test_api_*` module: the session-scoped `server` fixture
(tests/integration/conftest.py) starts it with `start_api` and stops it when the session
ends. The store holds:
- `rand-3l`: the integration fixture's computed run (3-layer random model, every family), also
  under an older metric version, and a second registration of the same name with other
  processing (`rand-3l` then means the latest);
- `tiny-2l-s0`: a zoo model computed here (every family, a few sequences);
- `stagey`: a 6-layer run whose curves place all three stage boundaries (intervention,
  logit_lens, neurons);
- `line-12`, `line-24`: drop KL = 2 x relative depth on 12 and 24 layers (to check alignment);
- the refit family `tiny-4l` (zoo:tiny-4l-s0 vs s1), stored by `strata stability --store`
  (run in this process, before the server opens the file).
Runs are delivered with POST /api/v1/runs/ingest, as a remote worker would: the Arrow IPC bytes
that `strata compute --out run.arrow` writes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn

from compute.metrics import DEFAULT_FAMILIES
from compute.metrics.base import EngineOptions
from compute.models import ModelSpec, Processing, resolve_model_spec
from compute.records import Record, records_to_table
from compute.run import NEURON_TOKENS_SCHEMA, RunConfig, RunResult, compute_run, result_metadata
from compute.tokens import TokenSpec
from compute.zoo.paths import zoo_path
from service.exports import FORMATS
from service.serve import KEEP_ALIVE_S, build_app
from service.settings import Settings
from service.store import Store
from service.store.migrate import ensure_current
from tests.integration.synthetic import variant
from tests.serving import free_port, run_strata, settings_from_env, wait_for

KEY = "test-key-0123456789"
V1 = "/api/v1"
OTHER_KEY = "second-key"
CORS_ORIGIN = "http://dashboard.local"
INGEST_MAX_MB = 8


def arrow_body(result: RunResult, *, tokens: bool = True) -> bytes:
    """What `strata compute --out run.arrow` writes (run.arrow + run.neuron_tokens.arrow +
    run.sequence_means.arrow)."""
    body = FORMATS["arrow"].encode(result.records, result_metadata(result))
    if tokens and result.neuron_tokens.num_rows:
        body += FORMATS["arrow"].encode(result.neuron_tokens, None)
    if result.sequence_means.num_rows:
        body += FORMATS["arrow"].encode(result.sequence_means, None)
    return body


def _info(n_layers: int, d_mlp: int = 8, n_heads: int = 2) -> dict[str, Any]:
    return dict(architecture="synthetic", n_layers=n_layers, d_model=16, n_heads=n_heads,
                d_mlp=d_mlp, d_vocab=50, d_vocab_real=50, n_ctx=32, n_params=1000,
                normalization_type="LNPre", parallel_attn_mlp=False,
                processing=dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                                fold_value_biases=True, notes=[]))


def synthetic(name: str, n_layers: int, records: list[Record], families: tuple[str, ...],
              d_mlp: int = 8) -> RunResult:
    spec = ModelSpec(source="random", name=name, seed=0,
                     architecture=dict(n_layers=n_layers, d_model=16, d_mlp=d_mlp))
    config = RunConfig(model=spec, families=families,
                       tokens=TokenSpec(source="npy", path=f"{name}.npy", n_sequences=4,
                                        seq_len=16, fingerprint="0"))
    return RunResult(config=config, config_hash=config.config_hash(),
                     records=records_to_table(records),
                     neuron_tokens=NEURON_TOKENS_SCHEMA.empty_table(),
                     model_info=_info(n_layers, d_mlp), tokens_evaluated=56, device="cpu",
                     wall_s=0.5)


def stagey() -> RunResult:
    """6 layers; boundary 1 at layer 1 (drop KL collapses after layer 0), 2 at layer 3 (knee of
    the lens curve), 3 at layer 4 (suppression outnumbers prediction from there on)."""
    drop = [5.0, 0.5, 0.3, 0.2, 0.25, 0.3]
    lens = [10.0, 9.8, 9.5, 9.0, 3.0, 1.0, 0.0]
    pred, supp = [5, 5, 5, 5, 2, 1], [0, 0, 0, 1, 4, 6]
    records = [Record.of("intervention.kl", v, 56, layer=i, component="drop", stderr=0.01 * (i + 1))
               for i, v in enumerate(drop)]
    records += [Record.of("logit_lens.kl_to_final", v, 56, layer=i, stderr=0.02)
                for i, v in enumerate(lens)]
    for i in range(6):
        records += [Record.of("neurons.n_prediction", pred[i], 8, layer=i),
                    Record.of("neurons.n_suppression", supp[i], 8, layer=i),
                    Record.of("neurons.n_partition", 0, 8, layer=i),
                    Record.of("neurons.frac_prediction", pred[i] / 8, 8, layer=i),
                    Record.of("neurons.frac_suppression", supp[i] / 8, 8, layer=i),
                    Record.of("neurons.frac_partition", 0.0, 8, layer=i)]
    return synthetic("stagey", 6, records, ("intervention", "logit_lens", "neurons"))


def line(n_layers: int) -> RunResult:
    """drop KL = 2 x relative depth, stderr 0.1, on `n_layers` layers."""
    records = [Record.of("intervention.kl", 2 * layer / (n_layers - 1), 100, layer=layer,
                         component="drop", stderr=0.1) for layer in range(n_layers)]
    return synthetic(f"line-{n_layers}", n_layers, records, ("intervention",))


def zoo_run(tmp: Path) -> RunResult:
    np.save(tmp / "zoo.npy", np.random.default_rng(1).integers(1, 4000, (3, 12)))
    config = RunConfig(model=resolve_model_spec("zoo:tiny-2l-s0"),
                       tokens=TokenSpec(source="npy", path=str(tmp / "zoo.npy"), n_sequences=0,
                                        seq_len=0),
                       families=(*DEFAULT_FAMILIES, "heads_atp"),  # every family a sweep has
                       options=EngineOptions(induction_n=6, induction_sequences=2))
    return compute_run(config)


def other_processing(result: RunResult) -> RunResult:
    """The same model name with LayerNorm not folded: another registration of `rand-3l`."""
    model = result.config.model.model_copy(update={"processing": Processing(fold_ln=False)})
    config = result.config.model_copy(update={"model": model})
    return dataclasses.replace(result, config=config, config_hash=config.config_hash())


@dataclass
class Api:
    base: str
    client: httpx.Client
    db: Path
    tmp: Path
    store: Store
    uvicorn: uvicorn.Server
    thread: threading.Thread
    results: dict[str, RunResult] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.post(path, **kwargs)

    def ingest(self, result: RunResult, **params: Any) -> httpx.Response:
        return self.client.post("/api/v1/runs/ingest", content=arrow_body(result), params=params,
                                headers={"X-API-Key": KEY,
                                         "Content-Type": FORMATS["arrow"].media_type})

    def stop(self) -> None:
        """As `strata serve` stops: the app's shutdown (upkeep), then the store is closed."""
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)
        self.client.close()
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def settings_for(db: Path, tmp: Path) -> Settings:
    """The server's settings: what `_env` gives a `strata serve` process."""
    return settings_from_env(_env(db, tmp))


def _env(db: Path, tmp: Path) -> dict[str, str]:
    """The server's configuration as a process environment (a `strata` command run beside the
    server reads it; `settings_for` is the same, read). No worker, no reconciliation: these
    tests read what they seeded, nothing more."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "STRATA_DATABASE": str(db), "STRATA_API_KEYS": f"{KEY}, {OTHER_KEY}",
            "STRATA_API__CHECKPOINT_ROOTS": f'["{tmp / "checkpoints"}"]',
            "STRATA_API__CORS_ORIGINS": f'["{CORS_ORIGIN}"]',
            "STRATA_API__INGEST_MAX_MB": str(INGEST_MAX_MB),
            "STRATA_API__DUCKDB_THREADS": "1", "OMP_NUM_THREADS": "1",
            "STRATA_JOBS__RECONCILE": "false", "STRATA_JOBS__REGISTER_ZOO": "false",
            "STRATA_DATA_DIR": str(tmp / "state")}


def store_stability(env: dict[str, str], members: tuple[str, ...] = ("zoo:tiny-4l-s0",
                                                                     "zoo:tiny-4l-s1")) -> None:
    """`strata stability --store` for a refit family (its members' sources), run in this
    process with `env` as its environment."""
    family = [arg for member in members for arg in ("--family", member)]
    result = run_strata(["stability", *family, "--n-prompts", "3", "--prompt-len", "12",
                         "--n-null", "1", "--store"], env)
    assert result.exit_code == 0, result.output


def start_api(run_result: RunResult) -> Api:
    """Seed a store (stability through the CLI, runs over HTTP) and serve it from a thread."""
    tmp = Path(tempfile.mkdtemp(prefix="strata-api-"))
    db = tmp / "strata.duckdb"
    (tmp / "checkpoints").mkdir()
    store_stability(_env(db, tmp))
    zoo = zoo_run(tmp)
    settings = settings_for(db, tmp)
    store = Store.open(db, threads=1)
    ensure_current(store)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(settings, store), host="127.0.0.1",
                                           port=port, log_config=None, access_log=False,
                                           lifespan="on", timeout_keep_alive=KEEP_ALIVE_S))
    thread = threading.Thread(target=server.run, name="api-server", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=60)
    api = Api(base, client, db, tmp, store, server, thread)
    wait_for("the in-process API", lambda: server.started, timeout=60)
    shutil.copytree(zoo_path("tiny-2l-s0"), tmp / "checkpoints" / "mini")
    api.results = {"rand-3l": run_result, "rand-3l-v0": variant(run_result, metric_version="0"),
                   "rand-3l-raw": other_processing(run_result), "tiny-2l-s0": zoo,
                   "stagey": stagey(), "line-12": line(12), "line-24": line(24)}
    for name, result in api.results.items():
        response = api.ingest(result)
        assert response.status_code == 201, response.text
        api.runs[name] = response.json()["run_id"]
    return api
