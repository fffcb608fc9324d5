"""Liveness and readiness (no API key needed, ever)."""

from __future__ import annotations

from litestar import Controller, Response, get

from service.api.ratelimit import NO_RATE_LIMIT
from service.api.respond import ApiContext, errors
from service.schemas.health import Health, Ready


class HealthController(Controller):
    path = "/api/v1"
    tags = ["health"]  # noqa: RUF012

    @get("/health", opt={NO_RATE_LIMIT: True})
    async def health(self) -> Health:
        """Liveness: the process answers."""
        return Health("ok")

    @get("/ready", sync_to_thread=True, responses=errors(), opt={NO_RATE_LIMIT: True})
    def ready(self, ctx: ApiContext) -> Response[Ready]:
        """Readiness: the database answers and its schema is at this code's revision (else
        503 with the same body)."""
        from service.store.migrate import current_revision, head_revision

        head = head_revision()
        try:
            ctx.store.cursor().execute("SELECT 1").fetchall()
            revision = current_revision(ctx.store)
        except Exception:  # any failure to reach the database means "not ready"
            return Response(Ready("unreachable", str(ctx.store.path), None, head), status_code=503)
        status = "ready" if revision == head else "migrations pending"
        return Response(
            Ready(status, str(ctx.store.path), revision, head),
            status_code=200 if revision == head else 503,
        )
