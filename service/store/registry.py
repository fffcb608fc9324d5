"""Registering what a run refers to: its model and its token source (get or create by hash)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from compute.models import ModelSpec
from compute.tokens import TokenSpec
from service.store.errors import IngestError
from service.store.rows import ModelInfo
from service.store.tables import ParityReportRow, RegisteredModelRow, TokenSource

# Architecture numbers that must agree between a registered model and new results for it.
_SHAPE = ("n_layers", "d_model", "n_heads", "d_mlp", "d_vocab", "d_vocab_real", "n_ctx", "n_params")


def _sha256(data: dict[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def model_identity(spec: ModelSpec) -> dict[str, Any]:
    """The part of a model spec that identifies the analysed model (dtype belongs to the run)."""
    data = spec.model_dump(mode="json")
    data.pop("dtype", None)
    return data


def model_spec_hash(spec: ModelSpec) -> str:
    return _sha256(model_identity(spec))


def token_spec_hash(spec: TokenSpec) -> str:
    return _sha256(spec.model_dump(mode="json"))


def default_model_name(spec: ModelSpec) -> str:
    """The name a model is registered under when none is given: a checkpoint directory's
    folder name or a GGUF file's stem (not its absolute path, which no URL can carry);
    otherwise the spec's name."""
    if spec.source == "hf_dir":
        return Path(spec.name).name or spec.name
    if spec.source == "gguf":  # the file's stem: SmolLM2-135M-Instruct.Q4_1
        return Path(spec.name).stem or spec.name
    return spec.name


def find_model(session: Session, spec: ModelSpec) -> RegisteredModelRow | None:
    """The model registered for `spec` (same identity: spec without dtype), if any."""
    return session.scalars(
        sa.select(RegisteredModelRow).where(RegisteredModelRow.spec_hash == model_spec_hash(spec))
    ).one_or_none()


def register_model(
    session: Session, spec: ModelSpec, info: ModelInfo | None, *, name: str | None = None
) -> RegisteredModelRow:
    """The registered model for `spec`, created if new (under `name`, default the spec's name);
    its numbers filled from `info`.

    Refuses results whose model disagrees with the registered numbers (the same reference now
    names other weights), so they are never mixed under one model.
    """
    model = find_model(session, spec)
    if model is None:
        model = RegisteredModelRow(
            spec_hash=model_spec_hash(spec),
            name=name or default_model_name(spec),
            source=spec.source,
            revision=spec.revision,
            spec=model_identity(spec),
        )
        session.add(model)
    if info is not None:
        _fill_numbers(model, info)
    session.flush()
    return model


def fill_known_numbers(model: RegisteredModelRow, numbers: dict[str, Any]) -> None:
    """Fill the numbers known before the model is loaded (from its configuration alone, e.g.
    n_layers); the rest stay unknown until results arrive. `numbers` keys are column names."""
    for key, value in numbers.items():
        if key not in (*_SHAPE, "architecture", "normalization_type", "parallel_attn_mlp"):
            raise ValueError(f"{key!r} is not a model number")
        setattr(model, key, value)


def _fill_numbers(model: RegisteredModelRow, info: ModelInfo) -> None:
    # Numbers registered before any results (from a configuration alone) may be partial:
    # compare those that are known.
    known = [k for k in _SHAPE if getattr(model, k) is not None]
    if known:
        differ = [
            f"{k} {getattr(model, k)} -> {getattr(info, k)}"
            for k in known
            if getattr(model, k) != getattr(info, k)
        ]
        if differ:
            raise IngestError(
                f"model {model.name!r} (id {model.id}) is registered with other numbers than "
                f"these results' model ({'; '.join(differ)}): the reference now names different "
                "weights; give it a revision to register it as a new model"
            )
    for key in _SHAPE:
        setattr(model, key, getattr(info, key))
    model.architecture = info.architecture
    model.normalization_type = info.normalization_type
    model.parallel_attn_mlp = info.parallel_attn_mlp
    applied = info.processing
    model.fold_ln = applied.fold_ln
    model.center_writing_weights = applied.center_writing_weights
    model.center_unembed = applied.center_unembed
    model.fold_value_biases = applied.fold_value_biases
    model.processing_notes = list(applied.notes)


def record_parity(
    session: Session, model: RegisteredModelRow, info: ModelInfo, run_id: int | None = None
) -> None:
    """Append what this load of `model` measured (its parity report and experts per layer)."""
    if info.parity is None:
        return
    session.add(
        ParityReportRow(
            model_id=model.id,
            run_id=run_id,
            dtype=str(info.parity.get("dtype", "float32")),
            n_experts=info.n_experts,
            report=info.parity,
        )
    )


def register_token_source(session: Session, spec: TokenSpec) -> TokenSource:
    spec_hash = token_spec_hash(spec)
    source = session.scalars(
        sa.select(TokenSource).where(TokenSource.spec_hash == spec_hash)
    ).one_or_none()
    if source is None:
        source = TokenSource(
            spec_hash=spec_hash,
            source=spec.source,
            path=spec.path,
            n_sequences=spec.n_sequences,
            seq_len=spec.seq_len,
            seed=spec.seed,
            fingerprint=spec.fingerprint,
            spec=spec.model_dump(mode="json"),
        )
        session.add(source)
        session.flush()
    return source
