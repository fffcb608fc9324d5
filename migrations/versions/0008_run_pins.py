"""Run pins: which run an operator made a model's canonical run for a metric family, audited.

Revision ID: 0008
Revises: 0007
Create Date: 2027-01-12

Written by hand. An append-only log (`service/store/tables/run_pin.py`): each pin or unpin is a
row with who did it, the key's digest prefix and the time; the newest row of a (model, family)
is the pin in force. Nothing else changes: a database from before this revision has no pins,
so each model answers from its default configuration's run (docs/api.md, "Which model, which
run"), which for every model that has one is what the API answered before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("run_pins_id_seq")))
    op.create_table(
        "run_pins",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("model_id", sa.BigInteger, sa.ForeignKey("models.id"), nullable=False),
        sa.Column("family", sa.String, nullable=False),
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=True),
        sa.Column("action", sa.String, nullable=False),
        sa.Column("actor", sa.String, nullable=False),
        sa.Column("key_id", sa.String, nullable=False),
        sa.Column("note", sa.String, nullable=True),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
        sa.CheckConstraint("action IN ('pin', 'unpin')"),
    )


def downgrade() -> None:
    op.drop_table("run_pins")
    op.execute(sa.schema.DropSequence(sa.Sequence("run_pins_id_seq")))
