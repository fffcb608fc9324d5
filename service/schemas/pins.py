"""Pinned runs: which run an operator made a model's canonical run for a metric family, and
the audit log of every pin and unpin."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

from service.schemas.common import ModelRef, RunRef

Actor = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        description="who pins (a name for the audit log; `strata models pin` sends user@host); "
        "default: the API key's id",
    ),
]
Note = Annotated[str, msgspec.Meta(max_length=2000, description="why, for the audit log")]


class PinRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Pin a run as the model's canonical run (API key)."""

    run_id: Annotated[int, msgspec.Meta(ge=0)]
    families: (
        Annotated[
            list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]],
            msgspec.Meta(
                min_length=1,
                max_length=64,
                description="the metric families it is pinned for (default: every family the "
                "run computed)",
            ),
        ]
        | None
    ) = None
    by: Actor | None = None
    note: Note | None = None


class Pin(msgspec.Struct):
    """A pin in force: the family's canonical run, who pinned it and when."""

    family: str
    run_id: int
    by: str
    at: datetime


class PinEvent(msgspec.Struct):
    """One row of the audit log: a pin (`run_id` set) or an unpin (`run_id` null)."""

    id: int
    family: str
    action: str
    run_id: int | None
    by: str
    key_id: str
    note: str | None
    at: datetime


class Pins(msgspec.Struct):
    """A model's pins in force, its canonical run for each family (pinned or not) and the
    audit log, newest first."""

    model: ModelRef
    pins: list[Pin]
    canonical: dict[str, RunRef]
    default_run_id: int | None
    history: list[PinEvent]
