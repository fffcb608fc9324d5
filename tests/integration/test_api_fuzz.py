"""Hostile and random input: a property-based run over the OpenAPI schema (schemathesis) finds
no 5xx and answers that match the schema; SQL-injection and path-traversal strings in every
string parameter get a 4xx or an empty answer, never an error and never data."""

from __future__ import annotations

import contextlib
import functools
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from tests.integration.api_server import KEY, V1, Api


@functools.cache
def _schemathesis() -> Any:
    """schemathesis, imported where it is used (with Faker it costs each test process seconds
    of collection), its Arrow serializer registered once."""
    import schemathesis

    @schemathesis.serializer("application/vnd.apache.arrow.stream")
    def _arrow_body(ctx: Any, value: Any) -> bytes:
        """Generated ingest bodies (random strings) go out as bytes: the server must refuse
        them."""
        return value if isinstance(value, bytes) else str(value).encode()

    return schemathesis


HOSTILE = [
    "' OR '1'='1", "'; DROP TABLE results; --", "1; SELECT * FROM models", "\" OR \"\"=\"",
    "rand-3l' --", "1 UNION SELECT id, name FROM models", "%", "_", "*", "')) OR 1=1 --",
    "../../../../etc/passwd", "..%2F..%2Fetc%2Fpasswd", "/etc/passwd", "..\\..\\windows",
    "%00", "\x00", "rand-3l\x00", "😀", "a" * 5000, "${jndi:ldap://x}", "{{7*7}}",
]


def test_schema_fuzz_finds_no_server_error(server: Api) -> None:
    """Every operation, with generated valid and invalid input, with a valid write key: no 5xx,
    and every answer matches the schema (status, content type, body)."""
    schemathesis = _schemathesis()
    schema = schemathesis.openapi.from_url(f"{server.base}/schema/openapi.json")
    schema.config.base_url = server.base
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:
        _fuzz(operation, schemathesis.GenerationMode.POSITIVE, server.base)
        with contextlib.suppress(Unsatisfiable):  # nothing to make invalid: no input
            _fuzz(operation, schemathesis.GenerationMode.NEGATIVE, server.base)


def _fuzz(operation: Any, mode: Any, base: str) -> None:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=8, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        response = case.call(base_url=base, headers={"X-API-Key": KEY})
        assert response.status_code < 500, (operation.label, case.path_parameters,
                                            case.query, response.text[:300])
        case.validate_response(response, checks=[not_a_server_error,
                                                  response_schema_conformance,
                                                  content_type_conformance,
                                                  status_code_conformance])

    run()


# (path template, string parameters in the query)
ENDPOINTS: list[tuple[str, dict[str, str]]] = [
    (f"{V1}/models", {"family": "", "source": "", "architecture": "", "name": ""}),
    (f"{V1}/models/{{x}}", {}),
    (f"{V1}/models/{{x}}/metrics", {"metric": "intervention.kl", "component": "drop",
                                    "metric_version": "1"}),
    (f"{V1}/models/{{x}}/heads", {"metric": "heads.induction", "metric_version": "1"}),
    (f"{V1}/models/{{x}}/neurons", {"class": "prediction", "metric_version": "1"}),
    (f"{V1}/models/{{x}}/neurons/counts", {"metric_version": "1"}),
    (f"{V1}/models/{{x}}/stages", {"metric": "intervention.kl", "component": "drop"}),
    (f"{V1}/compare", {"metric": "intervention.kl", "component": "drop", "models": "stagey",
                       "method": "mean", "metric_version": "1"}),
    (f"{V1}/stages", {"models": "stagey", "metric": "intervention.kl", "component": "drop"}),
    (f"{V1}/models/{{x}}/pruning-plan", {"metric_version": "1"}),
    (f"{V1}/pruning-scores", {"models": "stagey", "predictor": "block_influence",
                              "metric_version": "1"}),
    (f"{V1}/runs", {"model": "stagey", "status": "succeeded", "family": "intervention",
                    "metric_version": "1"}),
    (f"{V1}/families/{{x}}", {}),
    (f"{V1}/families/{{x}}/stability", {"metric": "heads.stability", "metric_version": "1"}),
]


def _data_rows(body: Any) -> int:
    if isinstance(body, dict):
        for key in ("rows", "items"):
            if key in body:
                return len(body[key])
    return len(body) if isinstance(body, list) else 0


def test_injection_and_traversal_strings_are_refused_or_empty(server: Api) -> None:
    before = server.get(f"{V1}/models", params={"limit": 500}).json()["total"]
    checked = 0
    for path, params in ENDPOINTS:
        for bad in HOSTILE:
            targets: list[tuple[str, dict[str, str]]] = []
            if "{x}" in path:
                targets.append((path.replace("{x}", quote(bad, safe="")),
                                {**params} if "stages" not in path else {}))
            else:
                targets.append((path, {}))
            for name in params:
                base = path.replace("{x}", "stagey" if "families" not in path else "tiny-4l")
                targets.append((base, {**params, name: bad}))
            for url, query in targets:
                response = server.get(url, params=query)
                checked += 1
                assert response.status_code < 500, (url, query, response.text)
                if response.status_code == 200:
                    assert _data_rows(response.json()) == 0 or not _mentions(query, bad), (
                        url, query, response.text[:300])
                else:
                    body = response.json()
                    assert set(body) == {"error", "detail", "status"}, body
                    assert body["status"] == response.status_code
    assert checked > 300
    assert server.get(f"{V1}/models", params={"limit": 500}).json()["total"] == before
    assert server.get(f"{V1}/ready").status_code == 200  # and the database is still there


def _mentions(query: dict[str, str], bad: str) -> bool:
    """A hostile string in a filter that still returned data would mean it matched."""
    return bad in query.values()


def test_every_error_has_the_one_body(server: Api) -> None:
    cases = [("GET", "/nowhere", 404), ("DELETE", f"{V1}/models", 405),
             ("GET", f"{V1}/models/stagey/metrics", 400),  # metric is required
             ("GET", f"{V1}/models/stagey/metrics?metric=intervention.kl&component=sideways",
              422),
             ("GET", f"{V1}/models/stagey/metrics?metric=intervention.kl&layer_min=3&"
                     "layer_max=1", 422),
             ("POST", f"{V1}/models", 401)]
    for method, url, status in cases:
        response = server.client.request(method, url)
        assert response.status_code == status, (url, response.text)
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert set(body) == {"error", "detail", "status"}
        assert body["status"] == status
