"""`run_resources`: where a run's time went and the peak memory it reached (revision 0009) — one
row per run stored since: the seconds of each phase (load, the tuned lens's training, the clean
pass, each family; `compute.run.RunResult.timings_s`) and the peaks `compute.memory.peak_memory`
measured: the host's resident memory, with its scope ("run": since the run started, "process":
the process's lifetime, where the kernel could not restart the mark) and PyTorch's peak
allocation on a CUDA device. A table of its own rather than columns of `runs`: DuckDB cannot
alter a table that others reference. Like `run_lenses`, no database key: the run's rows are
deleted and written together by ingest.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base


class RunResource(Base):
    __tablename__ = "run_resources"

    run_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("runs.id"))
    timings_s: Mapped[dict[str, Any]]
    host_peak_rss_mib: Mapped[int | None] = mapped_column(sa.BigInteger)
    host_peak_scope: Mapped[str | None]
    device_peak_allocated_mib: Mapped[int | None] = mapped_column(sa.BigInteger)

    # The row's key; not a database constraint (see the module docstring).
    __mapper_args__ = {"primary_key": [run_id]}  # noqa: RUF012
