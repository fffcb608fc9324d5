"""Exit codes of `strata` and the one map from errors to them (shared by every command).

0 ok; 1 anything else; 2 bad input (unknown model, unreadable tokens, bad options, a schema that
needs `strata db upgrade`, a model registered already under another name, ...); 3 the model
could not be loaded; 4 the computation failed (NaN/inf, shape mismatch); 5 the database is held
by another process; 6 the service (or its job broker) cannot be reached; 7 the job ended failed
or cancelled (`strata jobs watch`).
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from compute.errors import ComputeError, ModelLoadError, SpecError, StrataError
from service.store.errors import DatabaseHeldError, ModelConflictError, SchemaOutOfDateError

EXIT_BAD_INPUT, EXIT_LOAD, EXIT_COMPUTE, EXIT_HELD, EXIT_UNREACHABLE, EXIT_JOB = 2, 3, 4, 5, 6, 7


def exit_code_of(exc: StrataError) -> int:
    if isinstance(exc, DatabaseHeldError):
        return EXIT_HELD
    if isinstance(exc, SpecError | SchemaOutOfDateError | ModelConflictError):
        return EXIT_BAD_INPUT
    if isinstance(exc, ModelLoadError):
        return EXIT_LOAD
    if isinstance(exc, ComputeError):
        return EXIT_COMPUTE
    return 1


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
