"""Errors of the job system, under the tree of `compute.errors`:

    StrataError
    └── JobError
        ├── JobNotFoundError         no such job                               (HTTP 404)
        ├── JobConflictError         the job is not in a state that allows it  (HTTP 409)
        └── BrokerUnavailableError   the broker cannot be reached: nothing queued (HTTP 503)

Bad submissions (unknown model, family, seq_len beyond the context, a device no worker has) are
`SpecError`s (HTTP 422), raised before anything is stored or sent.
"""

from __future__ import annotations

from compute.errors import StrataError


class JobError(StrataError):
    """The job system refused or could not do what was asked."""


class JobNotFoundError(JobError):
    """No job has this id."""


class JobConflictError(JobError):
    """The job's state does not allow this (cancel a finished job, start a stale dispatch)."""


class BrokerUnavailableError(JobError):
    """The broker did not take the message; nothing was queued."""
