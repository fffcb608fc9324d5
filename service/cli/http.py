"""How `strata jobs ...`, `strata models ...` and `strata db backup` talk to a running service:
one request on the shared transport (`service.client.transport`) with the key from
STRATA_API_KEY (or the key file `strata serve` writes), its failures as exit codes."""

from __future__ import annotations

from typing import Any

import click
import httpx

from service.cli.errors import EXIT_BAD_INPUT, EXIT_UNREACHABLE, fail
from service.client.errors import ApiError, ClientError, UnreachableError
from service.client.transport import NO_RETRY, RetryPolicy, Transport
from service.settings import get_settings

url_option = click.option(
    "--url", default=None, help="the service (default: STRATA_API_URL, http://127.0.0.1:8000)"
)

# How long one command waits out the service's rate limit (429 + Retry-After) before giving up.
RATE_LIMIT_WAIT_S = 60.0


def _rate_limited(pause: float) -> None:
    click.echo(f"rate limited by the service; retrying in {pause:g} s", err=True)


# Sent once (a command is run again by hand); only a 429 is waited out.
POLICY = RetryPolicy(
    methods=frozenset(), rate_limit_wait_s=RATE_LIMIT_WAIT_S, on_rate_limit=_rate_limited
)


def send(
    url: str,
    method: str,
    path: str,
    *,
    timeout: float = 60.0,
    policy: RetryPolicy = NO_RETRY,
    **kwargs: Any,
) -> httpx.Response:
    """One request to the service at `url` with the CLI's key; the transport's errors raised."""
    transport = Transport(url, get_settings().client_key(), timeout=timeout)
    try:
        return transport.request(method, path, policy=policy, **kwargs)
    finally:
        transport.close()


def call(url: str | None, method: str, path: str, **kwargs: Any) -> Any:
    """One request; exits 6 if the service cannot be reached, 2 with the API's message on a
    4xx, 6 on a 503 (the broker is down). A 429 is retried after its Retry-After while the
    waits add up to at most `RATE_LIMIT_WAIT_S`; then it exits 6."""
    base = url or get_settings().api_url
    try:
        answer = send(base, method, path, policy=POLICY, **kwargs)
    except UnreachableError as exc:
        fail(
            f"the service at {base} cannot be reached ({exc.reason}); start it with "
            "`strata serve` or give --url",
            EXIT_UNREACHABLE,
        )
    except ApiError as exc:
        fail(
            f"{exc.detail} (HTTP {exc.status})",
            EXIT_UNREACHABLE if exc.status == 429 or exc.status >= 500 else EXIT_BAD_INPUT,
        )
    return answer.json() if answer.content else None


def service_up(api_url: str) -> bool:
    """Whether a service answers its health check at `api_url` (within 2 s)."""
    try:
        send(api_url, "GET", "/api/v1/health", timeout=2)
    except ClientError:
        return False
    return True
