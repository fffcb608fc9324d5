"""HTTP caching of results: ETag and Cache-Control on answers built from finished runs.

A data answer depends on the request (path, query, format) and on the runs it was read from. A
succeeded run's rows change only when the run is ingested again, which sets a new finish time; so
the ETag is a digest of the request and of each run's (id, finish time), computed before the rows
are read. A matching `If-None-Match` is answered 304 without touching the results.

Cache-Control: an answer pinned to a run (`?run_id=`) may be reused for `cache_max_age` seconds;
an answer about a model's *current* run may change when a newer run arrives, so caches must
revalidate it (`no-cache`) — cheap, thanks to the ETag. With private reads, `private`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from litestar import Request

API_VERSION = "v1"


def etag(
    request: Request[Any, Any, Any],
    fmt: str,
    runs: Iterable[tuple[int, datetime | None]],
    also: Iterable[str] = (),
) -> str:
    """The answer's tag: the request, each run's (id, finish time), and `also` (why each run
    was chosen: pinning a run changes the answer's context, not its rows)."""
    # The raw path and query string (cheaper than parsed ones; a reordered query only gets
    # another tag, which is harmless).
    scope = request.scope
    parts = [
        API_VERSION,
        scope["path"],
        scope["query_string"].decode("latin-1"),
        fmt,
        *(f"{run}@{finished.isoformat() if finished else '-'}" for run, finished in runs),
        *also,
    ]
    return 'W/"' + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32] + '"'


def matches(request: Request[Any, Any, Any], tag: str) -> bool:
    """Whether the client's `If-None-Match` names this ETag (weak comparison)."""
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    wanted = tag.removeprefix("W/")
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == wanted:
            return True
    return False


def cache_control(*, pinned: bool, public: bool, max_age: int) -> str:
    scope = "public" if public else "private"
    return f"{scope}, max-age={max_age}" if pinned else f"{scope}, no-cache"
