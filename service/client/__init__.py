"""A typed Python client of the Strata API for downstream tools: results as Polars (or pandas)
DataFrames read from the API's Arrow IPC answers, everything else decoded with the API's own
schemas (`service.schemas`, msgspec), jobs submitted and waited for.

    >>> from service.client import Client
    >>> client = Client("http://127.0.0.1:8000", api_key="...")     # the key only for writes
    >>> client.models()                                   # doctest: +SKIP
    >>> client.current_runs("tiny-4l-s0")                 # doctest: +SKIP
    {'intervention': 3, 'logit_lens': 3, ...}
    >>> kl = client.metrics("tiny-4l-s0", "intervention.kl", component="drop")  # doctest: +SKIP
    >>> job = client.submit("tiny-4l-s0", metrics=["intervention"], n_sequences=8)  # doctest: +SKIP
    >>> client.wait(job).run_id                           # doctest: +SKIP

`PandasClient` has the same methods and answers pandas DataFrames. Every data table has exactly
the columns of the API's CSV / Parquet / Arrow answer (docs/api.md); the context of the last data
answer (model, run, ...) is in `client.last_context`. Models, runs and jobs are the API's
`Model`, `Run` and `Job` (their tables: the fields a column can hold).

    __init__.py   the public names
    clients.py    Client, PandasClient: the API's reads and writes
    frames.py     lists of schema objects as DataFrames typed from the schema
    transport.py  the HTTP conversation and its retry policies (shared with the worker, the CLI)
    errors.py     the exception tree (drawn there)

Reads (GET, HEAD) are retried on connection errors with a growing pause; writes never are (a
lost answer may still have applied them). A 429 (over the service's rate limit) is waited out
and retried, reads and writes alike (the refused request did nothing), as long as its
`Retry-After` fits in what is left of `rate_limit_wait_s` (60 s per call by default); past that
it is raised as `RateLimitedError`.

Installed with the project (`pip install strata`, or `pip install -e .` from a checkout); it
loads neither torch, TransformerLens nor `compute`.
"""

from service.client.clients import (
    BaseClient,
    Client,
    PandasClient,
    PruningPlanResult,
    StagesResult,
)
from service.client.errors import (
    ApiError,
    BadRequestError,
    ClientError,
    ConflictError,
    ForbiddenError,
    JobFailedError,
    NotFoundError,
    RateLimitedError,
    UnauthorizedError,
    UnavailableError,
    UnprocessableError,
    UnreachableError,
    WaitTimeoutError,
    api_error,
)
from service.schemas.families import Family
from service.schemas.jobs import Job, JobProgress
from service.schemas.models import Model, ModelDetail
from service.schemas.runs import Run

__all__ = [
    "ApiError",
    "BadRequestError",
    "BaseClient",
    "Client",
    "ClientError",
    "ConflictError",
    "Family",
    "ForbiddenError",
    "Job",
    "JobFailedError",
    "JobProgress",
    "Model",
    "ModelDetail",
    "NotFoundError",
    "PandasClient",
    "PruningPlanResult",
    "RateLimitedError",
    "Run",
    "StagesResult",
    "UnauthorizedError",
    "UnavailableError",
    "UnprocessableError",
    "UnreachableError",
    "WaitTimeoutError",
    "api_error",
]
