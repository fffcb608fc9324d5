"""The registry of model sources: a user's reference becomes a `ModelSpec`
(`resolve_model_spec`), and a spec becomes processed TransformerLens weights (`load_model` in
`compute.models.loaded` asks the source the spec names).

Sources (looked up in `SOURCES`, in order):
  zoo               a tiny model that ships with Strata (`compute/zoo/checkpoints/<name>`) or a
                    planted control built by code (`compute.zoo.planted`)
  hf_dir            a local Hugging Face checkpoint directory (every architecture of the
                    matrix in `compute/zoo/architectures.py`, held to Hugging Face's forward)
  gguf              a llama.cpp GGUF file, dequantized once into a cached checkpoint directory
                    (`compute.gguf`) and then loaded as `hf_dir`
  transformer_lens  a TransformerLens official name (`gpt2`, `pythia-410m-deduped`, ...): needs
                    network or a warm Hugging Face cache
  random            randomly initialised weights with a given architecture (tests, null baselines)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from compute.blocks import has_post_sublayer_norms
from compute.errors import ModelLoadError, UnknownModelError, UnsupportedArchitectureError
from compute.models.bridge import (
    apply_processing,
    boot_hf,
    boot_native,
    import_bridge,
    to_dtype,
)
from compute.models.parity import ParityReference, hugging_face_reference, parity_tokens
from compute.models.processing import AppliedProcessing, effective_processing
from compute.models.refusals import refusal_of
from compute.models.spec import TORCH_DTYPES, DType, ModelSpec, Processing
from compute.models.unknown import unknown_model_message
from compute.zoo.paths import ZOO_DIR, zoo_path
from compute.zoo.planted import PLANTED, planted_checksum, planted_weights


@dataclass
class SourceLoad:
    """What a source hands `load_model`: the processed bridge, its tokenizer (or None), the
    processing applied, and the Hugging Face reference for the parity report (None, with the
    reason, where the model has no Hugging Face original). A model with a reference is built
    in float32 on the CPU: `load_model` measures parity there, then moves it to the run's
    device and dtype."""

    model: Any
    tokenizer: Any
    applied: AppliedProcessing
    reference: ParityReference | None = None
    no_reference: str = ""
    architecture: str | None = None


class ModelSource(Protocol):
    name: str

    def recognises(self, ref: str) -> bool: ...
    def canonical_name(self, ref: str) -> str: ...
    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        """The processed model and what comes with it."""
        ...


def import_engine() -> None:
    """Import what loading any model needs (TransformerLens's bridge, transformers' auto
    classes) without loading one: a worker does this before its pool forks, so that every pool
    process starts with them (imports only; no torch op runs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import_bridge()


class HFDirSource:
    """A local Hugging Face checkpoint: config.json, safetensors weights and tokenizer files.

    The architecture is checked against TransformerLens's adapters (and Strata's own refusals)
    from config.json alone, before anything heavy is imported or any weight read; the model is
    then loaded by transformers, its forward taken as the parity reference, and wrapped in a
    TransformerLens bridge, which processes the weights in place.
    """

    name = "hf_dir"

    def recognises(self, ref: str) -> bool:
        return (Path(ref) / "config.json").is_file()

    def canonical_name(self, ref: str) -> str:
        return str(Path(ref).resolve())

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        path = Path(spec.name)
        architecture = checkpoint_architecture(path)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # A checkpoint without tokenizer files is usable with pre-tokenized (.npy) input only.
        tokenizer = AutoTokenizer.from_pretrained(str(path)) if _has_tokenizer(path) else None
        hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        return bridged(hf_model, architecture, tokenizer, spec.processing, path.name)


def bridged(
    hf_model: Any, architecture: str, tokenizer: Any, processing: Processing, name: str
) -> SourceLoad:
    """A loaded Hugging Face model's parity reference (its own forward, before anything of
    TransformerLens touches it), then its bridge, processed as `processing` allows."""
    config = hf_model.config
    d_vocab = int(hf_model.get_output_embeddings().weight.shape[0])
    vocab = min(d_vocab, len(tokenizer)) if tokenizer is not None else d_vocab
    n_ctx = int(
        _first(config, "max_position_embeddings", "n_positions", "n_ctx", "seq_length") or 2048
    )
    reference = hugging_face_reference(hf_model, parity_tokens(vocab, _bos(tokenizer), n_ctx))
    bridge = boot_hf(hf_model, architecture, name)
    applied = effective_processing(processing, processing_fields(bridge, architecture))
    apply_processing(bridge, applied)
    return SourceLoad(bridge, tokenizer, applied, reference, architecture=architecture)


def _first(config: Any, *names: str) -> Any:
    return next((getattr(config, n) for n in names if getattr(config, n, None)), None)


def processing_fields(bridge: Any, architecture: str) -> dict[str, Any]:
    """What `effective_processing` reads of a model: its norm, architecture, logit soft-cap,
    post-sublayer norms and attention sinks."""
    cfg = bridge.cfg
    post_norms = has_post_sublayer_norms(bridge)
    return {
        "normalization_type": cfg.normalization_type,
        "original_architecture": architecture,
        "output_logits_soft_cap": cfg.output_logits_soft_cap,
        "use_normalization_before_and_after": post_norms
        or bool(getattr(cfg, "use_normalization_before_and_after", False)),
        "use_attention_sinks": bool(getattr(cfg, "use_attention_sinks", False)),
        # steps the adapter declares it cannot take (TransformerLens skips them, with a warning)
        "adapter_folds_ln": bool(getattr(bridge.adapter, "supports_fold_ln", True)),
        "adapter_centers_writes": bool(
            getattr(bridge.adapter, "supports_center_writing_weights", True)
        ),
    }


def checkpoint_architecture(path: Path) -> str:
    """The architecture config.json names, if TransformerLens adapts it and Strata does not
    refuse it; `UnsupportedArchitectureError` naming the reason otherwise. Reads config.json
    only: nothing heavy is imported and no weight is read."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}/config.json is unreadable: {exc}") from exc
    names = raw.get("architectures") or []
    if not names:
        raise UnsupportedArchitectureError(
            f"{path}: config.json names no architecture (its `architectures` list is empty)"
        )
    architecture = str(names[0])
    refusal = refusal_of(architecture, raw)
    if refusal is not None:
        raise UnsupportedArchitectureError(f"{path}: {architecture}: {refusal}")
    return architecture


def _bos(tokenizer: Any) -> int:
    for attr in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


def _has_tokenizer(path: Path) -> bool:
    return any(
        (path / f).is_file()
        for f in ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json")
    )


class ZooSource(HFDirSource):
    """The tiny models that ship with Strata: `zoo:<name>` or a bare zoo name."""

    name = "zoo"

    def recognises(self, ref: str) -> bool:
        if ref.startswith("zoo:"):
            return True
        return "/" not in ref and ((ZOO_DIR / ref / "config.json").is_file() or _is_planted(ref))

    def canonical_name(self, ref: str) -> str:
        return ref.removeprefix("zoo:")

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        if _is_planted(spec.name):
            return _load_planted(spec, device)
        path = zoo_path(spec.name)
        if not (path / "config.json").is_file():
            available = ", ".join(zoo_names()) or "none built yet (run `strata zoo train`)"
            raise UnknownModelError(f"no zoo model named {spec.name!r}; available: {available}")
        return super().load(spec.model_copy(update={"name": str(path)}), device)


class GGUFSource(HFDirSource):
    """A GGUF file (`path/to/model.gguf`): dequantized once into a cached Hugging Face checkpoint
    (`compute.gguf.dequantized_checkpoint`), which is then loaded like any checkpoint folder."""

    name = "gguf"

    def recognises(self, ref: str) -> bool:
        return ref.lower().endswith(".gguf")

    def canonical_name(self, ref: str) -> str:
        return str(Path(ref).resolve())

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        from compute.gguf import dequantized_checkpoint

        sha = spec.revision.removeprefix("sha256:") if spec.revision else None
        checkpoint, info = dequantized_checkpoint(
            Path(spec.name), sha if sha and len(sha) == 64 else None
        )
        if spec.quantization is not None and spec.quantization != info.quantization:
            raise ModelLoadError(
                f"{spec.name}: the file is now {info.quantization}, the run "
                f"asked for {spec.quantization}: the file changed"
            )
        loaded = super().load(spec.model_copy(update={"name": str(checkpoint)}), device)
        loaded.model.cfg.model_name = Path(spec.name).stem
        return loaded


def _is_planted(name: str) -> bool:
    return name in PLANTED


def _load_planted(spec: ModelSpec, device: str) -> SourceLoad:
    """A planted-structure control (`compute.zoo.planted`): built from explicit weights."""
    fields, state, tokenizer = planted_weights(spec.name)
    bridge = boot_native(fields, state, seed=None)
    applied = effective_processing(spec.processing, fields)
    apply_processing(bridge, applied)
    bridge.to(device, print_details=False)
    to_dtype(bridge, TORCH_DTYPES[spec.dtype])
    return SourceLoad(
        bridge,
        tokenizer,
        applied,
        no_reference="a planted control built by Strata from explicit "
        "weights: there is no Hugging Face original to compare with",
        architecture="planted",
    )


class TransformerLensSource:
    """A TransformerLens official model name (`gpt2`, `pythia-410m-deduped`, ...): its Hugging
    Face checkpoint, downloaded from the hub (needs network or a warm cache)."""

    name = "transformer_lens"

    def recognises(self, ref: str) -> bool:
        try:
            loading_name(ref)
        except ValueError:
            return False
        return True

    def canonical_name(self, ref: str) -> str:
        return ref

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        repo = loading_name(spec.name)
        kwargs = {"revision": spec.revision} if spec.revision else {}
        try:
            config = AutoConfig.from_pretrained(repo, **kwargs)
            architecture = str((config.architectures or [""])[0])
            refusal = refusal_of(architecture, config.to_dict())
            if refusal is not None:
                raise UnsupportedArchitectureError(f"{spec.name}: {architecture}: {refusal}")
            tokenizer = AutoTokenizer.from_pretrained(repo, **kwargs)
            hf_model = AutoModelForCausalLM.from_pretrained(
                repo, dtype=torch.float32, **kwargs
            ).eval()
        except OSError as exc:
            raise ModelLoadError(
                f"could not fetch {spec.name!r} from the Hugging Face hub ({exc}). "
                "Without network, use a local checkpoint directory or a zoo model."
            ) from exc
        return bridged(hf_model, architecture, tokenizer, spec.processing, spec.name)


def loading_name(name: str) -> str:
    """The Hugging Face repository of a TransformerLens official name (ValueError if none)."""
    from transformer_lens.supported_models import get_official_model_name

    return str(get_official_model_name(name))


class RandomSource:
    """Randomly initialised weights: `ModelSpec(source="random", architecture={...}, seed=s)`,
    with `architecture` HookedTransformer config fields (TransformerLens's native model)."""

    name = "random"

    def recognises(self, ref: str) -> bool:
        return False  # never chosen from a string reference; built explicitly

    def canonical_name(self, ref: str) -> str:
        return ref

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        if spec.architecture is None or spec.seed is None:
            raise ModelLoadError("a random model needs `architecture` and `seed`")
        arch = {"normalization_type": "LN", **spec.architecture}
        if arch.get("parallel_attn_mlp"):
            raise ModelLoadError(
                "a random model cannot have parallel attention and MLP: TransformerLens 4's "
                "native blocks are sequential (use a Hugging Face checkpoint, e.g. GPT-NeoX)"
            )
        try:
            bridge = boot_native(arch, None, seed=spec.seed)
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"random architecture {arch}: {exc}") from exc
        applied = effective_processing(spec.processing, arch)
        apply_processing(bridge, applied)
        bridge.to(device, print_details=False)
        to_dtype(bridge, TORCH_DTYPES[spec.dtype])
        return SourceLoad(
            bridge, None, applied, no_reference="random weights: there is no Hugging Face original"
        )


SOURCES: dict[str, ModelSource] = {
    s.name: s
    for s in (ZooSource(), GGUFSource(), HFDirSource(), TransformerLensSource(), RandomSource())
}


def zoo_names() -> list[str]:
    """Shipped checkpoints and the planted controls built by code (`compute.zoo.planted`)."""
    shipped = (
        [p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file()]
        if ZOO_DIR.is_dir()
        else []
    )
    return sorted({*shipped, *PLANTED})


def resolve_model_spec(
    ref: str,
    *,
    dtype: DType = "float32",
    processing: Processing | None = None,
    revision: str | None = None,
) -> ModelSpec:
    """Turn a user's model reference into a spec, choosing the source from the registry."""
    for source in SOURCES.values():
        if source.recognises(ref):
            if source.name == "gguf":
                return _gguf_spec(ref, dtype=dtype, processing=processing)
            return ModelSpec(
                source=source.name,
                name=source.canonical_name(ref),
                revision=revision or _checksum(source.name, ref),
                dtype=dtype,
                processing=processing or Processing(),
            )
    raise UnknownModelError(unknown_model_message(ref, zoo_names()))


def _gguf_spec(ref: str, *, dtype: DType, processing: Processing | None) -> ModelSpec:
    """A GGUF file's spec: its full SHA-256 as the revision and its quantization type, both read
    (and the file checked) before anything is dequantized."""
    from compute.gguf import inspect_gguf

    info = inspect_gguf(Path(ref))
    return ModelSpec(
        source="gguf",
        name=str(Path(ref).resolve()),
        revision="sha256:" + info.sha256,
        quantization=info.quantization,
        dtype=dtype,
        processing=processing or Processing(),
    )


def _checksum(source: str, ref: str) -> str | None:
    """A content checksum for local weights, so a run can tell when a checkpoint changed."""
    if source == "zoo" and _is_planted(ref.removeprefix("zoo:")):
        return planted_checksum(ref.removeprefix("zoo:"))
    if source == "zoo":
        ref = str(zoo_path(ref.removeprefix("zoo:")))
    elif source != "hf_dir":
        return None
    digest = hashlib.sha256()
    for weights in sorted(Path(ref).glob("*.safetensors")) + sorted(Path(ref).glob("*.bin")):
        with weights.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()[:16]
