"""`sequence_means`: a run's per-sequence means behind every per-layer mean (revision 0004).

A row is the mean of one metric over one sequence's evaluated positions (docs/metrics.md:
uncertainty); the per-layer value in `results` is the mean of these over the run's sequences and
its stderr their std / sqrt(n). A bootstrap over sequences (`compute.bootstrap`) resamples them.
Like `results`, the table has no database key (see `result.py`); runs of metric version 1 have
no rows here.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base

SEQUENCE_MEAN_COLUMNS: tuple[str, ...] = (
    "run_id",
    "metric",
    "layer",
    "component",
    "head",
    "sequence",
    "value",
)


class SequenceMean(Base):
    __tablename__ = "sequence_means"

    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    metric: Mapped[str] = mapped_column()
    layer: Mapped[int | None] = mapped_column()
    component: Mapped[str | None] = mapped_column()
    head: Mapped[int | None] = mapped_column()
    sequence: Mapped[int] = mapped_column()
    value: Mapped[float] = mapped_column()

    # The row's key; not a database constraint (see the module docstring).
    __mapper_args__ = {  # noqa: RUF012
        "primary_key": [run_id, metric, layer, component, head, sequence]
    }
