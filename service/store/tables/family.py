"""`refit_families` and `refit_family_members`: independently trained refits of one
architecture, compared against an anchor (docs/metrics.md: heads.stability, residual CKA).
The anchor is one of the members."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow


class RefitFamily(Base):
    __tablename__ = "refit_families"

    id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.Sequence("refit_families_id_seq"), primary_key=True
    )
    name: Mapped[str] = mapped_column(unique=True)
    anchor_model_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("models.id"))
    description: Mapped[str | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RefitFamilyMember(Base):
    __tablename__ = "refit_family_members"

    family_id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.ForeignKey("refit_families.id"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.ForeignKey("models.id"), primary_key=True
    )
