"""`run_lenses`: the tuned lens a run evaluated (revision 0006) — one row for a run with the
tuned_lens family: the lens's key (`<data_dir>/lenses/<key>.safetensors`), whether this run
trained it (false: a stored lens was reused or named) and what `compute.lens.store.provide_lens`
reported (the budget used, losses, wall time). A table of its own rather than a column of `runs`:
DuckDB cannot alter a table that others reference. Like `sequence_means`, no database key: the
run's rows are deleted and written together by ingest.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base


class RunLens(Base):
    __tablename__ = "run_lenses"

    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    key: Mapped[str]
    trained: Mapped[bool]
    info: Mapped[dict[str, Any]]

    # The row's key; not a database constraint (see the module docstring).
    __mapper_args__ = {"primary_key": [run_id]}  # noqa: RUF012
