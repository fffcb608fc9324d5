"""A model's canonical results (issue 50): what its answers mean by default is its default
configuration's run (the run reconciliation computes), or a run an operator pinned; a newer run
of another configuration (a small job) never replaces it, every answer names the run it was read
from and why, pins are authenticated writes kept in an audit log, and a store from before pins
answers as it did for every model with a default run.

The API runs in process (`litestar.testing.TestClient`) on a real DuckDB file; runs are
synthetic (per-layer rows without computing), ingested through the real ingest.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from compute.models import ModelSpec
from compute.records import Record, records_to_table
from compute.run import NEURON_TOKENS_SCHEMA, RunConfig, RunResult
from compute.tokens import TokenSpec
from service.api.app import create_app
from service.jobs.configs import default_config
from service.settings import Settings
from service.store import Store, migrate
from service.store.ingest import ingest_result
from service.store.registry import model_identity
from tests.serving import settings_from_env

KEY = "pin-key-0123456789"
V1 = "/api/v1"
N_LAYERS = 4


def _settings(db: Path, keys: str = KEY) -> Settings:
    return settings_from_env({
        "HF_HUB_OFFLINE": "1", "STRATA_DATABASE": str(db), "STRATA_API_KEYS": keys,
        "STRATA_DATA_DIR": str(db.parent / "state"), "STRATA_JOBS__RECONCILE": "false",
        "STRATA_JOBS__FAMILIES": '["intervention"]', "STRATA_JOBS__N_SEQUENCES": "4",
        "STRATA_JOBS__SEQ_LEN": "16"})


def _spec(name: str) -> ModelSpec:
    return ModelSpec(source="random", name=name, seed=0,
                     architecture=dict(n_layers=N_LAYERS, d_model=16, d_mlp=8))


def _result(config: RunConfig, scale: float) -> RunResult:
    """drop KL = scale x layer: which run answered is read off the values."""
    records = [Record.of("intervention.kl", scale * layer, 8, layer=layer, component="drop",
                         stderr=0.1) for layer in range(N_LAYERS)]
    info = dict(architecture="synthetic", n_layers=N_LAYERS, d_model=16, n_heads=2, d_mlp=8,
                d_vocab=50, d_vocab_real=50, n_ctx=32, n_params=1000,
                normalization_type="LNPre", parallel_attn_mlp=False,
                processing=dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                                fold_value_biases=True, notes=[]))
    return RunResult(config=config, config_hash=config.config_hash(),
                     records=records_to_table(records),
                     neuron_tokens=NEURON_TOKENS_SCHEMA.empty_table(), model_info=info,
                     tokens_evaluated=4 * 15, device="cpu", wall_s=0.1)


def default_run(name: str, settings: Settings, scale: float = 1.0) -> RunResult:
    """The model's default configuration's run, as reconciliation would have it computed."""
    config = default_config(model_identity(_spec(name)), 32, settings)
    return _result(config, scale)


def small_run(name: str, scale: float, n_sequences: int = 2) -> RunResult:
    """What a quick job makes: the same model, fewer sequences, another token source."""
    config = RunConfig(model=_spec(name), families=("intervention",),
                       tokens=TokenSpec(source="npy", path=f"{name}-{n_sequences}.npy",
                                        n_sequences=n_sequences, seq_len=8, fingerprint="0"))
    return _result(config, scale)


@dataclass
class Service:
    store: Store
    settings: Settings
    client: TestClient[Any]
    runs: dict[str, int]

    def ingest(self, label: str, result: RunResult) -> int:
        self.runs[label] = ingest_result(self.store, result).run_id
        return self.runs[label]

    def metrics(self, model: str, **params: Any) -> Any:
        answer = self.client.get(f"{V1}/models/{model}/metrics",
                                 params={"metric": "intervention.kl", **params})
        assert answer.status_code == 200, answer.text
        return answer


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    db = tmp_path / "strata.duckdb"
    settings = _settings(db)
    with Store.open(db, threads=1) as store:
        migrate.upgrade(store)
        with TestClient(create_app(settings, store)) as client:
            yield Service(store, settings, client, {})


def _kl_at_1(answer: Any) -> float:
    return float(next(r["value"] for r in answer.json()["rows"] if r["layer"] == 1))


def test_a_newer_small_run_does_not_replace_the_default_run(service: Service) -> None:
    default = service.ingest("default", default_run("syn", service.settings, scale=1.0))
    small = service.ingest("small", small_run("syn", scale=5.0))  # finished after the default

    answer = service.metrics("syn")
    run = answer.json()["run"]
    assert run["id"] == default
    assert _kl_at_1(answer) == pytest.approx(1.0)
    assert (run["selected_by"], run["canonical"]) == ("default", True)
    assert (run["tokens"], run["n_sequences"], run["seq_len"], run["dtype"]) == (
        "builtin", 4, 16, "float32")
    assert answer.headers["X-Strata-Run"].startswith(f"{default}; ")
    assert "selected_by=default" in answer.headers["X-Strata-Run"]

    model = service.client.get(f"{V1}/models/syn").json()
    assert model["current_runs"] == {"intervention": default}
    assert model["current_run_basis"] == {"intervention": "default"}
    assert (model["default_run_id"], model["current_run_id"], model["pinned"]) == (
        default, default, {})

    # The small run is still there, by id, and says it is not the canonical one.
    other = service.metrics("syn", run_id=small)
    assert _kl_at_1(other) == pytest.approx(5.0)
    assert (other.json()["run"]["selected_by"], other.json()["run"]["canonical"]) == (
        "run_id", False)
    assert (other.json()["run"]["tokens"], other.json()["run"]["n_sequences"]) == ("npy", 2)
    named = service.metrics("syn", run_id=default).json()["run"]
    assert (named["selected_by"], named["canonical"]) == ("run_id", True)

    # Across models too: /compare reads the canonical run, or the one named.
    compare = service.client.get(f"{V1}/compare", params={
        "metric": "intervention.kl", "component": "drop", "models": "syn"}).json()
    assert compare["models"][0]["run_id"] == default
    assert compare["models"][0]["run"]["selected_by"] == "default"
    chosen = service.client.get(f"{V1}/compare", params={
        "metric": "intervention.kl", "component": "drop", "models": "syn",
        "run_ids": str(small)}).json()
    assert chosen["models"][0]["run_id"] == small
    stages = service.client.get(f"{V1}/stages", params={
        "models": "syn", "metric": "intervention.kl", "component": "drop"}).json()
    assert stages["models"][0]["metric_run_id"] == default
    assert stages["models"][0]["metric_run"]["selected_by"] == "default"


def test_the_default_run_wins_whichever_finished_first(service: Service) -> None:
    small = service.ingest("small", small_run("late", scale=5.0))
    # Until the default run exists, the latest run is read, and the answer says so.
    first = service.metrics("late").json()["run"]
    assert (first["id"], first["selected_by"], first["canonical"]) == (small, "latest", False)
    default = service.ingest("default", default_run("late", service.settings))
    assert service.metrics("late").json()["run"]["id"] == default
    service.ingest("smaller", small_run("late", scale=7.0, n_sequences=1))
    assert service.metrics("late").json()["run"]["id"] == default


def test_every_format_names_its_run(service: Service) -> None:
    default = service.ingest("default", default_run("fmt", service.settings))
    service.ingest("small", small_run("fmt", scale=5.0))
    for fmt in ("csv", "parquet", "arrow", "json"):
        answer = service.metrics("fmt", format=fmt)
        header = answer.headers["X-Strata-Run"]
        assert header.split(";")[0] == str(default), (fmt, header)
        assert "canonical=true" in header
        assert "n_sequences=4" in header
    table = pq.read_table(io.BytesIO(service.metrics("fmt", format="parquet").content))
    context = json.loads(table.schema.metadata[b"strata"])
    assert (context["run"]["id"], context["run"]["selected_by"]) == (default, "default")
    assert context["run"]["n_sequences"] == 4


def test_pin_and_unpin_need_the_key_and_are_audited(service: Service) -> None:
    default = service.ingest("default", default_run("pinme", service.settings))
    small = service.ingest("small", small_run("pinme", scale=5.0))
    body = {"run_id": small, "by": "alice", "note": "the 8-sequence smoke run, on purpose"}

    assert service.client.post(f"{V1}/models/pinme/pins", json=body).status_code == 401
    wrong = service.client.post(f"{V1}/models/pinme/pins", json=body,
                                headers={"X-API-Key": "nope"})
    assert wrong.status_code == 401
    assert service.metrics("pinme").json()["run"]["id"] == default

    pinned = service.client.post(f"{V1}/models/pinme/pins", json=body,
                                 headers={"X-API-Key": KEY})
    assert pinned.status_code == 201, pinned.text
    pins = pinned.json()
    assert [(p["family"], p["run_id"], p["by"]) for p in pins["pins"]] == [
        ("intervention", small, "alice")]
    assert pins["canonical"]["intervention"]["id"] == small
    assert pins["default_run_id"] == default
    answer = service.metrics("pinme")
    assert answer.json()["run"]["id"] == small
    assert (answer.json()["run"]["selected_by"], answer.json()["run"]["canonical"]) == (
        "pinned", True)
    assert "selected_by=pinned" in answer.headers["X-Strata-Run"]
    model = service.client.get(f"{V1}/models/pinme").json()
    assert model["current_run_basis"] == {"intervention": "pinned"}
    assert model["pinned"] == {"intervention": small}

    assert service.client.delete(f"{V1}/models/pinme/pins").status_code == 401
    unpinned = service.client.delete(f"{V1}/models/pinme/pins", params={"family": "intervention"},
                                     headers={"X-API-Key": KEY})
    assert unpinned.status_code == 200, unpinned.text
    assert unpinned.json()["pins"] == []
    assert service.metrics("pinme").json()["run"]["id"] == default

    history = service.client.get(f"{V1}/models/pinme/pins").json()["history"]
    assert [(e["action"], e["run_id"], e["family"]) for e in history] == [
        ("unpin", None, "intervention"), ("pin", small, "intervention")]
    assert history[1]["by"] == "alice"
    assert history[1]["note"] == body["note"]
    assert history[0]["by"] == history[0]["key_id"]  # no name given: the key's id
    assert history[0]["key_id"].startswith("key:")
    assert KEY not in json.dumps(history)
    assert history[0]["at"] >= history[1]["at"]


def test_bad_pins_are_refused_with_what_to_fix(service: Service) -> None:
    key = {"X-API-Key": KEY}
    service.ingest("default", default_run("mine", service.settings))
    theirs = service.ingest("theirs", small_run("theirs", scale=2.0))

    def pin(body: dict[str, Any]) -> Any:
        return service.client.post(f"{V1}/models/mine/pins", json=body, headers=key)

    missing = pin({"run_id": 987654})
    assert missing.status_code == 404
    assert "no run 987654" in missing.json()["detail"]
    foreign = pin({"run_id": theirs})
    assert foreign.status_code == 404
    assert f"run {theirs} is model" in foreign.json()["detail"]
    family = pin({"run_id": service.runs["default"], "families": ["neurons"]})
    assert family.status_code == 422
    assert "did not compute neurons" in family.json()["detail"]
    unknown = pin({"run_id": service.runs["default"], "families": ["nonsense"]})
    assert unknown.status_code == 422
    assert pin({"run_id": "x"}).status_code == 400
    assert pin({"run_id": 1, "extra": 1}).status_code == 400
    assert service.client.post(f"{V1}/models/nobody/pins", json={"run_id": 1},
                               headers=key).status_code == 404
    nothing = service.client.delete(f"{V1}/models/mine/pins", headers=key)
    assert nothing.status_code == 404
    assert "no pinned run" in nothing.json()["detail"]
    wrong_run = service.client.get(f"{V1}/models/mine/metrics",
                                   params={"metric": "intervention.kl", "run_id": theirs})
    assert wrong_run.status_code == 404
    assert service.client.get(f"{V1}/models/mine/pins").json()["history"] == []


def test_pins_are_refused_where_writes_are_off(tmp_path: Path) -> None:
    db = tmp_path / "nokeys.duckdb"
    with Store.open(db, threads=1) as store:
        migrate.upgrade(store)
        settings = _settings(db, keys=" , ")
        run = ingest_result(store, small_run("ro", scale=1.0)).run_id
        with TestClient(create_app(settings, store)) as client:
            refused = client.post(f"{V1}/models/ro/pins", json={"run_id": run},
                                  headers={"X-API-Key": KEY})
            assert refused.status_code == 403
            assert client.delete(f"{V1}/models/ro/pins").status_code == 403


def test_a_store_from_before_pins_answers_as_before(tmp_path: Path) -> None:
    """A database at revision 0007 (before pins), holding a model whose latest run is its
    default run and a model with only a quick run: after `strata db upgrade` both answer from
    the run they answered from before (the old rule: the latest succeeded run)."""
    db = tmp_path / "old.duckdb"
    settings = _settings(db)
    with Store.open(db, threads=1) as store:
        migrate.upgrade(store, "0007")
        ingest_result(store, small_run("kept", scale=5.0))
        default = ingest_result(store, default_run("kept", settings)).run_id
        quick = ingest_result(store, small_run("quick", scale=3.0)).run_id
        migrate.upgrade(store)
        assert migrate.current_revision(store) == migrate.head_revision()
        with TestClient(create_app(settings, store)) as client:
            for model, run, basis in (("kept", default, "default"), ("quick", quick, "latest")):
                answer = client.get(f"{V1}/models/{model}/metrics",
                                    params={"metric": "intervention.kl"}).json()
                assert (answer["run"]["id"], answer["run"]["selected_by"]) == (run, basis)
        assert migrate.downgrade(store, "0007") == "0007"
        assert migrate.upgrade(store) == migrate.head_revision()
