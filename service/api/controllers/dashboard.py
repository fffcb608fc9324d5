"""The dashboard: the page at `/` and a refit family's page at `/family`, their assets under
/static/web/ and the libraries they use under /static/vendor/ (files in `service/web/`).

The page is static: everything it shows it reads from the public API endpoints, in the browser
(no second query path). Its charting library (plotly.js, cartesian bundle, MIT) is vendored in
`service/web/vendor/` and served from here, so the page works with no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Controller, Request, Response, get
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import NotFoundException
from litestar.router import Router
from litestar.static_files import create_static_files_router

WEB = Path(__file__).resolve().parents[2] / "web"
ASSETS = "/static/web"
VENDOR = "/static/vendor"


class DashboardController(Controller):
    path = "/"
    include_in_schema = False

    @get("/", cache_control=CacheControlHeader(no_cache=True))
    async def page(self) -> Response[bytes]:
        """The dashboard page (read from disk on each request: it is small)."""
        return Response((WEB / "index.html").read_bytes(), media_type="text/html; charset=utf-8")

    @get("/family", cache_control=CacheControlHeader(no_cache=True))
    async def family_page(self) -> Response[bytes]:
        """A refit family's page (`?name=`): members, stability per layer against the null,
        per head, against importance, and its stability job's progress."""
        return Response((WEB / "family.html").read_bytes(), media_type="text/html; charset=utf-8")


YEAR = 365 * 24 * 3600
VENDOR_FILES = frozenset(p.name for p in (WEB / "vendor").iterdir() if p.is_file())


def _vendor_key(request: Request[Any, Any, Any]) -> str:
    gzip = "gzip" in request.headers.get("accept-encoding", "")
    return f"strata-vendor:{request.url.path}:{'gzip' if gzip else 'identity'}"


class VendorController(Controller):
    """Vendored libraries. Their file names carry their version, so browsers may keep them (and
    their compiled code) for a year. The answer is kept in the response cache after its first
    request: plotly.js is 1.5 MB, and gzipping it anew for every first visit would hold up the
    API requests the page makes meanwhile."""

    path = VENDOR
    include_in_schema = False

    @get(
        "/{name:str}",
        cache=YEAR,
        cache_key_builder=_vendor_key,
        cache_control=CacheControlHeader(public=True, max_age=YEAR, immutable=True),
    )
    async def asset(self, name: str) -> Response[bytes]:
        if name not in VENDOR_FILES:
            raise NotFoundException(f"no asset {name!r}")
        media = "text/javascript" if name.endswith(".js") else "text/plain"
        return Response((WEB / "vendor" / name).read_bytes(), media_type=media)


def web_routes() -> list[type[Controller] | Router]:
    """The page, its assets (revalidated by ETag, so a new version shows at once) and the
    vendored libraries."""
    return [
        DashboardController,
        VendorController,
        create_static_files_router(
            path=ASSETS,
            directories=[WEB / "static"],
            include_in_schema=False,
            name="dashboard-assets",
            cache_control=CacheControlHeader(no_cache=True),
        ),
    ]
