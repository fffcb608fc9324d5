"""Rate limits: reads per client address, writes per API key.

    GET, HEAD                 `STRATA_API__READ_RATE_LIMIT` per client address
    POST, DELETE, ...         `STRATA_API__WRITE_RATE_LIMIT` per API key (per address for a
                              request without a valid key, so guessing keys is limited too)
    the workers' protocol     never limited: claim, heartbeat, fail, worker heartbeat, beat's
                              reconcile (handlers marked `opt={NO_RATE_LIMIT: True}`) and a
                              delivery (`POST /runs/ingest?job_id=`); health, readiness, metrics

Workers often hold the same key as people (the one-machine default has one key), so they are
exempt by what they call, not by their key: a worker that is refused a heartbeat would lose its
job's lease, and a refused delivery would only be retried later. Those endpoints act only on a
job a worker holds under its current dispatch number, so they give a person nothing to abuse.

Counting is the `limits` library's fixed window in this process's memory (the API is one
process: the database's one writer), O(1) per request. Beyond the budget the answer is 429
with `Retry-After` (seconds until the window resets), which the Python client and `strata
jobs` honour. Behind a reverse proxy the client address is the one uvicorn takes from
`X-Forwarded-For` of a trusted proxy (`FORWARDED_ALLOW_IPS`; 127.0.0.1 by default).
"""

from __future__ import annotations

import hashlib
import math
import time

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter
from litestar.connection import ASGIConnection
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from service.api.auth import key_is_valid, presented_key
from service.api.errors import TooManyRequestsHttpError
from service.settings import Settings

NO_RATE_LIMIT = "no_rate_limit"
READS = frozenset({"GET", "HEAD"})
DELIVERY_PATH = "/api/v1/runs/ingest"


def _rate(text: str) -> RateLimitItem | None:
    return parse(text) if text.strip() else None


class RateLimitMiddleware(ASGIMiddleware):
    scopes = (ScopeType.HTTP,)
    exclude_opt_key = NO_RATE_LIMIT

    def __init__(self, settings: Settings) -> None:
        self.reads = _rate(settings.api.read_rate_limit)
        self.writes = _rate(settings.api.write_rate_limit)
        self.keys = settings.write_keys()
        self.storage = MemoryStorage()
        self.limiter = FixedWindowRateLimiter(self.storage)
        self._counters: dict[tuple[str, str], str] = {}

    @property
    def active(self) -> bool:
        return self.reads is not None or self.writes is not None

    def _who(self, scope: Scope) -> str:
        client = scope.get("client")
        return client[0] if client else "unknown"

    def _writer(self, scope: Scope) -> str:
        key = presented_key(ASGIConnection(scope))
        if key is not None and key_is_valid(key, self.keys):
            return "key:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return "address:" + self._who(scope)

    def _hit(self, item: RateLimitItem, kind: str, who: str) -> bool:
        """`FixedWindowRateLimiter.hit`, with the counter's key (the library's own
        `key_for`) made once per client rather than formatted on every request."""
        key = self._counters.get((kind, who))
        if key is None:
            if len(self._counters) > 100_000:  # many clients seen: start the memo again
                self._counters.clear()
            key = self._counters[(kind, who)] = item.key_for(kind, who)
        return self.storage.incr(key, item.get_expiry()) <= item.amount

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        method = str(scope.get("method", "GET"))
        if method in READS:
            item, kind = self.reads, "read"
            who = self._who(scope) if item is not None else ""
        elif method == "OPTIONS" or (
            scope["path"] == DELIVERY_PATH and b"job_id=" in scope["query_string"]
        ):
            item, kind, who = None, "", ""
        else:
            item, kind = self.writes, "write"
            who = self._writer(scope) if item is not None else ""
        if item is not None and not self._hit(item, kind, who):
            reset = self.limiter.get_window_stats(item, kind, who).reset_time
            wait = max(1, math.ceil(reset - time.time()))
            what = (
                "reads from this address"
                if kind == "read"
                else "writes with this API key"
                if who.startswith("key:")
                else "writes from this address without a valid API key"
            )
            raise TooManyRequestsHttpError(
                f"too many {what}: at most {item.amount} per {item.GRANULARITY.name}; try "
                f"again in {wait} s (Retry-After)",
                headers={
                    "Retry-After": str(wait),
                    "RateLimit-Policy": f"{item.amount};w={item.get_expiry()}",
                },
            )
        await next_app(scope, receive, send)
