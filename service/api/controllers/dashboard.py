"""The dashboard: the page at `/`, its assets under /static/web/ and the libraries it uses under
/static/vendor/ (files in `service/web/`).

The page is static: everything it shows it reads from the public API endpoints, in the browser
(no second query path). Its charting library (plotly.js, cartesian bundle, MIT) is vendored in
`service/web/vendor/` and served from here, so the page works with no network.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Controller, Response, get
from litestar.datastructures import CacheControlHeader
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


def web_routes() -> list[type[Controller] | Router]:
    """The page and its assets. The page's own assets revalidate (ETag) so a new version shows
    at once; vendored libraries carry their version in their file name, so browsers keep them
    (and their compiled code) for a year."""
    return [DashboardController,
            create_static_files_router(path=ASSETS, directories=[WEB / "static"],
                                       include_in_schema=False, name="dashboard-assets",
                                       cache_control=CacheControlHeader(no_cache=True)),
            create_static_files_router(path=VENDOR, directories=[WEB / "vendor"],
                                       include_in_schema=False, name="dashboard-vendor",
                                       cache_control=CacheControlHeader(
                                           public=True, max_age=365 * 24 * 3600,
                                           immutable=True))]
