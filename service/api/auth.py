"""API keys: writes always need one, reads only when `STRATA_API__PUBLIC_READS=false`.

A key travels in the `X-API-Key` header (or `Authorization: Bearer <key>`). Keys come from
`STRATA_API_KEYS` (comma-separated). The given key is compared with every configured key, each
through SHA-256 and `hmac.compare_digest`, without stopping at a match: the time taken says
neither which key matched nor how much of one did.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi.spec import SecurityScheme

from service.api.errors import ForbiddenHttpError, UnauthorizedHttpError
from service.settings import Settings

API_KEY_HEADER = "X-API-Key"
SECURITY_SCHEME = "apiKey"
SECURITY_COMPONENTS = {
    SECURITY_SCHEME: SecurityScheme(
        type="apiKey",
        name=API_KEY_HEADER,
        security_scheme_in="header",
        description="a key from STRATA_API_KEYS (also accepted as `Authorization: Bearer <key>`)",
    )
}
SECURITY: list[dict[str, list[str]]] = [{SECURITY_SCHEME: []}]
_CHALLENGE = {"WWW-Authenticate": f'ApiKey header="{API_KEY_HEADER}"'}


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def key_is_valid(given: str, keys: tuple[str, ...]) -> bool:
    """Constant-time membership: every key is compared, whatever matched before."""
    given_digest = _digest(given)
    valid = False
    for key in keys:
        valid |= hmac.compare_digest(given_digest, _digest(key))
    return valid


def presented_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    key = connection.headers.get(API_KEY_HEADER)
    if key:
        return key
    scheme, _, token = connection.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_id(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The audit log's name for the key a write came with: `key:` and the first 12 hex digits
    of its SHA-256 (which key, never the key itself)."""
    key = presented_key(connection) or ""
    return "key:" + _digest(key).hex()[:12]


def check_key(connection: ASGIConnection[Any, Any, Any, Any], settings: Settings) -> None:
    keys = settings.write_keys()
    if not keys:
        raise ForbiddenHttpError(
            "this service accepts no API keys (STRATA_API_KEYS is empty), so it "
            "takes no writes and, with private reads, no reads"
        )
    key = presented_key(connection)
    if key is None:
        raise UnauthorizedHttpError(
            f"this needs an API key in the {API_KEY_HEADER} header", headers=_CHALLENGE
        )
    if not key_is_valid(key, keys):
        raise UnauthorizedHttpError("the API key is not valid", headers=_CHALLENGE)


def _settings(connection: ASGIConnection[Any, Any, Any, Any]) -> Settings:
    settings: Settings = connection.app.state.settings
    return settings


async def require_write_key(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard of every write. (Guards are coroutines: Litestar runs a plain function guard in a
    worker thread, a hop that costs more than the check.)"""
    check_key(connection, _settings(connection))


async def require_read_access(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard of every read: open unless reads are configured private."""
    settings = _settings(connection)
    if not settings.api.public_reads:
        check_key(connection, settings)
