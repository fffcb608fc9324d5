"""`stage_boundaries`: where a model's stages meet, with the evidence (docs/metrics.md: stages.*).

Boundary k (1..3) ends stage k. A boundary the rule could not place is stored with `found` false
and no layer, so "no clear boundary" is an answer, not a missing row. Filled by the stages step
(a later issue); replaced whenever the run it was inferred from is re-ingested.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow


class StageBoundary(Base):
    __tablename__ = "stage_boundaries"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "boundary"),
        sa.CheckConstraint("boundary BETWEEN 1 AND 3"),
        sa.CheckConstraint("found = (layer IS NOT NULL)"),
    )

    id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.Sequence("stage_boundaries_id_seq"), primary_key=True
    )
    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    model_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("models.id"))
    boundary: Mapped[int] = mapped_column(sa.SmallInteger)
    found: Mapped[bool]
    layer: Mapped[int | None]
    relative_depth: Mapped[float | None]
    rule: Mapped[str]
    evidence: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
