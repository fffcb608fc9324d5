"""How `strata jobs ...` and `strata models ...` talk to a running service: one request with
the key from STRATA_API_KEY (or the key file `strata serve` writes), its failures as exit
codes."""

from __future__ import annotations

import time
from typing import Any

import click
import httpx

from service.cli.errors import EXIT_BAD_INPUT, EXIT_UNREACHABLE, fail
from service.settings import get_settings
from service.worker.client import error_detail

url_option = click.option("--url", default=None,
                          help="the service (default: STRATA_API_URL, http://127.0.0.1:8000)")

# How long one command waits out the service's rate limit (429 + Retry-After) before giving up.
RATE_LIMIT_WAIT_S = 60.0


def call(url: str | None, method: str, path: str, **kwargs: Any) -> Any:
    """One request; exits 6 if the service cannot be reached, 2 with the API's message on a
    4xx, 6 on a 503 (the broker is down). A 429 is retried after its Retry-After while the
    waits add up to at most `RATE_LIMIT_WAIT_S`; then it exits 6."""
    settings = get_settings()
    key = settings.client_key()
    headers = {"X-API-Key": key} if key else {}
    waited = 0.0
    while True:
        try:
            answer = httpx.request(method, f"{(url or settings.api_url).rstrip('/')}{path}",
                                   headers=headers, timeout=60, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"the service at {url or settings.api_url} cannot be reached ({exc}); start "
                 "it with `strata serve` or give --url", EXIT_UNREACHABLE)
        pause = _retry_after(answer) if answer.status_code == 429 else None
        if pause is None or waited + pause > RATE_LIMIT_WAIT_S:
            break
        click.echo(f"rate limited by the service; retrying in {pause:g} s", err=True)
        time.sleep(pause)
        waited += pause
    if answer.status_code == 429:
        fail(f"{error_detail(answer)} (HTTP 429)", EXIT_UNREACHABLE)
    if answer.status_code >= 400:
        fail(f"{error_detail(answer)} (HTTP {answer.status_code})",
             EXIT_UNREACHABLE if answer.status_code >= 500 else EXIT_BAD_INPUT)
    return answer.json() if answer.content else None


def _retry_after(answer: httpx.Response) -> float | None:
    try:
        return max(float(answer.headers["Retry-After"]), 0.0)
    except (KeyError, ValueError):
        return None


def service_up(api_url: str) -> bool:
    """Whether a service answers its health check at `api_url` (within 2 s)."""
    try:
        return httpx.get(f"{api_url.rstrip('/')}/api/v1/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
