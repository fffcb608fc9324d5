"""The Litestar application: routes, errors, formats, docs, compression, CORS.

`create_app(settings, store)` builds the app around a store the caller opened (and closes):
the service process is the database's one writer (docs/store.md), and `strata serve` opens the
file before it starts listening, so a held or outdated database is reported plainly instead of
failing the first request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from litestar import Litestar, Router
from litestar.config.compression import CompressionConfig
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide

from service.api.auth import require_read_access
from service.api.controllers.across import AcrossModelsController
from service.api.controllers.admin import AdminController
from service.api.controllers.dashboard import web_routes
from service.api.controllers.families import FamiliesController
from service.api.controllers.health import HealthController
from service.api.controllers.jobs import JobsController, WorkersController
from service.api.controllers.metrics import metrics
from service.api.controllers.models import ModelsController
from service.api.controllers.runs import RunsController
from service.api.docs import asset_routers, document_rate_limits, openapi_config
from service.api.errors import EXCEPTION_HANDLERS
from service.api.metrics import RequestMetricsMiddleware, ServiceMetrics
from service.api.ratelimit import RateLimitMiddleware
from service.api.respond import ApiContext
from service.jobs.service import JobService
from service.jobs.upkeep import Upkeep
from service.settings import Settings, use_data_dir
from service.store import Store

# Bodies other than an ingest (which reads its own, up to STRATA_API__INGEST_MAX_MB) are small.
MAX_BODY_BYTES = 1 << 20


def create_app(
    settings: Settings,
    store: Store,
    *,
    jobs: JobService | None = None,
    upkeep: Upkeep | None = None,
    on_shutdown: Sequence[Callable[[], None]] = (),
) -> Litestar:
    use_data_dir(settings)
    ctx = ApiContext.build(store, settings, jobs)

    def provide_ctx() -> ApiContext:
        return ctx

    data = Router(
        path="/",
        guards=[require_read_access],
        route_handlers=[
            ModelsController,
            RunsController,
            AcrossModelsController,
            FamiliesController,
            JobsController,
            WorkersController,
        ],
    )
    cors = None
    if settings.api.cors_origins:
        cors = CORSConfig(
            allow_origins=settings.api.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["X-API-Key", "Authorization", "Content-Type", "If-None-Match"],
            expose_headers=["ETag", "X-Strata-Run"],
        )
    limits = RateLimitMiddleware(settings)
    counted = ServiceMetrics(store, jobs)
    app = Litestar(
        # Outermost first: requests refused by the rate limit are counted too.
        middleware=[RequestMetricsMiddleware(counted), *([limits] if limits.active else [])],
        # Logging is the process's business (`strata serve` sends it to its log file): the
        # default config would replace the root logger's handlers with its own console one.
        logging_config=None,
        route_handlers=[
            HealthController,
            AdminController,
            data,
            metrics,
            *asset_routers(),
            *web_routes(),
        ],
        dependencies={"ctx": Provide(provide_ctx, sync_to_thread=False)},
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        openapi_config=openapi_config(),
        compression_config=CompressionConfig(
            backend="gzip", minimum_size=settings.api.gzip_min_bytes, gzip_compress_level=5
        ),
        cors_config=cors,
        state=State({"settings": settings, "ctx": ctx, "metrics": counted}),
        request_max_body_size=MAX_BODY_BYTES,
        on_startup=[upkeep.start] if upkeep is not None else [],
        on_shutdown=[*([upkeep.stop] if upkeep is not None else []), *on_shutdown],
    )
    document_rate_limits(app, reads=limits.reads is not None, writes=limits.writes is not None)
    return app
