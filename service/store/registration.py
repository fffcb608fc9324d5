"""Registering a model without computing anything: `POST /api/v1/models`, `strata models add`
(no service running), the watch folder and the zoo on a first start all call `register`.

The source is resolved with the model registry (`compute.models.resolve_model_spec`), which
never touches the network. Then the architecture numbers are recorded when they can be had
cheaply and offline:

- a zoo model or a checkpoint directory (which must lie under one of the given
  `checkpoint_roots`) is loaded once, as a run would load it, if its weights are no larger than
  `load_max_mb`: every number is recorded, and the processing actually applied;
- a TransformerLens official name gets the numbers its configuration gives, if TransformerLens
  knows it offline (built in, or in the local Hugging Face cache; never downloaded). The
  parameter count, the real vocabulary and the processing stay unknown until results arrive.

Numbers left unknown are null; the first ingest of results fills them, and checks the known ones
(`service.store.registry`). A refusal is a `RegistrationError` (a `SpecError`: HTTP 422, CLI
exit 2) or a `ModelConflictError` (HTTP 409, CLI exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from compute.errors import ModelLoadError, SpecError
from compute.models import ModelSpec, Processing, load_model, resolve_model_spec
from compute.models.unknown import looks_like_path
from service.store.db import Store
from service.store.errors import ModelConflictError, RegistrationError
from service.store.registry import (
    default_model_name,
    fill_known_numbers,
    find_model,
    record_parity,
    register_model,
)
from service.store.rows import ModelInfo, parse_model_info
from service.store.tables import RegisteredModelRow


@dataclass(frozen=True)
class Registration:
    """What to register: a model source and, optionally, its name, revision and processing."""

    source: str  # a zoo model (zoo:NAME), a checkpoint directory, a GGUF file, a TL name
    name: str | None = None  # default: the checkpoint folder's name, or the source's
    revision: str | None = None
    processing: Processing = field(default_factory=Processing)


def _checkpoint_dir(source: str) -> Path | None:
    """The local weights a source names, if it is a checkpoint directory or a GGUF file (not a
    zoo name)."""
    if source.startswith("zoo:"):
        return None
    try:
        path = Path(source)
        if source.lower().endswith(".gguf"):
            return path
        return path if (path / "config.json").is_file() else None
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte, ...
        return None


def _check_root(path: Path, checkpoint_roots: Sequence[Path] | None) -> None:
    if checkpoint_roots is None:  # anywhere on this machine (a loopback-only service)
        return
    resolved = path.resolve()
    for root in checkpoint_roots:
        if resolved.is_relative_to(root.resolve()):
            return
    raise RegistrationError(
        "checkpoint directories and GGUF files can be registered over HTTP only under a "
        "configured root (STRATA_API__CHECKPOINT_ROOTS) on a service that others can reach; "
        "this one is not under any (a service listening on loopback only takes any local "
        "path: STRATA_API__LOCAL_CHECKPOINTS)"
    )


def _weights_mb(path: Path) -> float:
    files = [path] if path.is_file() else [*path.glob("*.safetensors"), *path.glob("*.bin")]
    return sum(f.stat().st_size for f in files) / 2**20


def resolve(registration: Registration, checkpoint_roots: Sequence[Path] | None) -> ModelSpec:
    """The model spec a registration names; local weights must lie under a checkpoint root."""
    directory = _checkpoint_dir(registration.source)
    if directory is None and checkpoint_roots is not None and looks_like_path(registration.source):
        # Refused like a checkpoint outside the roots, so that the answer never says whether a
        # path outside them exists (`resolve_model_spec` would name a missing one).
        directory = Path(registration.source)
    if directory is not None:
        _check_root(directory, checkpoint_roots)
    try:
        return resolve_model_spec(
            registration.source, processing=registration.processing, revision=registration.revision
        )
    except (SpecError, ModelLoadError) as exc:  # unknown, or a GGUF file that fails its checks
        raise RegistrationError(str(exc)) from None


def loaded_numbers(spec: ModelSpec, load_max_mb: float) -> ModelInfo | None:
    """Every number, by loading the model (local weights no larger than the limit)."""
    from compute.zoo.paths import zoo_path

    path = zoo_path(spec.name) if spec.source == "zoo" else Path(spec.name)
    if _weights_mb(path) > load_max_mb:
        return None
    try:
        lm = load_model(spec, "cpu")
    except ModelLoadError as exc:
        raise RegistrationError(f"the checkpoint does not load: {exc}") from None
    return parse_model_info(lm.describe())


def offline_numbers(spec: ModelSpec) -> dict[str, Any]:
    """The numbers a TransformerLens official name's Hugging Face config gives, if it is in the
    local cache (nothing is downloaded)."""
    from transformers import AutoConfig

    from compute.models.sources import loading_name

    kwargs: dict[str, Any] = {"local_files_only": True}
    if spec.revision:
        kwargs["revision"] = spec.revision
    try:
        raw = AutoConfig.from_pretrained(loading_name(spec.name), **kwargs).to_dict()
    except Exception:  # not cached: the numbers stay unknown
        return {}

    def pick(*names: str) -> Any:
        return next((raw[n] for n in names if raw.get(n) is not None), None)

    numbers = {
        "architecture": (raw.get("architectures") or [None])[0],
        "n_layers": pick("num_hidden_layers", "n_layer", "n_layers"),
        "d_model": pick("hidden_size", "n_embd", "d_model"),
        "n_heads": pick("num_attention_heads", "n_head", "n_heads"),
        "d_mlp": pick("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
        "d_vocab": pick("vocab_size"),
        "n_ctx": pick("max_position_embeddings", "n_positions", "n_ctx"),
    }
    return {k: v for k, v in numbers.items() if v is not None}


def register(
    store: Store,
    registration: Registration,
    *,
    checkpoint_roots: Sequence[Path] | None,
    load_max_mb: float,
) -> tuple[RegisteredModelRow, bool]:
    """The registered model and whether it is new. An identical registration (same source,
    processing, revision and name) is answered with the existing model; the same model under
    another name is a `ModelConflictError`. Checkpoint directories and GGUF files must lie under
    one of `checkpoint_roots` (None: anywhere); those no larger than `load_max_mb` are loaded
    once for their numbers."""
    spec = resolve(registration, checkpoint_roots)
    name = registration.name or usable_name(default_model_name(spec))
    with store.read() as conn, Session(bind=conn) as session:
        existing = find_model(session, spec)
        if existing is not None:
            if existing.name != name:
                raise ModelConflictError(
                    f"{registration.source!r} with this processing and revision is registered "
                    f"already, as {existing.name!r} (id {existing.id})"
                )
            return existing, False
    info = loaded_numbers(spec, load_max_mb) if spec.source in ("zoo", "hf_dir", "gguf") else None
    numbers = offline_numbers(spec) if spec.source == "transformer_lens" else {}
    with store.write() as conn, Session(bind=conn, expire_on_commit=False) as session:
        existing = find_model(session, spec)  # registered meanwhile by another request
        if existing is not None:
            if existing.name != name:
                raise ModelConflictError(
                    f"{registration.source!r} was registered meanwhile as "
                    f"{existing.name!r} (id {existing.id})"
                )
            return existing, False
        model = register_model(session, spec, info, name=name)
        if info is not None:
            record_parity(session, model, info)
        if numbers:
            fill_known_numbers(model, numbers)
        session.flush()
        return model, True


def usable_name(name: str) -> str:
    """`name` made addressable in a URL: characters other than letters, digits and `._+-`
    become `-`; an all-digit name (ids are numbers) gets a `model-` prefix.

        >>> usable_name("second copy")
        'second-copy'
    """
    cleaned = re.sub(r"[^A-Za-z0-9._+-]", "-", name).lstrip("._+-")[:200] or "model"
    return f"model-{cleaned}" if cleaned.isdigit() else cleaned
