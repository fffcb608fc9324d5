"""Pinning a model's canonical run: what a pin or unpin must satisfy, recording it (one audit
row per family, `service.store.pins`), and the model's pins as the API shows them."""

from __future__ import annotations

from datetime import UTC, datetime

from compute.metrics import FAMILIES
from compute.run import METRIC_VERSION
from service.api.errors import ConflictHttpError, NotFoundHttpError, UnprocessableHttpError
from service.api.queries.answers import model_ref, run_ref
from service.api.queries.index import ModelEntry, Snapshot
from service.schemas.pins import Pin, PinEvent, PinRequest, Pins
from service.store import Store
from service.store import pins as pin_rows


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


def pins_of(store: Store, snap: Snapshot, model: ModelEntry) -> Pins:
    with store.read() as conn:
        history = pin_rows.history(conn, model.id)
    default = snap.default_run(model.id)
    return Pins(
        model_ref(model),
        [
            Pin(family, pin.run_id, pin.actor, _utc(pin.recorded_at))
            for family, pin in snap.model_pins(model.id).items()
        ],
        {family: run_ref(pick) for family, pick in snap.canonical_runs(model.id).items()},
        default.id if default is not None else None,
        [
            PinEvent(
                row.id,
                row.family,
                row.action,
                row.run_id,
                row.actor,
                row.key_id,
                row.note,
                _utc(row.recorded_at),
            )
            for row in history
        ],
    )


def pin(
    store: Store, snap: Snapshot, model: ModelEntry, request: PinRequest, key_id: str
) -> list[str]:
    """Pin `request.run_id` for its families; the families pinned. Refused: a run that is not
    the model's (404), one that has no results (409), one of an older metric version, a
    family it did not compute or that does not exist, a family stability run (422)."""
    run = snap.runs.get(request.run_id)
    if run is None or run.model_id != model.id:
        owner = "" if run is None else f" (run {request.run_id} is model {run.model_id}'s)"
        raise NotFoundHttpError(
            f"model {model.name!r} (id {model.id}) has no run {request.run_id}{owner}; "
            f"GET /api/v1/runs?model={model.id}&status=succeeded lists the runs it can pin"
        )
    if run.status != "succeeded":
        raise ConflictHttpError(f"run {run.id} is {run.status}: only a succeeded run can be pinned")
    if run.refit_family is not None:
        raise UnprocessableHttpError(
            f"run {run.id} is refit family {run.refit_family!r}'s stability run; a family "
            "reads its own latest stability run, which is not pinned"
        )
    if run.metric_version != METRIC_VERSION:
        raise UnprocessableHttpError(
            f"run {run.id} is of metric version {run.metric_version}; only runs of the current "
            f"version ({METRIC_VERSION}) can be pinned"
        )
    families = list(dict.fromkeys(request.families or sorted(run.families)))
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise UnprocessableHttpError(
            f"unknown metric famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
            "one of " + ", ".join(sorted(FAMILIES))
        )
    missing = [f for f in families if f not in run.families]
    if missing:
        raise UnprocessableHttpError(
            f"run {run.id} did not compute {', '.join(missing)} (it computed "
            f"{', '.join(sorted(run.families))})"
        )
    who = pin_rows.PinWrite(request.by or key_id, key_id, request.note)
    pin_rows.record(store, model.id, [(f, run.id) for f in families], who)
    return families


def unpin(
    store: Store,
    snap: Snapshot,
    model: ModelEntry,
    families: list[str] | None,
    *,
    by: str | None,
    note: str | None,
    key_id: str,
) -> list[str]:
    """Unpin the given families (default: every pinned one); the families unpinned. 404 when
    one of them (or, without families, any) is not pinned."""
    pinned = snap.model_pins(model.id)
    wanted = list(dict.fromkeys(families)) if families else sorted(pinned)
    loose = [f for f in wanted if f not in pinned]
    if not wanted or loose:
        what = ", ".join(loose) if loose else "any family"
        raise NotFoundHttpError(
            f"model {model.name!r} (id {model.id}) has no pinned run for {what}"
            + (f"; pinned: {', '.join(sorted(pinned))}" if pinned else "")
        )
    who = pin_rows.PinWrite(by or key_id, key_id, note)
    pin_rows.record(store, model.id, [(f, None) for f in wanted], who)
    return wanted
