"""Relative depth on result and neuron rows (backfilled); stage boundaries; refit families.

Revision ID: 0002
Revises: 0001
Create Date: 2026-02-01

Written by hand. `relative_depth` makes "compare models at the same depth" a filter instead of a
join: l/(L-1) for block metrics, i/L for logit-lens points (docs/metrics.md: depth). Existing
rows are backfilled from their run's model. Stage boundaries and refit families are filled by
later steps; the tables exist now so the API can be built against them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SEQUENCES = ("stage_boundaries_id_seq", "refit_families_id_seq")

# Frozen copy of the rule in service/store/rows.py at this revision.
DEPTH = """
    CASE
        WHEN {t}.layer IS NULL OR m.n_layers IS NULL THEN NULL
        WHEN {lens} THEN CAST({t}.layer AS DOUBLE) / m.n_layers
        WHEN m.n_layers = 1 THEN 0.0
        ELSE CAST({t}.layer AS DOUBLE) / (m.n_layers - 1)
    END
"""


def _backfill(table: str, lens: str) -> None:
    op.execute(f"""
        UPDATE {table} SET relative_depth = {DEPTH.format(t=table, lens=lens)}
        FROM runs r JOIN models m ON m.id = r.model_id
        WHERE r.id = {table}.run_id
    """)


def upgrade() -> None:
    op.add_column("results", sa.Column("relative_depth", sa.Double))
    op.add_column("neurons", sa.Column("relative_depth", sa.Double))
    _backfill("results", "starts_with(results.metric, 'logit_lens.')")
    _backfill("neurons", "FALSE")
    for name in SEQUENCES:
        op.execute(sa.schema.CreateSequence(sa.Sequence(name)))
    op.create_table(
        "stage_boundaries",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("model_id", sa.BigInteger, sa.ForeignKey("models.id"), nullable=False),
        sa.Column("boundary", sa.SmallInteger, nullable=False),
        sa.Column("found", sa.Boolean, nullable=False),
        sa.Column("layer", sa.Integer),
        sa.Column("relative_depth", sa.Double),
        sa.Column("rule", sa.String, nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("run_id", "boundary"),
        sa.CheckConstraint("boundary BETWEEN 1 AND 3"),
        sa.CheckConstraint("found = (layer IS NOT NULL)"),
    )
    op.create_table(
        "refit_families",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String, nullable=False, unique=True),
        sa.Column("anchor_model_id", sa.BigInteger, sa.ForeignKey("models.id"), nullable=False),
        sa.Column("description", sa.String),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "refit_family_members",
        sa.Column("family_id", sa.BigInteger, sa.ForeignKey("refit_families.id"),
                  primary_key=True),
        sa.Column("model_id", sa.BigInteger, sa.ForeignKey("models.id"), primary_key=True),
    )


def downgrade() -> None:
    for table in ("refit_family_members", "refit_families", "stage_boundaries"):
        op.drop_table(table)
    for name in reversed(SEQUENCES):
        op.execute(sa.schema.DropSequence(sa.Sequence(name)))
    op.drop_column("neurons", "relative_depth")
    op.drop_column("results", "relative_depth")
