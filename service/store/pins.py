"""Pinning a model's canonical run: the writes (each one a row of the `run_pins` audit log) and
the reads the serving index and the pin endpoints make.

The API decides whether a pin makes sense (the run is the model's, succeeded, under the current
metric version, computed the family: `service.api.queries.pins`); this module records it. A pin
or unpin is appended, never updated: the newest row of a (model, family) is the pin in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl
import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.store.db import Store, raw_connection
from service.store.tables import RunPin, utcnow


@dataclass(frozen=True)
class PinWrite:
    """Who writes a pin or unpin: the name they gave, the key's digest prefix, a note."""

    actor: str
    key_id: str
    note: str | None = None


def record(
    store: Store,
    model_id: int,
    changes: Sequence[tuple[str, int | None]],
    who: PinWrite,
) -> list[RunPin]:
    """Append one audit row per (family, run id) in one transaction: a run id pins that run, None
    unpins the family. Returns the rows written (detached)."""
    now = utcnow()
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        rows = [
            RunPin(
                model_id=model_id,
                family=family,
                run_id=run_id,
                action="unpin" if run_id is None else "pin",
                actor=who.actor,
                key_id=who.key_id,
                note=who.note,
                recorded_at=now,
            )
            for family, run_id in changes
        ]
        session.add_all(rows)
        session.flush()
        session.expunge_all()
    return rows


def in_force(conn: Any) -> pl.DataFrame:
    """The pins in force: per (model, family) the newest audit row, where it pins a run —
    model_id, family, run_id, actor, recorded_at."""
    return (
        raw_connection(conn)
        .sql(
            """
            SELECT model_id, family, run_id, actor, recorded_at FROM (
                SELECT *, row_number() OVER (PARTITION BY model_id, family ORDER BY id DESC) AS k
                FROM run_pins)
            WHERE k = 1 AND run_id IS NOT NULL ORDER BY model_id, family"""
        )
        .pl()
    )


def history(conn: sa.Connection, model_id: int, limit: int = 200) -> list[RunPin]:
    """The model's pins and unpins, newest first."""
    with Session(bind=conn, expire_on_commit=False) as session:
        rows = list(
            session.scalars(
                sa.select(RunPin)
                .where(RunPin.model_id == model_id)
                .order_by(RunPin.id.desc())
                .limit(limit)
            )
        )
        session.expunge_all()
    return rows
