"""`neurons` and `neuron_tokens`: per-neuron moments and class, and the top tokens of the top
neurons of each class (docs/metrics.md: neurons.*).

A neuron's four `neurons.vocab_*` records become one row here (and nowhere else); the class flags
are computed at ingest with `compute.metrics.neurons.classify`, the one definition of the classes.
Like `results`, these tables have no database key (see `result.py`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base

NEURON_COLUMNS: tuple[str, ...] = (
    "run_id",
    "layer",
    "neuron",
    "vocab_mean",
    "vocab_var",
    "vocab_skew",
    "vocab_kurt",
    "n",
    "prediction",
    "suppression",
    "partition",
    "relative_depth",
)
NEURON_TOKEN_COLUMNS: tuple[str, ...] = (
    "run_id",
    "layer",
    "neuron",
    "neuron_class",
    "direction",
    "rank",
    "token_id",
    "token",
    "cosine",
)


class NeuronStatsRow(Base):
    __tablename__ = "neurons"

    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    layer: Mapped[int] = mapped_column()
    neuron: Mapped[int] = mapped_column()
    vocab_mean: Mapped[float] = mapped_column()
    vocab_var: Mapped[float] = mapped_column()
    vocab_skew: Mapped[float] = mapped_column()
    vocab_kurt: Mapped[float] = mapped_column()
    n: Mapped[int] = mapped_column(sa.BigInteger)
    prediction: Mapped[bool] = mapped_column()
    suppression: Mapped[bool] = mapped_column()
    partition: Mapped[bool] = mapped_column()
    relative_depth: Mapped[float | None] = mapped_column()

    # The neuron's key; not a database constraint (see the module docstring).
    __mapper_args__ = {"primary_key": [run_id, layer, neuron]}  # noqa: RUF012


class NeuronToken(Base):
    __tablename__ = "neuron_tokens"
    __table_args__ = (
        sa.CheckConstraint("neuron_class IN ('prediction', 'suppression', 'partition')"),
        sa.CheckConstraint("direction IN ('promoted', 'suppressed')"),
    )

    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    layer: Mapped[int] = mapped_column()
    neuron: Mapped[int] = mapped_column()
    neuron_class: Mapped[str] = mapped_column()
    direction: Mapped[str] = mapped_column()
    rank: Mapped[int] = mapped_column()
    token_id: Mapped[int] = mapped_column(sa.BigInteger)
    token: Mapped[str] = mapped_column()
    cosine: Mapped[float] = mapped_column()

    # The record key; not a database constraint (see the module docstring).
    __mapper_args__ = {  # noqa: RUF012
        "primary_key": [run_id, layer, neuron, neuron_class, direction, rank]
    }
