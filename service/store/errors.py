"""Errors of the results store. They extend the tree of `compute.errors`:

    StrataError
    └── StoreError                    anything the store refuses or cannot do
        ├── DatabaseHeldError         another process holds the DuckDB file (CLI exit 5)
        ├── SchemaOutOfDateError      the file's schema is not the one this code expects
        ├── RevisionError (SpecError) no such migration revision (CLI exit 2)
        ├── RegistrationError (SpecError)  a model that cannot be registered: unknown source,
        │                             weights outside the checkpoint roots or that do not load
        │                             (CLI exit 2, HTTP 422)
        ├── ModelConflictError        the same model is registered already under another name
        │                             (CLI exit 2, HTTP 409)
        ├── FamilyError (SpecError)   a refit family that cannot be made or changed so: one
        │                             member, unknown models, members of different
        │                             architectures, the anchor removed (HTTP 422)
        ├── FamilyNotFoundError       no refit family has this name (HTTP 404)
        ├── FamilyConflictError       a refit family of this name exists already (HTTP 409)
        └── IngestError (SpecError)   malformed results: refused, nothing stored (CLI exit 2)
            └── RunNotFoundError      results delivered for a run that does not exist

`IngestError` is also a `SpecError`, so callers that map bad input to exit code 2 / HTTP 422 need
no special case for it.
"""

from __future__ import annotations

from pathlib import Path

from compute.errors import SpecError, StrataError


class StoreError(StrataError):
    """The results store refused or could not do what was asked."""


class DatabaseHeldError(StoreError):
    """Another process has the database file open (DuckDB allows one process per file)."""

    def __init__(self, path: Path, pid: int | None = None, holder: str | None = None) -> None:
        self.path, self.pid, self.holder = path, pid, holder
        who = "another process"
        if pid is not None:
            who = f"process {pid}" + (f" ({holder})" if holder else "")
        super().__init__(
            f"the database {path} is held by {who}. Only one process may open it: when the "
            "Strata service is running, it is the one writer, so send work to the service (or "
            "stop it) instead of opening the file directly."
        )


class SchemaOutOfDateError(StoreError):
    """The database schema is at another revision than the code's migrations head."""


class RevisionError(StoreError, SpecError):
    """A migration revision that does not exist or cannot be reached."""


class RegistrationError(StoreError, SpecError):
    """A model that cannot be registered; the message says why."""


class ModelConflictError(StoreError):
    """The model is registered already under another name."""


class IngestError(StoreError, SpecError):
    """Results were refused before anything was stored; the message names the problem."""


class RunNotFoundError(IngestError):
    """Results were delivered for a run id that the store does not know."""


class FamilyError(StoreError, SpecError):
    """A refit family that cannot be made or changed as asked; the message says what to fix."""


class FamilyNotFoundError(StoreError):
    """No refit family has this name."""


class FamilyConflictError(StoreError):
    """A refit family of this name exists already."""
