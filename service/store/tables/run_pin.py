"""`run_pins` (revision 0008): the audit log of which run an operator pinned as a model's
canonical run for a metric family, and when it was unpinned.

Append-only: every pin and every unpin is a row (who, with which key, when, why), never updated
or deleted, so the table is its own history. The pin in force for (model, family) is the newest
row of that pair: a `run_id` pins that run, a null `run_id` (action `unpin`) means nothing is
pinned and the family's canonical run is the default configuration's run again
(`service.api.queries.index`). `actor` is the name the writer gave (`strata models pin` sends
the shell's user@host), `key_id` a digest prefix of the API key used (never the key).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow

PIN_ACTIONS: tuple[str, ...] = ("pin", "unpin")


class RunPin(Base):
    __tablename__ = "run_pins"
    __table_args__ = (sa.CheckConstraint("action IN ('pin', 'unpin')"),)

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Sequence("run_pins_id_seq"), primary_key=True)
    model_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("models.id"))
    family: Mapped[str]
    run_id: Mapped[int | None] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    action: Mapped[str]
    actor: Mapped[str]
    key_id: Mapped[str]
    note: Mapped[str | None]
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)
