"""The Python client (`service.client`) against a real `strata serve` with its local worker
(tests/integration/web_harness.py): every method, every error path, compared with what the API
itself answers."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pandas as pd
import polars as pl
import pytest

from service.client import (
    ApiError,
    BadRequestError,
    Client,
    ConflictError,
    ForbiddenError,
    Job,
    JobFailedError,
    NotFoundError,
    PandasClient,
    UnauthorizedError,
    UnprocessableError,
    UnreachableError,
    WaitTimeoutError,
    api_error,
)
from tests.integration.web_harness import FAMILY, KEY, MODELS, Service
from tests.serving import free_port

METRIC_COLUMNS = ["metric", "component", "layer", "relative_depth", "value", "stderr", "n",
                  "unit"]


@pytest.fixture(scope="module")
def service(web: Service) -> Service:
    return web


@pytest.fixture
def client(service: Service) -> Iterator[Client]:
    with Client(service.base, api_key=KEY) as opened:
        yield opened  # type: ignore[misc]


@pytest.fixture
def reader(service: Service) -> Iterator[Client]:
    """A client without a key."""
    with Client(service.base) as opened:
        yield opened  # type: ignore[misc]


def raw(service: Service, path: str, **params: Any) -> Any:
    response = service.client.get(f"/api/v1{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_health_models_and_one_model(reader: Client, service: Service) -> None:
    assert reader.health() is True
    models = reader.models()
    assert isinstance(models, pl.DataFrame)
    layers = dict(zip(models["name"].to_list(), models["n_layers"].to_list(), strict=True))
    assert {name: layers[name] for name in MODELS} == MODELS
    assert models.schema["registered_at"] == pl.Datetime("us", "UTC")
    assert len(models) == raw(service, "/models")["total"]
    assert reader.models(name="tiny-4l-s0")["name"].to_list() == ["tiny-4l-s0"]
    assert reader.models(min_layers=3)["n_layers"].min() >= 3  # type: ignore[operator]
    one = reader.model("tiny-2l-s0")
    assert one.n_layers == 2
    assert one.current_run_id is not None
    assert reader.model(one.id).name == "tiny-2l-s0"
    # decoded with the API's own schema: every field of its answer, current runs included
    api = raw(service, "/models/tiny-2l-s0")
    assert set(one.__struct_fields__) == set(api)
    assert reader.current_runs("tiny-2l-s0") == api["current_runs"]
    assert one.current_run_id in one.current_runs.values()


def test_metrics_are_the_api_rows(reader: Client, service: Service) -> None:
    frame = reader.metrics("tiny-4l-s0", "intervention.kl", component="drop")
    api = raw(service, "/models/tiny-4l-s0/metrics", metric="intervention.kl", component="drop")
    assert frame.columns == METRIC_COLUMNS
    assert frame.to_dicts() == api["rows"]
    assert reader.last_context["run"]["id"] == api["run"]["id"]
    assert reader.last_context["model"]["name"] == "tiny-4l-s0"
    every = reader.metrics("tiny-4l-s0", "intervention.kl")
    assert set(every["component"].to_list()) >= {"drop", "swap", "drop_attn", "drop_mlp"}
    pinned = reader.metrics("tiny-4l-s0", "logit_lens.kl_to_final", run_id=api["run"]["id"],
                            layer_min=1, layer_max=2)
    assert pinned["layer"].to_list() == [1, 2]


def test_sequences_are_the_api_rows_and_average_to_the_metric(reader: Client,
                                                              service: Service) -> None:
    samples = reader.sequences("tiny-4l-s0", "intervention.kl", component="drop", layer_max=1)
    api = raw(service, "/models/tiny-4l-s0/sequences", metric="intervention.kl",
              component="drop", layer_max=1)
    assert samples.columns == ["metric", "component", "layer", "head", "sequence", "value",
                               "unit"]
    assert samples.to_dicts() == api["rows"]
    assert sorted(set(samples["layer"].to_list())) == [0, 1]
    per_layer = reader.metrics("tiny-4l-s0", "intervention.kl", component="drop", layer_max=1)
    means = samples.group_by("layer").agg(pl.col("value").mean(), pl.len().alias("n"))
    joined = per_layer.join(means, on="layer", suffix="_samples").sort("layer")
    assert joined["value"].to_list() == pytest.approx(joined["value_samples"].to_list())
    assert joined["n"].to_list() == joined["n_samples"].to_list()


def test_pandas_on_request(service: Service) -> None:
    with PandasClient(service.base) as client:
        frame = client.metrics("tiny-2l-s0", "attention.bos")
        assert isinstance(frame, pd.DataFrame)
        assert list(frame.columns) == METRIC_COLUMNS
        api = raw(service, "/models/tiny-2l-s0/metrics", metric="attention.bos")
        assert frame["value"].tolist() == [r["value"] for r in api["rows"]]
        assert isinstance(client.models(), pd.DataFrame)
        assert isinstance(client.stages(list(MODELS)).boundaries, pd.DataFrame)


def test_heads_compare_neurons(reader: Client, service: Service) -> None:
    heads = reader.heads("tiny-4l-s0", "heads.ablation_kl")
    api = raw(service, "/models/tiny-4l-s0/heads", metric="heads.ablation_kl")
    assert heads.to_dicts() == api["rows"]
    assert reader.heads("tiny-2l-s0")["metric"].unique().to_list() == ["heads.induction"]

    compared = reader.compare(list(MODELS), "intervention.kl", "drop", bins=10)
    assert compared.group_by("model").len().sort("model")["len"].to_list() == [10, 10]
    mean = reader.compare(list(MODELS), "intervention.kl", "drop", bins=10, method="mean")
    api = raw(service, "/compare", metric="intervention.kl", component="drop", bins=10,
              method="mean", models=",".join(MODELS))
    assert mean.to_dicts() == api["rows"]
    assert [m["name"] for m in reader.last_context["models"]] == list(MODELS)

    top = reader.neurons("tiny-4l-s0", "partition", top=3, layer=1)
    assert len(top) == 3
    assert top.schema["promoted"] == pl.List(pl.String)
    api = raw(service, "/models/tiny-4l-s0/neurons", **{"class": "partition", "top": 3,
                                                        "layer": 1})
    assert top["neuron"].to_list() == [r["neuron"] for r in api["rows"]]
    assert top["promoted"].to_list() == [r["promoted"] for r in api["rows"]]
    counts = reader.neuron_counts("tiny-4l-s0")
    assert counts["layer"].to_list() == [0, 1, 2, 3]
    assert "n_prediction" in counts.columns


def test_stages(reader: Client, service: Service) -> None:
    result = reader.stages(list(MODELS), metric="intervention.kl", component="drop")
    assert result.stages.group_by("model").len().sort("model")["len"].to_list() == [4, 4]
    assert result.boundaries.height == 6
    api = raw(service, "/stages", models=",".join(MODELS))
    first = api["models"][0]["boundaries"][0]
    row = result.boundaries.row(0, named=True)
    assert row["rule"] == first["rule"]
    assert json.loads(row["evidence"]) == first["evidence"]
    assert (row["clear"], row["sharpness"]) == (first["clear"], first["sharpness"])
    assert [row["interval_low"], row["interval_high"]] == (first["interval"] or [None, None])
    assert reader.stages("tiny-4l-s0").boundaries["model"].unique().to_list() == ["tiny-4l-s0"]


def test_families_and_stability(reader: Client, service: Service) -> None:
    families = reader.families()
    # the API's list, in its order (the shared service may hold a family another module of its
    # group made, tests/integration/test_dashboard_family.py, whichever ran first)
    assert [f.name for f in families] == [f["name"] for f in raw(service, "/families")]
    assert FAMILY in [f.name for f in families]
    stability = reader.stability(FAMILY)
    metrics = set(stability["metric"].to_list())
    assert {"heads.stability", "heads.stability_null"} <= metrics
    per_layer = stability.filter(pl.col("metric") == "heads.stability")
    assert per_layer["layer"].to_list() == [0, 1, 2, 3]
    per_head = reader.stability(FAMILY, "heads.stability", per_head=True)
    assert per_head["head"].drop_nulls().len() > 0
    # claim (3)'s query, as a frame: the API's rows, column for column
    joined = reader.stability_importance(FAMILY)
    api = raw(service, f"/families/{FAMILY}/stability-importance")
    assert joined.to_dicts() == api["rows"]
    assert joined["layer"].to_list() == [0, 1, 2, 3]
    assert joined.columns[:4] == ["layer", "relative_depth", "n_heads", "pearson"]


def test_runs(reader: Client, service: Service) -> None:
    runs = reader.runs()
    assert len(runs) == raw(service, "/runs")["total"]
    mine = reader.runs(model="tiny-2l-s0", status="succeeded", family="heads")
    assert mine["model"].unique().to_list() == ["tiny-2l-s0"]
    assert mine.schema["finished_at"] == pl.Datetime("us", "UTC")
    # the columns are the schema's (timings spread out), in its order
    assert runs.columns[:4] == ["id", "model_id", "model", "status"]
    assert {"created_at", "started_at", "finished_at", "wall_s", "stderr_basis"} <= set(
        runs.columns)
    first = raw(service, "/runs", limit=1)["items"][0]
    assert runs.row(0, named=True)["config_hash"] == first["config_hash"]


def assert_error(exc: ApiError, response: httpx.Response) -> None:
    """The exception carries the API's error body, unchanged."""
    body = response.json()
    assert (exc.status, exc.error, exc.detail) == (body["status"], body["error"], body["detail"])


def test_read_errors_carry_the_api_body(reader: Client, service: Service) -> None:
    with pytest.raises(NotFoundError) as missing:
        reader.model("no-such-model")
    assert_error(missing.value, service.client.get("/api/v1/models/no-such-model"))
    with pytest.raises(NotFoundError):
        reader.metrics("tiny-4l-s0", "intervention.kl", run_id=999_999)
    with pytest.raises(UnprocessableError) as unknown:
        reader.metrics("tiny-4l-s0", "intervention.nonsense")
    assert "unknown metric" in unknown.value.detail
    with pytest.raises(UnprocessableError):
        reader.metrics("tiny-4l-s0", "intervention.kl", component="sideways")
    with pytest.raises(UnprocessableError):
        reader.metrics("tiny-4l-s0", "neurons.vocab_kurt")
    with pytest.raises(BadRequestError) as bad:
        reader.metrics("tiny-4l-s0", "intervention.kl", layer_min=-1)
    assert bad.value.status == 400
    with pytest.raises(UnprocessableError):
        reader.compare([f"m{i}" for i in range(101)], "intervention.kl")
    with pytest.raises(BadRequestError):
        reader.compare(list(MODELS), "intervention.kl", method="median")
    with pytest.raises(NotFoundError):
        reader.stability("no-such-family")
    with pytest.raises(NotFoundError):
        reader.job(999_999)
    assert isinstance(missing.value, ApiError)
    assert "404" in str(missing.value)


def test_write_errors(reader: Client, client: Client, service: Service) -> None:
    with pytest.raises(UnauthorizedError):
        reader.register("anything", "zoo:tiny-2l-s0")
    with Client(service.base, api_key="wrong") as wrong, pytest.raises(UnauthorizedError):
        wrong.submit("tiny-2l-s0")
    with pytest.raises(UnauthorizedError):
        reader.cancel(1)
    same = client.register("tiny-2l-s0", "zoo:tiny-2l-s0")  # the same registration: 200
    assert same.name == "tiny-2l-s0"
    with pytest.raises(ConflictError):
        client.register("another-name", "zoo:tiny-2l-s0")
    with pytest.raises(UnprocessableError):
        client.register("nowhere", "/not/a/checkpoint/root")
    with pytest.raises(BadRequestError):
        client.register("123", "zoo:tiny-2l-s0")  # names may not be all digits
    with pytest.raises(UnprocessableError, match="register it first"):
        client.submit("no-such-model")
    with pytest.raises(UnprocessableError):
        client.submit("tiny-2l-s0", metrics=["no_such_family"])
    with pytest.raises(BadRequestError):
        client.submit("tiny-2l-s0", n_sequences=0)
    with pytest.raises(UnprocessableError, match="no stored lens"):
        client.submit("tiny-2l-s0", metrics=["tuned_lens"], tuned_lens={"lens": "f" * 16})
    with pytest.raises(BadRequestError, match="steps"):
        client.submit("tiny-2l-s0", metrics=["tuned_lens"], tuned_lens={"steps": 0})


def test_submit_and_wait(client: Client, service: Service) -> None:
    """A job computes a model that had no results; wait() follows it to its run."""
    seen: list[Job] = []
    job = client.submit("fam4l-adamw-s1", metrics=["intervention", "logit_lens"],
                        n_sequences=2, seq_len=16)
    assert job.state in ("queued", "running")
    assert job.families == ["intervention", "logit_lens"]
    assert (job.queue, job.forced) == ("gpu", False)  # the API's Job: every field it answers
    assert set(job.__struct_fields__) == set(raw(service, f"/jobs/{job.id}"))
    done = client.wait(job, timeout=300, poll_s=0.2, on_progress=seen.append)
    assert done.state == "succeeded"
    assert done.run_id is not None
    assert done.finished_at is not None
    assert all(s.state in ("queued", "running") for s in seen)
    kl = client.metrics("fam4l-adamw-s1", "intervention.kl", "drop")
    assert client.last_context["run"]["id"] == done.run_id
    assert kl["layer"].to_list() == [0, 1, 2, 3]
    assert client.job(done.id) == done
    listed = client.jobs(model="fam4l-adamw-s1")
    assert done.id in [j.id for j in listed]
    assert all(j.state == "succeeded" for j in client.jobs(state="succeeded"))
    again = client.wait(done.id)  # a finished job: answered at once
    assert again == done


def test_wait_timeout_then_cancel(client: Client) -> None:
    job = client.submit("tiny-4l-s0", metrics=["intervention", "heads"], n_sequences=64,
                        seq_len=64, force=True)
    with pytest.raises(WaitTimeoutError) as late:
        client.wait(job, timeout=0)
    assert late.value.job.id == job.id
    cancelled = client.cancel(job)
    assert cancelled.state == "cancelled"
    with pytest.raises(JobFailedError) as failed:
        client.wait(job, timeout=60)
    assert failed.value.job.state == "cancelled"


def test_unreachable_service_after_retries() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01) as client:
        with pytest.raises(UnreachableError, match="GET"):
            client.models()
        with pytest.raises(UnreachableError, match="POST"):
            client.submit("x")


def test_reads_retry_connection_errors_and_writes_do_not(service: Service) -> None:
    """A read that meets a dropped connection is sent again; a write is not (it may have been
    applied)."""
    calls: list[str] = []
    upstream = httpx.HTTPTransport()

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) <= 2:
            raise httpx.ConnectError("dropped", request=request)
        return upstream.handle_request(request)

    with Client(service.base, api_key=KEY, backoff_s=0.01,
                transport=httpx.MockTransport(flaky)) as client:
        assert client.health()
        assert calls == ["GET", "GET", "GET"]
        calls.clear()
        with pytest.raises(UnreachableError):
            client.register("x", "zoo:tiny-2l-s0")
        assert calls == ["POST"]
    upstream.close()


def test_error_without_a_json_body() -> None:
    response = httpx.Response(502, text="<html>bad gateway</html>")
    error = api_error(response)
    assert type(error) is ApiError
    assert (error.status, error.error) == (502, "http_502")
    assert "bad gateway" in error.detail
    assert isinstance(api_error(httpx.Response(403, json={"error": "forbidden", "detail": "off",
                                                          "status": 403})), ForbiddenError)


def _response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response off the socket (headers and a Content-Length body); b"" if the
    server closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_an_idle_connection_outlives_a_clients_keep_alive(service: Service) -> None:
    """`strata serve` keeps an idle keep-alive connection open longer than HTTP clients keep
    theirs (httpx: 5 s). At uvicorn's default (5 s) the two expired together, and a request
    sent on a pooled connection as the server closed it was reset ("Connection reset by peer":
    once in the suite). A connection idle for 6 s still gets its answer."""
    host, port = service.base.removeprefix("http://").split(":")
    request = f"GET /api/v1/health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        assert _response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        sock.sendall(request)
        assert _response(sock).startswith(b"HTTP/1.1 200")


def test_https_certificates_are_still_verified(tmp_path: Any) -> None:
    """Every client shares one TLS context (`service.client.transport.tls_context`), made once
    per process: it still refuses a certificate no trusted authority signed (a self-signed one,
    made here by openssl), for every client that uses it, not only the first."""
    import http.server
    import ssl
    import subprocess
    import threading

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_port}"
    try:
        for _ in range(2):
            with (Client(url, retries=1, backoff_s=0.01) as client,
                  pytest.raises(UnreachableError, match="CERTIFICATE_VERIFY_FAILED")):
                client.health()
    finally:
        server.shutdown()
        server.server_close()
