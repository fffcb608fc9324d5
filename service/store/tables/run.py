"""`runs`: one computation of a model's metrics under one configuration.

A run is identified by (`config_hash`, `metric_version`): ingesting the same pair again replaces
the run's rows instead of adding a second run. `config` is the canonical configuration (model
spec, token spec, families, engine options, metric version); `code_version` the Strata version
that computed it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow

RunStatus = Literal["queued", "running", "succeeded", "failed"]
RUN_STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed")


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (
        sa.UniqueConstraint("config_hash", "metric_version"),
        sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')"),
        sa.CheckConstraint("progress >= 0 AND progress <= 1"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Sequence("runs_id_seq"), primary_key=True)
    model_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("models.id"))
    token_source_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("token_sources.id"))
    config_hash: Mapped[str] = mapped_column(sa.String(64))
    metric_version: Mapped[str]
    code_version: Mapped[str]
    families: Mapped[list[str]]
    config: Mapped[dict[str, Any]]
    status: Mapped[str]
    progress: Mapped[float]
    error: Mapped[str | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    device: Mapped[str | None]
    dtype: Mapped[str]
    tokens_evaluated: Mapped[int | None] = mapped_column(sa.BigInteger)
    wall_s: Mapped[float | None]
    environment: Mapped[dict[str, Any] | None]
    n_records: Mapped[int | None] = mapped_column(sa.BigInteger)
