"""Errors of the HTTP API, and the one place where every error becomes a response.

    StrataError                       (compute.errors)
    └── HttpError                      refused by the API; carries its HTTP status
        ├── BadRequestHttpError          400  a parameter the schema cannot check is malformed
        ├── UnauthorizedHttpError        401  no API key, or a wrong one
        ├── ForbiddenHttpError           403  writes are switched off (no keys configured)
        ├── NotFoundHttpError            404  no such model, run or family; no results for it
        ├── NotAcceptableHttpError       406  none of the formats the client accepts
        ├── ConflictHttpError            409  the request contradicts what is stored
        ├── PayloadTooLargeHttpError     413  an ingest body over the configured size
        ├── UnprocessableHttpError       422  well-formed but meaningless (unknown metric, ...)
        ├── TooManyRequestsHttpError     429  over a rate limit; `Retry-After` says when
        └── ServiceUnavailableHttpError  503  a part of the service it needs is not running

Every error answer has one body, `{"error": <code>, "detail": <what to fix>, "status": <int>}`
(`ErrorBody`). Other exceptions are mapped in `exception_handlers`: Litestar's own HTTP
exceptions keep their status (400 for a parameter or body that fails the schema, 404 for an
unknown path, 405, and 413, whose detail names the route's body limit); `SpecError` (an
`IngestError` or `RegistrationError` too) is 422; a `ModelConflictError` (a model registered
under another name) 409; `FamilyConflictError` (a refit family of that name exists) 409 and
`FamilyNotFoundError` 404; the job errors (`service.jobs.errors`) 404, 409 and 503;
`DatabaseHeldError` 503; a write that failed because the disk is full 507 (Insufficient
Storage: rolled back, nothing stored); any other exception is a 500 whose detail says nothing
about internals (it is logged instead).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from compute.errors import SpecError, StrataError
from service.schemas.errors import ErrorBody
from service.store.errors import (
    DatabaseHeldError,
    FamilyConflictError,
    FamilyNotFoundError,
    ModelConflictError,
)

log = logging.getLogger("strata.api")


class HttpError(StrataError):
    status = 500

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class BadRequestHttpError(HttpError):
    status = 400


class UnauthorizedHttpError(HttpError):
    status = 401


class ForbiddenHttpError(HttpError):
    status = 403


class NotFoundHttpError(HttpError):
    status = 404


class NotAcceptableHttpError(HttpError):
    status = 406


class ConflictHttpError(HttpError):
    status = 409


class PayloadTooLargeHttpError(HttpError):
    status = 413


class UnprocessableHttpError(HttpError):
    status = 422


class TooManyRequestsHttpError(HttpError):
    status = 429


class ServiceUnavailableHttpError(HttpError):
    status = 503


def error_code(status: int) -> str:
    """`not_found`, `unprocessable_content`, ...: the HTTP reason, as a stable identifier."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    return phrase.lower().replace(" ", "_").replace("-", "_")


def error_response(
    status: int, detail: str, headers: dict[str, str] | None = None
) -> Response[bytes]:
    body = msgspec.json.encode(ErrorBody(error_code(status), detail, status))
    return Response(
        body, status_code=status, media_type="application/json", headers=headers or None
    )


def _validation_detail(exc: ValidationException) -> str:
    extra = exc.extra if isinstance(exc.extra, list) else []
    parts = []
    for item in extra[:3]:
        if not isinstance(item, dict):
            continue
        where = " ".join(
            str(getattr(item[k], "value", item[k])) for k in ("source", "key") if item.get(k)
        )
        message = str(item.get("message", "")).strip()
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or str(exc.detail)


def body_too_large(limit_bytes: int | None, setting: str | None = None) -> str:
    """The detail of a 413: the limit the body passed, so the client knows what fits."""
    if not limit_bytes:
        return "the request body is too large"
    if limit_bytes % 2**20 == 0:
        size = f"{limit_bytes // 2**20} MiB"
    elif limit_bytes % 2**10 == 0:
        size = f"{limit_bytes // 2**10} KiB"
    else:
        size = f"{limit_bytes} bytes"
    return f"request body exceeds the {size} limit" + (f" ({setting})" if setting else "")


def _body_limit(request: Request[Any, Any, Any]) -> int | None:
    """The body limit of the route a request reached (the app's, unless the route sets one)."""
    try:
        return request.route_handler.resolve_request_max_body_size()
    except Exception:  # no route resolved: the limit is not known here
        return None


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        detail = _validation_detail(exc)
    elif status == 413:
        detail = body_too_large(_body_limit(request))
    elif status >= 500:
        log.error("HTTP %s: %s", status, exc.detail)
        detail = "internal error"
    else:
        detail = str(exc.detail)
    return error_response(status, detail, dict(exc.headers or {}))


def handle_http_error(_: Request[Any, Any, Any], exc: HttpError) -> Response[bytes]:
    return error_response(exc.status, exc.detail, exc.headers)


def handle_strata_error(request: Request[Any, Any, Any], exc: StrataError) -> Response[bytes]:
    from service.jobs.errors import BrokerUnavailableError, JobConflictError, JobNotFoundError

    if isinstance(exc, SpecError):
        return error_response(422, str(exc))
    for kind, status in (
        (ModelConflictError, 409),
        (FamilyConflictError, 409),
        (FamilyNotFoundError, 404),
        (JobNotFoundError, 404),
        (JobConflictError, 409),
        (BrokerUnavailableError, 503),
    ):
        if isinstance(exc, kind):
            return error_response(status, str(exc))
    if isinstance(exc, DatabaseHeldError):
        return error_response(503, "the database is not available")
    return handle_internal_error(request, exc)


def handle_internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    from service.store.backup import is_disk_full

    if is_disk_full(exc):  # the write was rolled back; what is stored stays intact
        log.error("disk full on %s %s: %s", request.method, request.url.path, exc)
        return error_response(
            507,
            "the database's disk is full: nothing was stored and what "
            "was stored before is intact; retry once space is freed",
        )
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error: the service logged the cause")


EXCEPTION_HANDLERS: dict[type[Exception], Any] = {
    HTTPException: handle_http_exception,
    HttpError: handle_http_error,
    StrataError: handle_strata_error,
    Exception: handle_internal_error,
}
