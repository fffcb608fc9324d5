"""Run resources: where each run's time went and the peak memory it reached, as measured.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

Written by hand. One row per run stored from now on (`service/store/tables/run_resource.py`):
the seconds of each phase (`compute.run.RunResult.timings_s`: load, the tuned lens's training,
the clean pass, each family) and the peak memory (`compute.memory.peak_memory`). A table of its
own rather than columns on `runs` (DuckDB cannot alter a table that others reference, see 0005);
no database key, as `run_lenses`. Runs stored before this revision have no row: their phases
and memory were not kept, and nothing is invented for them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_resources",
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("timings_s", sa.JSON, nullable=False),
        sa.Column("host_peak_rss_mib", sa.BigInteger, nullable=True),
        sa.Column("host_peak_scope", sa.String, nullable=True),
        sa.Column("device_peak_allocated_mib", sa.BigInteger, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("run_resources")
