"""Refit families as objects of their own: made, grown and shrunk through the API
(`POST /api/v1/families`, `.../members`), or stored by `strata stability --store`.

A family is a name, an anchor and at least two registered models of one architecture (the
anchor among them), with the settings its stability is computed under
(`compute.stability.StabilityOptions`, kept in `refit_family_settings`). Every change is checked
in full before anything is written, and written in one transaction: a refused request stores
nothing (`FamilyError`, HTTP 422, says what to fix).

Members are compared on the numbers registration knows (`architecture`, layers, heads, d_model,
vocabulary); a member whose numbers are not known yet (a hub model registered without loading)
is admitted, and a worker's stability job checks it when it loads
(`compute.stability.check_refit`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.stability import StabilityOptions
from service.store import job_rows
from service.store.db import Store
from service.store.errors import FamilyConflictError, FamilyError, FamilyNotFoundError
from service.store.tables import (
    RefitFamily,
    RefitFamilyMember,
    RefitFamilySettings,
    RegisteredModelRow,
    RunRow,
    utcnow,
)

# What members must share (the numbers `compute.stability.check_refit` compares, and the
# architecture's name), where registration knows them.
SHARED = ("architecture", "n_layers", "n_heads", "d_model", "d_vocab")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")


@dataclass(frozen=True)
class FamilyRequest:
    """A family to make: its name, members (registered model names or ids), the anchor (one of
    them; default the first) and the stability settings."""

    name: str
    members: Sequence[str]
    anchor: str | None = None
    options: StabilityOptions = field(default_factory=StabilityOptions)
    description: str | None = None


@dataclass(frozen=True)
class StoredFamily:
    """A family as stored: its row, its members (anchor included, by id), its settings."""

    family: RefitFamily
    members: list[RegisteredModelRow]
    options: StabilityOptions
    origin: str
    anchor_id: int  # the current anchor (`refit_family_settings`, else the family row's)
    # When its members or anchor last changed (its settings row's `updated_at`, else when it
    # was made): reconciliation waits for a family to settle (`STRATA_JOBS__FAMILY_SETTLE_S`).
    edited_at: datetime

    @property
    def anchor(self) -> RegisteredModelRow:
        return next(m for m in self.members if m.id == self.anchor_id)


def _models(session: Session, refs: Sequence[str]) -> list[RegisteredModelRow]:
    """The registered models `refs` name, in order, without repeats; `FamilyError` naming every
    reference that is not a registered model."""
    found: list[RegisteredModelRow] = []
    unknown: list[str] = []
    for ref in refs:
        model = job_rows.model(session, str(ref).strip())
        if model is None:
            unknown.append(repr(ref))
        elif model.id not in [m.id for m in found]:
            found.append(model)
    if unknown:
        raise FamilyError(
            f"not registered: {', '.join(unknown)}; register each member first "
            "(POST /api/v1/models or `strata models add`), then give its name or id"
        )
    return found


def check_architectures(models: Sequence[RegisteredModelRow]) -> None:
    """`FamilyError` unless every two models agree on the numbers known for both (pairwise:
    a model whose numbers are unknown, as a hub model registered without loading, must not let
    two members that differ from each other through)."""
    for i, first in enumerate(models):
        for other in models[i + 1 :]:
            differ = [
                f"{k} {getattr(first, k)} vs {getattr(other, k)}"
                for k in SHARED
                if getattr(first, k) is not None
                and getattr(other, k) is not None
                and getattr(first, k) != getattr(other, k)
            ]
            if differ:
                raise FamilyError(
                    f"{other.name!r} is not a refit of {first.name!r}'s architecture "
                    f"({'; '.join(differ)}): a family's members must share the architecture, "
                    "layers, heads, width and vocabulary; leave it out or make it a family of "
                    "its own"
                )


def _check_name(name: str) -> None:
    if not NAME.match(name) or name.isdigit():
        raise FamilyError(
            f"family name {name!r} is not usable: 1-200 letters, digits and ._+- , starting "
            "with a letter or digit, not all digits (it is part of URLs)"
        )


def _get(session: Session, name: str) -> RefitFamily:
    family = session.scalars(sa.select(RefitFamily).where(RefitFamily.name == name)).one_or_none()
    if family is None:
        known = ", ".join(session.scalars(sa.select(RefitFamily.name).order_by(RefitFamily.name)))
        raise FamilyNotFoundError(
            f"no refit family {name!r} (known: {known or 'none yet'}); make one with "
            "POST /api/v1/families or `strata families create`"
        )
    return family


def members_of(session: Session, family_id: int) -> list[RegisteredModelRow]:
    """A family's members, in registration order."""
    return list(
        session.scalars(
            sa.select(RegisteredModelRow)
            .join(RefitFamilyMember, RefitFamilyMember.model_id == RegisteredModelRow.id)
            .where(RefitFamilyMember.family_id == family_id)
            .order_by(RegisteredModelRow.id)
        )
    )


def _settings(session: Session, family: RefitFamily) -> tuple[StabilityOptions, str, int]:
    """The family's stability settings, origin and anchor; for a family stored before its
    settings were kept, its latest stability run's options (else the defaults)."""
    row = session.get(RefitFamilySettings, family.id)
    if row is not None:
        return StabilityOptions.model_validate(row.options), row.origin, row.anchor_model_id
    run = session.scalars(
        sa.select(RunRow)
        .where(
            RunRow.model_id == family.anchor_model_id,
            sa.func.json_extract_string(RunRow.config, "$.refit_family") == family.name,
        )
        .order_by(RunRow.id.desc())
        .limit(1)
    ).first()
    options = (run.config or {}).get("options") if run is not None else None
    return StabilityOptions.model_validate(options or {}), "cli", family.anchor_model_id


def load(session: Session, name: str) -> StoredFamily:
    """The family `name` (`FamilyNotFoundError` if there is none)."""
    family = _get(session, name)
    options, origin, anchor = _settings(session, family)
    row = session.get(RefitFamilySettings, family.id)
    edited = row.updated_at if row is not None else family.created_at
    return StoredFamily(family, members_of(session, family.id), options, origin, anchor, edited)


def all_families(session: Session) -> list[StoredFamily]:
    names = list(session.scalars(sa.select(RefitFamily.name).order_by(RefitFamily.name)))
    return [load(session, n) for n in names]


def write_settings(
    session: Session,
    family_id: int,
    anchor_id: int,
    options: StabilityOptions | None = None,
    origin: str = "api",
) -> None:
    """Write a family's settings row: its anchor and (when given) options."""
    row = session.get(RefitFamilySettings, family_id)
    if row is None:
        session.add(
            RefitFamilySettings(
                family_id=family_id,
                anchor_model_id=anchor_id,
                options=(options or StabilityOptions()).model_dump(mode="json"),
                origin=origin,
                updated_at=utcnow(),
            )
        )
    else:
        row.anchor_model_id, row.updated_at = anchor_id, utcnow()
        if options is not None:
            row.options = options.model_dump(mode="json")
    session.flush()


def create(store: Store, request: FamilyRequest) -> StoredFamily:
    """Make a family. `FamilyError` (nothing stored) for a bad name, fewer than two distinct
    members, a member that is not registered, an anchor that is not a member, members of
    different architectures; `FamilyConflictError` if the name is taken."""
    _check_name(request.name)
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        taken = sa.select(RefitFamily.id).where(RefitFamily.name == request.name)
        if session.scalars(taken).first() is not None:
            raise FamilyConflictError(
                f"a refit family named {request.name!r} exists already: add members to it "
                "(POST /api/v1/families/{name}/members) or choose another name"
            )
        models = _models(session, request.members)
        if len(models) < 2:
            raise FamilyError(
                f"a refit family needs at least two distinct members (the anchor and a refit); "
                f"got {len(models)}: give more members"
            )
        anchor = models[0]
        if request.anchor is not None:
            named = job_rows.model(session, request.anchor)
            if named is None or named.id not in [m.id for m in models]:
                raise FamilyError(
                    f"the anchor {request.anchor!r} is not one of the members "
                    f"({', '.join(m.name for m in models)}): give one of them"
                )
            anchor = named
        check_architectures([anchor, *[m for m in models if m.id != anchor.id]])
        contexts = [m.n_ctx for m in models if m.n_ctx is not None]
        if contexts and request.options.prompt_len > min(contexts):
            raise FamilyError(
                f"prompt_len {request.options.prompt_len} exceeds the members' context "
                f"({min(contexts)} tokens): give a prompt_len of at most {min(contexts)}"
            )
        family = RefitFamily(
            name=request.name,
            anchor_model_id=anchor.id,
            description=request.description,
            created_at=utcnow(),
        )
        session.add(family)
        session.flush()
        session.add_all([RefitFamilyMember(family_id=family.id, model_id=m.id) for m in models])
        write_settings(session, family.id, anchor.id, request.options, "api")
        return load(session, request.name)


def add_members(store: Store, name: str, refs: Sequence[str]) -> tuple[StoredFamily, list[int]]:
    """Add registered models to a family (members already in it are left as they are); the
    family and the ids added. `FamilyError` (nothing stored) for an unknown model or one of
    another architecture."""
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        stored = load(session, name)
        models = _models(session, refs)
        if not models:
            raise FamilyError("give at least one member to add")
        have = {m.id for m in stored.members}
        new = [m for m in models if m.id not in have]
        check_architectures([stored.anchor, *new])
        session.add_all([RefitFamilyMember(family_id=stored.family.id, model_id=m.id) for m in new])
        if new:  # an edit: the settings row's `updated_at` says when (`StoredFamily.edited_at`)
            write_settings(
                session, stored.family.id, stored.anchor_id, stored.options, stored.origin
            )
        session.flush()
        return load(session, name), [m.id for m in new]


def remove_member(store: Store, name: str, ref: str) -> StoredFamily:
    """Take a member out of a family. `FamilyError` for a model that is not a member, the
    anchor, or the last refit (a family keeps at least two members)."""
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        stored = load(session, name)
        model = job_rows.model(session, ref)
        if model is None or model.id not in {m.id for m in stored.members}:
            raise FamilyError(
                f"{ref!r} is not a member of {name!r} (members: "
                f"{', '.join(m.name for m in stored.members)})"
            )
        if model.id == stored.anchor_id:
            raise FamilyError(
                f"{model.name!r} is the anchor of {name!r}: every refit is compared with it, so "
                "it cannot leave; make a new family with another anchor instead"
            )
        if len(stored.members) <= 2:
            raise FamilyError(
                f"{name!r} has two members: without {model.name!r} it would have nothing to "
                "compare; add another member first"
            )
        session.execute(
            sa.delete(RefitFamilyMember).where(
                RefitFamilyMember.family_id == stored.family.id,
                RefitFamilyMember.model_id == model.id,
            )
        )
        write_settings(session, stored.family.id, stored.anchor_id, stored.options, stored.origin)
        return load(session, name)


def follow_registrations(store: Store) -> list[str]:
    """Members whose weights changed: a checkpoint registered again under the same name and
    reference with new weights (another content checksum, `revision`) is a new registered model;
    each family's member (the anchor too) is moved to the latest registration of its name and
    reference. Returns the names of the families that changed (nothing is written when none
    did: this runs on every reconciliation)."""
    with store.read() as conn, Session(bind=conn) as session:
        plans = {
            stored.family.name: moves
            for stored in all_families(session)
            if (moves := _moves(session, stored))
        }
    if not plans:
        return []
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        for name in plans:
            stored = load(session, name)
            moves = _moves(session, stored)
            fid = stored.family.id
            for old, new in moves.items():
                session.execute(
                    sa.delete(RefitFamilyMember).where(
                        RefitFamilyMember.family_id == fid, RefitFamilyMember.model_id == old
                    )
                )
                session.add(RefitFamilyMember(family_id=fid, model_id=new))
            session.flush()
            anchor = moves.get(stored.anchor_id, stored.anchor_id)
            write_settings(session, fid, anchor, stored.options, stored.origin)
    return sorted(plans)


def _moves(session: Session, stored: StoredFamily) -> dict[int, int]:
    """Member id -> the id of a later registration of the same name and reference."""
    moves: dict[int, int] = {}
    ids = {m.id for m in stored.members}
    for member in stored.members:
        latest = job_rows.model(session, member.name)
        if (
            latest is not None
            and latest.id > member.id
            and latest.id not in ids
            and _same_reference(latest.spec, member.spec)
        ):
            moves[member.id] = latest.id
    return moves


def _same_reference(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same weights' reference (source, name, processing), whatever its revision."""
    keys = ("source", "name", "processing")
    return all(a.get(k) == b.get(k) for k in keys)
