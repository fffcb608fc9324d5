"""The results store: one DuckDB file, one writer process, atomic idempotent ingest.

    db.py            opening the file (single writer, `DatabaseHeldError`)
    tables/          SQLAlchemy tables, one module each
    migrate.py       Alembic upgrade / downgrade / current (versions in `migrations/`)
    rows.py          checking and shaping a run's records as Arrow tables
    registry.py      registering models and token sources
    registration.py  registering a model without computing (`register`: checked, numbers kept)
    runs.py          a run's lifecycle (queued, running, failed)
    ingest.py        a run's results in, all at once or not at all
    boundaries.py    stage boundaries inferred from a run's records, stored at its ingest
    stability.py     a refit family's stability comparison in (members, family, run)
    repositories.py  the queries the API serves
    job_rows.py      the queries the job service makes

Importing the package stays light (no torch): `ingest`, `rows`, `repositories` and `job_rows` are
imported from their modules.
"""

from service.store.db import Store
from service.store.errors import (
    DatabaseHeldError,
    IngestError,
    ModelConflictError,
    RegistrationError,
    RevisionError,
    RunNotFoundError,
    SchemaOutOfDateError,
    StoreError,
)

__all__ = [
    "DatabaseHeldError",
    "IngestError",
    "ModelConflictError",
    "RegistrationError",
    "RevisionError",
    "RunNotFoundError",
    "SchemaOutOfDateError",
    "Store",
    "StoreError",
]
