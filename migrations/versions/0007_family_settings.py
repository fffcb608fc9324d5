"""Refit family settings: how each family's stability is computed, and where it came from.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10

Written by hand. One row per refit family made through the API (`POST /api/v1/families`) or
stored by `strata stability --store`: the comparison options, the current anchor (which
`refit_families`, referenced by its members, cannot be updated to) and the family's origin. A
table of its own (DuckDB cannot alter `refit_families`, which `refit_family_members` references); no
database key, as the row is updated in place (see `service/store/tables/family_settings.py`).
Families stored before this revision have no row: their latest stability run's options stand
in, until the family's settings are next written.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refit_family_settings",
        sa.Column("family_id", sa.BigInteger, nullable=False),
        sa.Column("anchor_model_id", sa.BigInteger, nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("origin", sa.String, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("refit_family_settings")
