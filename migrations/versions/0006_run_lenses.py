"""Run lenses: the tuned lens each run with the tuned_lens family evaluated.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

Written by hand. One row per run that has a tuned lens: its key, whether the run trained it, and
what the run reported about it (compute.lens.store.provide_lens). A table of its own rather than
columns on `runs` (DuckDB cannot alter a table that others reference, see 0005); no database
key, as `sequence_means`. Runs stored before this revision have no row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_lenses",
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("key", sa.String, nullable=False),
        sa.Column("trained", sa.Boolean, nullable=False),
        sa.Column("info", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_lenses")
