"""The one body of every error answer."""

from __future__ import annotations

import msgspec


class ErrorBody(msgspec.Struct):
    """The body of every error answer."""

    error: str
    detail: str
    status: int
