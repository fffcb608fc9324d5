"""`token_sources`: the tokens a run evaluated (a resolved `TokenSpec`, fingerprint included)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow


class TokenSource(Base):
    __tablename__ = "token_sources"

    id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.Sequence("token_sources_id_seq"), primary_key=True
    )
    spec_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    source: Mapped[str]
    path: Mapped[str | None]
    n_sequences: Mapped[int]
    seq_len: Mapped[int]
    seed: Mapped[int]
    fingerprint: Mapped[str | None]
    spec: Mapped[dict[str, Any]]
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
