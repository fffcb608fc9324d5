"""Trained lenses as artifacts: one safetensors file per lens under `<data_dir>/lenses/`, named
by its key, written once and reused by every later run that asks for the same lens.

A trained lens's key is the first 16 hex digits of SHA-256 of the canonical JSON of (the model
spec, the token source of its training split — source, path, fingerprint, seed, seq_len, not
n_sequences — and the training configuration); an imported lens's key hashes the model spec and
the imported file's SHA-256. A stored lens is never retrained: `provide_lens` loads it when its
key exists and trains only when it does not, and says which it did.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from compute.engine import ProgressFn
from compute.errors import LensError
from compute.lens.config import LensTraining, lens_dir
from compute.lens.training import train_translators
from compute.lens.translators import (
    BASIS_HUGGINGFACE,
    BASIS_STRATA,
    LensInfo,
    TunedLens,
    read_lens_file,
    read_lens_metadata,
    stack_translators,
)
from compute.models import LoadedModel, ModelSpec
from compute.tokens import TokenSpec, training_windows


def _digest(data: dict[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def token_source(spec: TokenSpec) -> dict[str, Any]:
    """The part of a (resolved) token spec that fixes a training split."""
    return {
        "source": spec.source,
        "path": spec.path,
        "fingerprint": spec.fingerprint,
        "seed": spec.seed,
        "seq_len": spec.seq_len,
    }


def lens_key(model: ModelSpec, tokens: TokenSpec, training: LensTraining) -> str:
    """The key of the lens trained for `model` on the training split of `tokens`."""
    return _digest(
        {
            "model": model.model_dump(mode="json"),
            "tokens": token_source(tokens),
            "training": training.model_dump(mode="json", exclude={"lens"}),
        }
    )


class LensStore:
    """Lens files in one folder: `<key>.safetensors`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else lens_dir()

    def path(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise LensError(f"{key!r} is not a lens key (16 hex digits; `strata lens list`)")
        return self.root / f"{key}.safetensors"

    def _stored(self, key: str) -> Path:
        """The file of a stored lens; a LensError naming what to do when there is none."""
        path = self.path(key)
        if not path.is_file():
            raise LensError(
                f"no stored lens {key} in {self.root}; `strata lens list` shows the stored "
                "ones, `strata lens import` adds one"
            )
        return path

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str) -> TunedLens:
        path = self._stored(key)
        tensors, meta = read_lens_file(path)
        info = _stored_info(meta, path)
        weight, bias = stack_translators(
            tensors, n_layers=info.n_layers, d_model=info.d_model, what=str(path)
        )
        return TunedLens(weight, bias, info)

    def info(self, key: str) -> LensInfo:
        """A stored lens's identity, from its file's header (the translators are not read)."""
        path = self._stored(key)
        return _stored_info(read_lens_metadata(path), path)

    def put(self, lens: TunedLens) -> Path:
        path = self.path(lens.info.key)
        lens.save(path)
        return path

    def list(self) -> list[LensInfo]:
        if not self.root.is_dir():
            return []
        return [self.get(p.stem).info for p in sorted(self.root.glob("*.safetensors"))]

    def export(self, key: str, dest: Path) -> Path:
        """Copy a stored lens's file (safetensors, its identity in the metadata) to `dest`."""
        source = self.path(key)
        self.get(key)  # refuse a missing or unreadable lens before writing anything
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        return dest


def check_fits(lens: TunedLens, lm: LoadedModel) -> None:
    """A lens applies to this model: its shape, and a residual basis the model's run has."""
    check_fits_spec(
        lens.info,
        lm.spec,
        n_layers=lm.n_layers,
        d_model=lm.d_model,
        centred=lm.applied.center_writing_weights,
    )


def check_fits_spec(
    info: LensInfo,
    spec: ModelSpec,
    *,
    n_layers: int | None,
    d_model: int | None,
    centred: bool | None,
) -> None:
    """`check_fits` without the loaded model: from the model's spec and its numbers as a
    registration recorded them (None: not known, not checked), so that a job naming a lens is
    refused at submission. Also refuses a lens stored for a model of another name."""
    name = info.model.get("name")
    if name is not None and name != spec.name:
        raise LensError(
            f"lens {info.key} was made for model {name}, not {spec.name}; `strata lens list` "
            "shows each lens's model"
        )
    if (n_layers is not None and info.n_layers != n_layers) or (
        d_model is not None and info.d_model != d_model
    ):
        raise LensError(
            f"lens {info.key} is for {info.n_layers} layers of width {info.d_model}; "
            f"{spec.name} has {n_layers} of width {d_model}"
        )
    if info.basis == BASIS_HUGGINGFACE and centred:
        raise LensError(
            f"lens {info.key} was fitted on the Hugging Face model's hidden states, but this "
            "run centres the writing weights, which changes the residual stream the translators "
            "read; run with --no-processing (processing that leaves the residual as it is)"
        )
    processing = spec.model_dump(mode="json")["processing"]
    if info.basis == BASIS_STRATA and info.model.get("processing") != processing:
        raise LensError(
            f"lens {info.key} was trained under processing {info.model.get('processing')}"
            f"; this run asks for {processing}"
        )


def import_lens(path: Path, lm: LoadedModel, store: LensStore) -> TunedLens:
    """Import a safetensors lens for this model: a Strata export (its identity kept) or a
    tuned-lens package lens converted to safetensors (keys `<i>.weight`, `<i>.bias`). Refused,
    with what differs, when its shapes or keys do not match the model."""
    tensors, meta = read_lens_file(path)
    weight, bias = stack_translators(
        tensors, n_layers=lm.n_layers, d_model=lm.d_model, what=str(path)
    )
    file_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = lm.spec.model_dump(mode="json")
    if meta is not None:
        info = LensInfo(**{k: v for k, v in meta.items() if k != "format"})
        if info.model and info.model.get("name") != spec["name"]:
            raise LensError(
                f"{path} was trained for {info.model.get('name')}; this model is {spec['name']}"
            )
    else:
        info = LensInfo(
            key=_digest({"model": spec, "imported": file_sha}),
            n_layers=lm.n_layers,
            d_model=lm.d_model,
            basis=BASIS_HUGGINGFACE,
            model=spec,
            training={"imported": path.name, "sha256": file_sha},
        )
    lens = TunedLens(weight, bias, info)
    check_fits(lens, lm)
    store.put(lens)
    return lens


def provide_lens(
    lm: LoadedModel,
    tokens: TokenSpec,
    training: LensTraining,
    store: LensStore,
    progress: ProgressFn | None = None,
) -> tuple[TunedLens, dict[str, Any]]:
    """The lens a run evaluates, and how it was obtained (`trained`: true only when it was
    trained by this call). `training.lens` set: that stored lens. Otherwise the lens of this
    (model, token source, training) key: loaded when stored, else trained on the training split
    (which never overlaps the run's windows: refused when the text is too short for both) and
    stored."""
    if training.lens is not None:
        lens = store.get(training.lens)
        check_fits(lens, lm)
        return lens, {"key": lens.info.key, "trained": False, "source": "stored"}
    train_tokens = training_windows(
        tokens,
        lm.tokenizer,
        n_training=training.train_sequences,
        bos_token_id=lm.bos_token_id,
        d_vocab=lm.d_vocab,
        n_ctx=lm.n_ctx,
    )
    key = lens_key(lm.spec, tokens, training)
    if store.has(key):
        lens = store.get(key)
        check_fits(lens, lm)
        return lens, {"key": key, "trained": False, "source": "stored", **lens.info.report}
    weight, bias, report = train_translators(lm, train_tokens, training, progress)
    info = LensInfo(
        key=key,
        n_layers=lm.n_layers,
        d_model=lm.d_model,
        basis=BASIS_STRATA,
        model=lm.spec.model_dump(mode="json"),
        tokens=token_source(tokens),
        training=training.model_dump(mode="json", exclude={"lens"}),
        report=report,
    )
    lens = TunedLens(weight.cpu(), bias.cpu(), info)
    store.put(lens)
    return lens, {"key": key, "trained": True, "source": "trained", **report}


def _stored_info(meta: dict[str, Any] | None, path: Path) -> LensInfo:
    """A stored lens's identity from its file's Strata metadata (refused without any)."""
    if meta is None:
        raise LensError(f"{path} has no Strata metadata: not a stored lens")
    return LensInfo(**{k: v for k, v in meta.items() if k != "format"})
