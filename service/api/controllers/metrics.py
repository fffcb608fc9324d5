"""GET /metrics: the Prometheus exposition of the service (service/api/metrics.py)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.api.auth import require_read_access
from service.api.ratelimit import NO_RATE_LIMIT


@get(
    "/metrics",
    sync_to_thread=True,
    include_in_schema=False,
    guards=[require_read_access],
    opt={NO_RATE_LIMIT: True},
)
def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Requests, jobs, workers, ingest and the database's size, in Prometheus's text format.
    Open like the other reads (with `STRATA_API__PUBLIC_READS=false` it needs a key, which
    Prometheus sends as `authorization: {credentials: KEY}`)."""
    body = generate_latest(request.app.state.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
