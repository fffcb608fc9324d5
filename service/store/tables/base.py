"""The declarative base: one metadata, one mapping of Python types to DuckDB types.

Every integer primary key takes its values from an explicit `Sequence` (DuckDB has no
autoincrement). Timestamps are naive UTC (`utcnow`). Floats are DOUBLE, never FLOAT (which DuckDB
reads as 32-bit REAL). Lists are stored as JSON, not as DuckDB LIST: DuckDB updates a LIST column
by deleting and re-inserting the row, which its foreign keys refuse for a referenced row (a
model or run with results).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase


def utcnow() -> datetime:
    """The current time as naive UTC, the convention of every timestamp in the store."""
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        int: sa.Integer(),
        float: sa.Double(),
        str: sa.String(),
        bool: sa.Boolean(),
        datetime: sa.DateTime(),
        dict[str, Any]: sa.JSON(),
        list[str]: sa.JSON(),
    }
