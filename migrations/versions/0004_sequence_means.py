"""Per-sequence means: the sequence-level samples behind every per-layer mean (metric version 2).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Written by hand. One row per (run, metric, layer, component, head, sequence): the mean over that
sequence's evaluated positions (docs/metrics.md: uncertainty). Like `results`, no database key
(a unique index would make every bulk insert pay for an ART index); a run's rows are written
together and sorted, so zone maps on `run_id` skip other runs. Runs stored before this revision
(metric version 1) have no rows here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sequence_means",
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("metric", sa.String, nullable=False),
        sa.Column("layer", sa.Integer),
        sa.Column("component", sa.String),
        sa.Column("head", sa.Integer),
        sa.Column("sequence", sa.Integer, nullable=False),
        sa.Column("value", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sequence_means")
