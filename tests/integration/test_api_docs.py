"""OpenAPI 3.1 with typed answers; documentation pages that load nothing from another host;
reads that can be made private (settings), checked on an in-process app."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from litestar.testing import TestClient

from service.api.app import create_app
from service.schemas.results import CompareRow, MetricRow, columns
from service.settings import ApiSettings, Settings
from service.store import Store
from tests.integration.api_server import KEY, Api


def test_openapi_describes_the_real_fields(server: Api) -> None:
    schema = server.get("/schema/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    components = schema["components"]["schemas"]
    assert list(components["MetricRow"]["properties"]) == list(columns(MetricRow))
    assert list(components["CompareRow"]["properties"]) == list(columns(CompareRow))
    assert set(components["ErrorBody"]["properties"]) == {"error", "detail", "status"}
    metrics = schema["paths"]["/api/v1/models/{model}/metrics"]["get"]
    assert set(metrics["responses"]["200"]["content"]) == {
        "application/json", "text/csv", "application/vnd.apache.parquet",
        "application/vnd.apache.arrow.stream"}
    assert {"404", "422", "406"} <= set(metrics["responses"])
    assert {p["name"] for p in metrics["parameters"]} >= {
        "model", "metric", "component", "layer_min", "layer_max", "run_id", "format"}
    register = schema["paths"]["/api/v1/models"]["post"]
    assert register["security"] == [{"apiKey": []}]
    assert schema["components"]["securitySchemes"]["apiKey"]["name"] == "X-API-Key"
    ingest = schema["paths"]["/api/v1/runs/ingest"]["post"]
    assert "application/vnd.apache.arrow.stream" in ingest["requestBody"]["content"]


@pytest.mark.parametrize("page", ["/schema", "/schema/swagger", "/schema/redoc"])
def test_docs_pages_need_no_other_host(server: Api, page: str) -> None:
    html = server.get(page).text
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    assert urls, html[:500]
    for url in urls:
        assert not urlparse(url).netloc, f"{page} loads {url} from another host"
        asset = server.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 1000
    assert "googleapis" not in html
    assert "cdn." not in html
    assert "unpkg" not in html


def test_reads_can_be_private(tmp_path: Path) -> None:
    with Store.open(tmp_path / "private.duckdb", threads=1) as store:
        from service.store.migrate import upgrade

        upgrade(store)
        settings = Settings(database=tmp_path / "private.duckdb", api_keys=KEY,
                            api=ApiSettings(public_reads=False))
        with TestClient(create_app(settings, store)) as client:
            assert client.get("/api/v1/models").status_code == 401
            listed = client.get("/api/v1/models", headers={"X-API-Key": KEY})
            assert listed.status_code == 200
            assert listed.json()["total"] == 0
            assert client.get("/api/v1/health").status_code == 200  # liveness stays open
        no_keys = Settings(database=tmp_path / "private.duckdb", api_keys=" , ")
        with TestClient(create_app(no_keys, store)) as client:
            refused = client.post("/api/v1/models", json={"name": "x", "source": "gpt2"},
                                  headers={"X-API-Key": ""})
            assert refused.status_code == 403
            assert "STRATA_API_KEYS" in refused.json()["detail"]


def test_openapi_lists_the_rate_limits_429(tmp_path: Path) -> None:
    """Every operation the rate limit covers lists its 429 with `Retry-After`; the workers'
    protocol, health and metrics (never limited) do not; without limits nothing lists one."""
    with Store.open(tmp_path / "limits.duckdb", threads=1) as store:
        from service.store.migrate import upgrade

        upgrade(store)

        def operations(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
            with TestClient(create_app(settings, store)) as client:
                schema = client.get("/schema/openapi.json").json()
            return {(path, method): op for path, item in schema["paths"].items()
                    for method, op in item.items() if method in {"get", "post", "delete"}}

        limited = operations(Settings(database=tmp_path / "limits.duckdb", api_keys=KEY))
        never = {("/api/v1/health", "get"), ("/api/v1/ready", "get"),
                 ("/api/v1/jobs/reconcile", "post"),
                 *((f"/api/v1/jobs/{{job_id}}/{step}", "post")
                   for step in ("claim", "heartbeat", "fail")),
                 ("/api/v1/workers/heartbeat", "post")}
        assert never <= set(limited), sorted(limited)
        for (path, method), op in limited.items():
            assert ("429" in op["responses"]) == ((path, method) not in never), (path, method)
        for key in [("/api/v1/models/{model}/metrics", "get"), ("/api/v1/models", "post"),
                    ("/api/v1/jobs", "post"), ("/api/v1/jobs/{job_id}", "delete"),
                    ("/api/v1/compare", "get")]:
            refused = limited[key]["responses"]["429"]
            assert "Retry-After" in refused["headers"], key
            assert refused["headers"]["Retry-After"]["schema"]["type"] == "integer"
            assert "ErrorBody" in str(refused["content"]), key
        unlimited = operations(Settings(database=tmp_path / "limits.duckdb", api_keys=KEY,
                                        api=ApiSettings(read_rate_limit="",
                                                        write_rate_limit="")))
        assert not [k for k, op in unlimited.items() if "429" in op["responses"]]
