"""The one HTTP conversation with the API that the Python client, the worker's delivery client
and the CLI share: the base URL and key, a connection pool, and when a request is sent again.

What is retried is the caller's `RetryPolicy`, never a guess:

- connection failures (and, where `server_errors`, 5xx answers) only for the `methods` the
  policy names, with a doubling pause, until `attempts` or `deadline_s` runs out; then
  `UnreachableError`. The Python client retries reads only (a lost answer to a write may
  still have applied it); the worker retries its calls, which the API makes idempotent.
- a 429 with `Retry-After` for any method (the refused request did nothing), while the pauses
  add up to at most `rate_limit_wait_s`.

Any other error answer is raised as the `ApiError` of its status (`service.client.errors`).
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import msgspec

from service.client.errors import UnreachableError, api_error, retry_after

log = logging.getLogger("strata.client")

READS = frozenset({"GET", "HEAD"})
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """When a request that got no usable answer is sent again."""

    methods: frozenset[str] = READS
    attempts: int | None = 4  # at most this many sends (None: until the deadline)
    deadline_s: float | None = None  # and no pause that would end past this many seconds
    backoff_s: float = 0.25  # the first pause; then doubled, up to max_backoff_s
    max_backoff_s: float = 10.0
    server_errors: bool = False  # a 5xx answer is retried like a connection failure
    rate_limit_wait_s: float = 60.0
    on_rate_limit: Callable[[float], None] | None = None  # told each 429 pause before it

    def pause(self, failures: int) -> float:
        return min(self.backoff_s * 2 ** (failures - 1), self.max_backoff_s)

    def again(self, method: str, failures: int, elapsed_s: float, pause: float) -> bool:
        """Whether to send once more after `failures` failed sends, `elapsed_s` in."""
        if method not in self.methods:
            return False
        if self.attempts is not None and failures >= self.attempts:
            return False
        return self.deadline_s is None or elapsed_s + pause <= self.deadline_s


NO_RETRY = RetryPolicy(methods=frozenset())


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS context, as httpx would make it (its CA bundle, or the one
    SSL_CERT_FILE / SSL_CERT_DIR name), made on first use and shared by every client: httpx
    otherwise builds a new one, loading the CA bundle, for every client it makes, http:// URLs
    included (39 ms of CPU each; the worker makes one a job, the CLI one a request)."""
    return httpx.create_ssl_context()


class Transport:
    """A connection pool to the API at `url`, sending `api_key` (when given) with every request.

    `transport` replaces httpx's own (tests pass an `httpx.MockTransport`)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            headers=headers,
            transport=transport,
            verify=tls_context(),
        )

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        policy: RetryPolicy = NO_RETRY,
        params: dict[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """The answer of `method path` below 400, after the retries `policy` allows; raises
        `UnreachableError` or the `ApiError` of the answer's status."""
        start, failures, rate_waited = time.monotonic(), 0, 0.0
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        while True:
            try:
                response = self._http.request(
                    method,
                    path,
                    params=params,
                    json=json,
                    content=content,
                    headers=headers,
                    **extra,
                )
            except httpx.RequestError as exc:
                problem, reason = f"{type(exc).__name__}: {exc}", str(exc)
            else:
                if response.status_code == 429:
                    wait = retry_after(response)
                    if wait is not None and rate_waited + wait <= policy.rate_limit_wait_s:
                        if policy.on_rate_limit is not None:
                            policy.on_rate_limit(wait)
                        time.sleep(wait)
                        rate_waited += wait
                        continue
                if not (policy.server_errors and response.status_code >= 500):
                    if response.is_error:
                        raise api_error(response)
                    return response
                problem = reason = f"HTTP {response.status_code}"
            failures += 1
            pause = policy.pause(failures)
            if not policy.again(method, failures, time.monotonic() - start, pause):
                raise UnreachableError(f"{method} {self.url}{path}: {problem}", reason)
            log.info(
                "API %s %s not answered (%s); retrying in %.2f s", method, path, problem, pause
            )
            time.sleep(pause)


def decode(response: httpx.Response, schema: type[T]) -> T:
    """An answer's JSON body as the API's schema `schema` (`service.schemas`)."""
    return msgspec.json.decode(response.content, type=schema)
