"""`parity_reports`: what a model's load measured — the parity report (compute.models.parity:
Strata's forward against the Hugging Face forward, and below float32 the noise floor) and the
experts per MLP layer. Appended, never updated: a registration's float32 load adds a row for the
model (`run_id` null), every ingested run a row of its own load at its dtype. A model's report is
its latest float32 row; a run's is its latest row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow


class ParityReportRow(Base):
    __tablename__ = "parity_reports"

    id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.Sequence("parity_reports_id_seq"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("models.id"))
    run_id: Mapped[int | None] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    dtype: Mapped[str]
    # Experts per MLP layer (1: dense); a neuron is one hidden unit of one expert.
    n_experts: Mapped[int]
    report: Mapped[dict[str, Any]]
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)
