"""Head stability of a refit family in the store (docs/metrics.md: heads.stability, residual CKA).

A stability computation (`compute.stability.stability_records`) compares an anchor model with
independently trained refits of its architecture. It is stored as a run like any other:

- the run belongs to the anchor model, its families are `("stability",)`, and its configuration
  names the family (`refit_family`), the anchor, every member, the comparison options and the
  prompt set; its identity is the SHA-256 of that configuration, so storing the same comparison
  again replaces it, as `ingest_result` does for a sweep;
- every member is registered as a model (with its numbers), the family as a `refit_families` row
  with the anchor, and its members in `refit_family_members` (replaced by the latest comparison);
- the records go into `results` (per layer and per head, with relative depth).

The family's current stability is its latest succeeded stability run under the current
`METRIC_VERSION` (`repositories.stability_run`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.models import ModelSpec
from compute.run import CODE_VERSION, METRIC_VERSION
from compute.stability import StabilityOptions
from compute.tokens import TokenSpec
from service.store.db import Store, raw_connection
from service.store.errors import IngestError
from service.store.families import write_settings
from service.store.ingest import bulk_insert, delete_run_rows
from service.store.registry import (
    model_identity,
    record_parity,
    register_model,
    register_token_source,
)
from service.store.rows import parse_model_info, prepare_rows
from service.store.runs import find_run
from service.store.tables import (
    RESULT_COLUMNS,
    RefitFamily,
    RefitFamilyMember,
    RefitFamilySettings,
    RunRow,
    utcnow,
)

STABILITY_FAMILY = "stability"


@dataclass(frozen=True)
class StabilityResult:
    """A computed stability comparison, ready to store."""

    family: str
    anchor: ModelSpec
    members: list[tuple[ModelSpec, dict[str, Any]]]  # every member (anchor included) + describe()
    records: pa.Table
    options: dict[str, Any]
    prompts: TokenSpec
    device: str = "cpu"
    wall_s: float = 0.0
    environment: dict[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        return stability_config(
            self.family, self.anchor, [s for s, _ in self.members], self.options, self.prompts
        )

    def config_hash(self) -> str:
        return config_hash(self.config())


def stability_config(
    family: str,
    anchor: ModelSpec,
    members: Sequence[ModelSpec],
    options: dict[str, Any],
    prompts: TokenSpec,
) -> dict[str, Any]:
    """A stability computation's configuration — the family, its anchor and members (their
    identities, in a canonical order), the options, the prompt set, the metric version: what a
    stability job is queued for and what its stored run is identified by (one definition for
    `strata stability --store`, the job service and the ingest of a worker's results)."""
    identities = sorted(
        (model_identity(s) for s in members), key=lambda m: json.dumps(m, sort_keys=True)
    )
    return {
        "kind": STABILITY_FAMILY,
        "refit_family": family,
        "anchor": model_identity(anchor),
        "members": identities,
        "options": options,
        "prompts": prompts.model_dump(mode="json"),
        "families": [STABILITY_FAMILY],
        "metric_version": METRIC_VERSION,
    }


def config_hash(config: dict[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class StabilitySummary:
    run_id: int
    family_id: int
    anchor_model_id: int
    replaced: bool
    results: int


def _refuse_managed(session: Session, name: str) -> None:
    """A comparison stored outside a job defines its family's members; a family made through
    the families API keeps the members that API gave it (with its architecture and anchor
    checks): `IngestError`, nothing stored."""
    family = session.scalars(sa.select(RefitFamily).where(RefitFamily.name == name)).one_or_none()
    settings = session.get(RefitFamilySettings, family.id) if family is not None else None
    if settings is not None and settings.origin == "api":
        raise IngestError(
            f"refit family {name!r} is managed through the families API: change its members "
            f"there (POST/DELETE /api/v1/families/{name}/members) and compute it with POST "
            f"/api/v1/families/{name}/stability, or store this comparison under another name"
        )


def ingest_stability(
    store: Store,
    result: StabilityResult,
    *,
    keep_members: bool = False,
    also: Callable[[Session, StabilitySummary], None] | None = None,
) -> StabilitySummary:
    """Store a stability comparison: members, family and the run, in one transaction.

    `strata stability --store` makes the family from the comparison (its members replaced by
    the compared ones, its settings the comparison's when it has none). A worker's stability
    job (`keep_members`) leaves the family as it is now: members may have joined or left while
    it computed, and the next recomputation follows them. `also(session, summary)` runs in the
    same transaction (the job service marks the job succeeded there).

    Raises `IngestError` (nothing stored) for malformed records, a name that is empty, a family
    with fewer than two members, an anchor that is not a member, or a family already stored with
    another anchor.
    """
    if not result.family.strip():
        raise IngestError("a refit family needs a name")
    specs = [s for s, _ in result.members]
    if len(specs) < 2:
        raise IngestError("a refit family needs at least two members (the anchor and a refit)")
    if model_identity(result.anchor) not in [model_identity(s) for s in specs]:
        raise IngestError("the anchor must be one of the family's members")
    infos = [parse_model_info(info) for _, info in result.members]
    anchor_info = infos[[model_identity(s) for s in specs].index(model_identity(result.anchor))]
    rows = prepare_rows(result.records, None, anchor_info)
    if rows.neurons.num_rows:
        raise IngestError("stability records hold no per-neuron moments")
    config_hash = result.config_hash()
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        models = [
            register_model(session, spec, info) for spec, info in zip(specs, infos, strict=True)
        ]
        session.flush()
        for model, info in zip(models, infos, strict=True):
            record_parity(session, model, info)  # each member's load, as registration's
        anchor = models[[model_identity(s) for s in specs].index(model_identity(result.anchor))]
        if keep_members:
            family = _existing_family(session, result.family)
        else:
            _refuse_managed(session, result.family)
            family = _family(session, result.family, anchor.id, [m.id for m in models])
            if session.get(RefitFamilySettings, family.id) is None:
                options = StabilityOptions.model_validate(result.options)
                write_settings(session, family.id, anchor.id, options, "cli")
        tokens = register_token_source(session, result.prompts)
        run = find_run(session, config_hash, METRIC_VERSION)
        replaced = run is not None and run.n_records is not None
        if run is None:
            run = RunRow(config_hash=config_hash, metric_version=METRIC_VERSION)
            session.add(run)
        now = utcnow()
        run.model_id, run.token_source_id = anchor.id, tokens.id
        run.code_version = result.environment.get("strata", CODE_VERSION)
        run.families, run.config = [STABILITY_FAMILY], result.config()
        run.status, run.progress, run.error = "succeeded", 1.0, None
        run.started_at = now - timedelta(seconds=max(result.wall_s, 0.0))
        run.finished_at = now
        run.device, run.dtype = result.device, result.anchor.dtype
        run.tokens_evaluated = result.prompts.n_sequences * result.prompts.seq_len
        run.wall_s, run.environment = result.wall_s, dict(result.environment)
        run.n_records = rows.n_records
        session.flush()
        if replaced:
            delete_run_rows(session, run.id)
        bulk_insert(raw_connection(conn), "results", RESULT_COLUMNS, run.id, rows.results)
        session.flush()
        summary = StabilitySummary(run.id, family.id, anchor.id, replaced, rows.results.num_rows)
        if also is not None:
            also(session, summary)
        return summary


def _existing_family(session: Session, name: str) -> RefitFamily:
    family = session.scalars(sa.select(RefitFamily).where(RefitFamily.name == name)).one_or_none()
    if family is None:
        raise IngestError(f"no refit family {name!r} is stored: the job's family is gone")
    return family


def _family(session: Session, name: str, anchor_id: int, member_ids: list[int]) -> RefitFamily:
    family = session.scalars(sa.select(RefitFamily).where(RefitFamily.name == name)).one_or_none()
    if family is None:
        family = RefitFamily(
            name=name,
            anchor_model_id=anchor_id,
            description=f"refits compared against model {anchor_id}",
        )
        session.add(family)
        session.flush()
    elif _anchor_of(session, family) != anchor_id:
        raise IngestError(
            f"refit family {name!r} is stored with anchor model {_anchor_of(session, family)}, not "
            f"{anchor_id}: give this comparison another family name"
        )
    session.execute(sa.delete(RefitFamilyMember).where(RefitFamilyMember.family_id == family.id))
    session.add_all(
        [RefitFamilyMember(family_id=family.id, model_id=m) for m in dict.fromkeys(member_ids)]
    )
    session.flush()
    return family


def _anchor_of(session: Session, family: RefitFamily) -> int:
    settings = session.get(RefitFamilySettings, family.id)
    return settings.anchor_model_id if settings is not None else family.anchor_model_id
