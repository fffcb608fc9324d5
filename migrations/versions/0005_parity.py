"""Parity reports: what each load of a model measured.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

Written by hand. One row per measured load (compute.models.parity: Strata's forward against the
Hugging Face forward, the noise floor below float32, and the experts per MLP layer so that a
mixture-of-experts model's neurons, every expert's hidden units, are counted): a registration's
float32 load (run_id null) or an ingested run's own load. A table of its own rather than columns
on `models` and `runs`: DuckDB cannot drop a column of a table that others reference, so the
downgrade could not remove them. Models and runs stored before this revision have no rows (not
measured).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("parity_reports_id_seq")))
    op.create_table(
        "parity_reports",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("model_id", sa.BigInteger, sa.ForeignKey("models.id"), nullable=False),
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id")),
        sa.Column("dtype", sa.String, nullable=False),
        sa.Column("n_experts", sa.Integer, nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
        sa.Column("measured_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("parity_reports")
    op.execute(sa.schema.DropSequence(sa.Sequence("parity_reports_id_seq")))
