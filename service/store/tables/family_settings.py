"""`refit_family_settings` (revision 0007): how a refit family's stability is computed — the
comparison options (`compute.stability.StabilityOptions`: prompts, their length and seed, null
models, CKA tokens) and its current anchor — and where the family came from (`origin`: `api`
for a family made with `POST /api/v1/families`, `cli` for one stored by `strata stability
--store`).

The anchor is kept here, not only in `refit_families.anchor_model_id` (where it was first
stored): DuckDB refuses to update a row that `refit_family_members` references, so when the
anchor's weights change (a new registration of its checkpoint) the family's anchor moves here.

A table of its own rather than columns of `refit_families` (DuckDB cannot alter a table that
others reference). No database key: the row is updated when the settings change, and DuckDB
rewrites indexed rows on update; one row per family is kept by `service.store.families`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow


class RefitFamilySettings(Base):
    __tablename__ = "refit_family_settings"

    family_id: Mapped[int] = mapped_column(sa.BigInteger)
    anchor_model_id: Mapped[int] = mapped_column(sa.BigInteger)
    options: Mapped[dict[str, Any]]
    origin: Mapped[str]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    # The row's key; not a database constraint (see the module docstring).
    __mapper_args__ = {"primary_key": [family_id]}  # noqa: RUF012
