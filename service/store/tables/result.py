"""`results`: a run's rows in the record format (docs/metrics.md) (per-neuron moments excepted).

The table has no primary key in the database: a unique index would make every bulk insert pay for
an ART index. Rows of a run are written together, in one transaction, sorted by metric, so DuckDB's
min/max zone maps on `run_id` and `metric` skip the row groups of other runs. The ingest refuses
duplicate keys before anything is written. The mapper's key is the record key.

`relative_depth` (revision 0002) is l/(L-1) for block metrics and i/L for logit-lens points
(docs/metrics.md: depth).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base

RESULT_COLUMNS: tuple[str, ...] = (
    "run_id",
    "metric",
    "layer",
    "component",
    "head",
    "neuron",
    "value",
    "stderr",
    "n",
    "unit",
    "relative_depth",
)


class Result(Base):
    __tablename__ = "results"

    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    metric: Mapped[str] = mapped_column()
    layer: Mapped[int | None] = mapped_column()
    component: Mapped[str | None] = mapped_column()
    head: Mapped[int | None] = mapped_column()
    neuron: Mapped[int | None] = mapped_column()
    value: Mapped[float] = mapped_column()
    stderr: Mapped[float | None] = mapped_column()
    n: Mapped[int] = mapped_column(sa.BigInteger)
    unit: Mapped[str] = mapped_column()
    relative_depth: Mapped[float | None] = mapped_column()

    # The record key; not a database constraint (see the module docstring).
    __mapper_args__ = {  # noqa: RUF012
        "primary_key": [run_id, metric, layer, component, head, neuron]
    }
