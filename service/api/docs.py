"""OpenAPI 3.1 at /schema/openapi.json, and documentation pages that need no internet.

Litestar's Swagger UI and Redoc pages load their JavaScript from public CDNs by default, which
offline machines and most clusters cannot reach. Here the pages load it from this service: the
assets come from the `openapi-ui-bundles` package (Swagger UI 5, Redoc) and are served under
/static/docs/. No page refers to another host (a test checks it).

`TabularOperation` documents the other formats of a data endpoint's 200 answer (CSV, Parquet,
Arrow IPC) beside its JSON schema, so the schema says what the endpoint can really answer.
`document_rate_limits` adds the 429 answer to every operation the rate limit covers, with its
`Retry-After` header (`LimitedOperation`).
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import RedocRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Schema,
)
from litestar.router import Router
from litestar.static_files import create_static_files_router

from compute.run import CODE_VERSION
from service.api.auth import SECURITY_COMPONENTS
from service.api.formats import MEDIA_TYPES
from service.api.ratelimit import NO_RATE_LIMIT, READS
from service.schemas.errors import ErrorBody

ASSETS = "/static/docs"
_FAVICON = ""  # none rather than Litestar's default, which points at a CDN

DESCRIPTION = """\
Layer-level interpretability results of transformer language models, as computed by Strata.

Every data endpoint answers JSON by default, and CSV, Parquet or Arrow IPC (stream) with the same
columns through `?format=` or the `Accept` header. Errors have one body:
`{"error": ..., "detail": ..., "status": ...}`. Reads are public unless configured otherwise;
writes need an API key in the `X-API-Key` header. Metric names and units: docs/metrics.md.
"""


@dataclass
class LimitedOperation(Operation):
    """An operation whose 429 answer (the rate limit) carries `Retry-After` and
    `RateLimit-Policy`, as `service/api/ratelimit.py` sends them."""

    def __post_init__(self) -> None:
        refused = (self.responses or {}).get("429")
        if isinstance(refused, OpenAPIResponse):
            refused.headers = {
                "Retry-After": OpenAPIHeader(
                    schema=Schema(type=OpenAPIType.INTEGER, minimum=1),
                    description="seconds until the window resets: wait this long, then retry",
                ),
                "RateLimit-Policy": OpenAPIHeader(
                    schema=Schema(type=OpenAPIType.STRING),
                    description="the budget: `<requests>;w=<window seconds>`",
                ),
            }


@dataclass
class TabularOperation(LimitedOperation):
    """An operation whose 200 answer also comes as CSV, Parquet and Arrow IPC."""

    def __post_init__(self) -> None:
        super().__post_init__()
        ok = (self.responses or {}).get("200")
        content = getattr(ok, "content", None)
        if content is None:
            return
        for name, media in MEDIA_TYPES.items():
            if name == "json" or media in content:
                continue
            schema = (
                Schema(type=OpenAPIType.STRING)
                if name == "csv"
                else Schema(type=OpenAPIType.STRING, content_media_type=media)
            )
            content[media] = OpenAPIMediaType(schema=schema)


def document_rate_limits(app: Litestar, *, reads: bool, writes: bool) -> None:
    """Every operation the rate limit can refuse (reads when a read limit is set, writes when a
    write limit is set; never the workers' protocol, marked `NO_RATE_LIMIT`) lists its 429."""
    refused = ResponseSpec(
        data_container=ErrorBody,
        description="too many requests from this client (reads: per address; writes: per API "
        "key): wait the `Retry-After` seconds, then retry; nothing was changed",
        generate_examples=False,
    )
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if not isinstance(handler, HTTPRouteHandler) or not handler.include_in_schema:
                continue
            if handler.opt.get(NO_RATE_LIMIT):
                continue
            limited = reads if handler.http_methods <= READS else writes
            if not limited:
                continue
            handler.responses = {**(handler.responses or {}), 429: refused}
            if handler.operation_class is Operation:
                handler.operation_class = LimitedOperation


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="Strata API",
        version=CODE_VERSION,
        description=DESCRIPTION,
        path="/schema",
        components=Components(security_schemes=SECURITY_COMPONENTS),  # type: ignore[arg-type]
        render_plugins=[
            SwaggerRenderPlugin(
                path=["/", "/swagger"],
                favicon=_FAVICON,
                js_url=f"{ASSETS}/swagger/swagger-ui-bundle.js",
                css_url=f"{ASSETS}/swagger/swagger-ui.css",
                standalone_preset_js_url=f"{ASSETS}/swagger/swagger-ui-standalone-preset.js",
            ),
            RedocRenderPlugin(
                path="/redoc",
                favicon=_FAVICON,
                google_fonts=False,
                js_url=f"{ASSETS}/redoc/redoc.standalone.js",
            ),
        ],
    )


def asset_routers() -> list[Router]:
    from openapi_ui_bundles import redoc, swagger_ui

    return [
        create_static_files_router(
            path=f"{ASSETS}/swagger",
            directories=[swagger_ui.static_path],
            include_in_schema=False,
            name="docs-swagger",
        ),
        create_static_files_router(
            path=f"{ASSETS}/redoc",
            directories=[redoc.static_path],
            include_in_schema=False,
            name="docs-redoc",
        ),
    ]
