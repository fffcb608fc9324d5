"""Jobs: requests to compute a run configuration, taken by Celery workers.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Written by hand. No foreign keys or unique indexes (see `service/store/tables/job.py`): a job
row is updated at every transition, and DuckDB rewrites indexed rows on update.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("jobs_id_seq")))
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("model_id", sa.BigInteger, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("metric_version", sa.String, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("families", sa.JSON, nullable=False),
        sa.Column("device", sa.String),
        sa.Column("dtype", sa.String, nullable=False),
        sa.Column("state", sa.String, nullable=False),
        sa.Column("reason", sa.String, nullable=False),
        sa.Column("queue", sa.String, nullable=False),
        sa.Column("forced", sa.Boolean, nullable=False),
        sa.Column("dispatch", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("worker", sa.String),
        sa.Column("error", sa.String),
        sa.Column("run_id", sa.BigInteger),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("dispatched_at", sa.DateTime),
        sa.Column("started_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')"),
    )


def downgrade() -> None:
    op.drop_table("jobs")
    op.execute(sa.schema.DropSequence(sa.Sequence("jobs_id_seq")))
