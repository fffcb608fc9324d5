"""What talking to the Strata API can raise: one tree for the Python client, the worker's
delivery client and the CLI (`service.cli.http` turns it into exit codes).

    ClientError
    ├── ApiError              the API answered an error: .status, .error, .detail (its body)
    │   ├── BadRequestError       400    ├── ConflictError          409
    │   ├── UnauthorizedError     401    ├── UnprocessableError     422
    │   ├── ForbiddenError        403    ├── RateLimitedError       429 (.retry_after)
    │   └── NotFoundError         404    └── UnavailableError       503
    ├── UnreachableError      no answer, after the retries its policy allows (.reason)
    ├── JobFailedError        Client.wait(): the job failed or was cancelled (.job)
    └── WaitTimeoutError      Client.wait(): the job had not finished in time (.job)

An `ApiError` below 500 is final: the same request will be refused again.
"""

from __future__ import annotations

import httpx
import msgspec

from service.schemas.errors import ErrorBody
from service.schemas.jobs import Job


class ClientError(Exception):
    """Anything talking to the API raises."""


class ApiError(ClientError):
    """The API answered with an error; carries its body `{error, detail, status}`."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class BadRequestError(ApiError):
    pass


class UnauthorizedError(ApiError):
    pass


class ForbiddenError(ApiError):
    pass


class NotFoundError(ApiError):
    pass


class ConflictError(ApiError):
    pass


class UnprocessableError(ApiError):
    pass


class UnavailableError(ApiError):
    pass


class RateLimitedError(ApiError):
    """429: over the service's rate limit for longer than the caller waits; `.retry_after`
    is the number of seconds the service asked for."""

    retry_after: float | None = None


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableError,
    429: RateLimitedError,
    503: UnavailableError,
}


class UnreachableError(ClientError):
    """The service could not be reached (or kept answering 5xx, for callers that retry those);
    `.reason` says what happened last."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class JobFailedError(ClientError):
    """A waited-for job ended failed or cancelled."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} ({job.model}) {job.state}: {job.error or 'no error given'}")
        self.job = job


class WaitTimeoutError(ClientError):
    """A waited-for job had not finished in time."""

    def __init__(self, job: Job, timeout: float) -> None:
        super().__init__(f"job {job.id} ({job.model}) still {job.state} after {timeout:g} s")
        self.job = job


def api_error(response: httpx.Response) -> ApiError:
    """The exception for an error answer, from its `ErrorBody` (or its text when it has none)."""
    try:
        body = msgspec.json.decode(response.content, type=ErrorBody)
        error, detail = body.error, body.detail
    except msgspec.DecodeError:
        error, detail = f"http_{response.status_code}", response.text[:500]
    cls = _BY_STATUS.get(response.status_code, ApiError)
    exc = cls(response.status_code, error, detail)
    if isinstance(exc, RateLimitedError):
        exc.retry_after = retry_after(response)
    return exc


def retry_after(response: httpx.Response) -> float | None:
    """The seconds of a `Retry-After` header (the API sends whole seconds), or None."""
    try:
        return max(float(response.headers["Retry-After"]), 0.0)
    except (KeyError, ValueError):
        return None
