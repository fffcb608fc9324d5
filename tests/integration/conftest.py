"""Shared fixtures of the integration tests: a real computed run of a tiny random model, and a
results store on a real DuckDB file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from compute.metrics.base import EngineOptions
from compute.models import ModelSpec
from compute.run import RunConfig, RunResult, compute_run
from compute.tokens import TokenSpec
from service.store import Store
from service.store.migrate import upgrade

if TYPE_CHECKING:
    from tests.integration.api_server import Api
    from tests.integration.web_harness import Service as WebService

TINY_ARCHITECTURE = dict(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=100,
                         n_ctx=64, act_fn="gelu_new", normalization_type="LN")


@pytest.fixture(scope="session")
def run_result(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """All metric families of a 3-layer random model on 6 sequences of 16 tokens (a few s)."""
    tmp = tmp_path_factory.mktemp("tokens")
    np.save(tmp / "t.npy", np.random.default_rng(0).integers(1, 100, (6, 16)))
    spec = ModelSpec(source="random", name="rand-3l", architecture=TINY_ARCHITECTURE, seed=1)
    config = RunConfig(model=spec,
                       tokens=TokenSpec(source="npy", path=str(tmp / "t.npy"), n_sequences=0,
                                        seq_len=0),
                       options=EngineOptions(induction_n=8, induction_sequences=2))
    return compute_run(config)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "strata.duckdb"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    """A store at the newest schema on a fresh DuckDB file."""
    with Store.open(db_path, threads=1) as opened:
        upgrade(opened)
        yield opened


@pytest.fixture(scope="session")
def server(run_result: RunResult) -> Iterator[Api]:
    """The `strata serve` process of the API tests: one per session, seeded once, stopped when
    the session ends."""
    from tests.integration.api_server import start_api

    api = start_api(run_result)
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(scope="session")
def web() -> Iterator[WebService]:
    """The service behind the dashboard and client tests (tests/integration/web_harness.py):
    one per session, stopped when the session ends."""
    from tests.integration.web_harness import start_web_service

    service = start_web_service()
    try:
        yield service
    finally:
        service.stop()
