"""deploy/prometheus-rules.yml: well-formed alerting rules whose every `strata_*` series is one
the service exposes (read from a real /metrics answer of the app on a DuckDB file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus-rules.yml"
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
            "gauge": [""], "summary": ["_sum", "_count", ""]}


def exposed_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    from service.api.app import create_app
    from service.jobs.board import Board
    from service.jobs.service import JobService
    from service.settings import Settings
    from service.store import Store
    from service.store.migrate import ensure_current

    monkeypatch.setenv("STRATA_DATA_DIR", str(tmp_path / "state"))
    settings = Settings(database=tmp_path / "rules.duckdb")
    with Store.open(settings.database) as store:
        ensure_current(store)

        class NoBroker:
            def send(self, job_id: int, dispatch: int, queue: str = "gpu") -> None: ...

        jobs = JobService(store, settings, NoBroker(), Board(30.0))
        with TestClient(create_app(settings, store, jobs=jobs)) as client:
            text = client.get("/metrics").text
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def test_rules_are_well_formed_and_name_only_exposed_series(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 8
    exposed = exposed_series(tmp_path, monkeypatch)
    assert {"strata_jobs", "strata_workers", "strata_http_requests_total",
            "strata_job_queue_wait_seconds_bucket", "strata_database_bytes"} <= exposed
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
        used = set(re.findall(r"\bstrata_[a-z_]+", expr))
        assert used <= exposed, f"{rule['alert']} names series the service does not expose: " \
                                f"{sorted(used - exposed)}"
