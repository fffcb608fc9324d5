"""Liveness and readiness."""

from __future__ import annotations

import msgspec


class Health(msgspec.Struct):
    status: str


class Ready(msgspec.Struct):
    status: str
    database: str
    revision: str | None
    head: str
