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

import contextlib
import gc
import hashlib
import itertools
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from compute.errors import ModelLoadError, UnknownModelError, UnsupportedArchitectureError
from compute.models.configs import converted_config
from compute.models.parity import ParityReference, hugging_face_reference, parity_tokens
from compute.models.processing import (
    AppliedProcessing,
    effective_processing,
    load_state_dict_into,
)
from compute.models.spec import TORCH_DTYPES, DType, ModelSpec, Processing
from compute.models.unknown import unknown_model_message
from compute.zoo.paths import ZOO_DIR, zoo_path
from compute.zoo.planted import PLANTED, planted_checksum, planted_weights


@dataclass
class SourceLoad:
    """What a source hands `load_model`: the processed model, its tokenizer (or None), the
    processing applied, and the Hugging Face reference for the parity report (None, with the
    reason, where the model has no Hugging Face original). A model with a reference is built
    in float32 on the CPU: `load_model` measures parity there, then moves it to the run's
    device and dtype."""

    model: Any
    tokenizer: Any
    applied: AppliedProcessing
    reference: ParityReference | None = None
    no_reference: str = ""


class ModelSource(Protocol):
    name: str

    def recognises(self, ref: str) -> bool: ...
    def canonical_name(self, ref: str) -> str: ...
    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        """The processed model and what comes with it."""
        ...


def import_engine() -> None:
    """Import what loading any model needs (TransformerLens, its loaders and weight
    processing, transformers' auto classes) without loading one: a worker does this before its
    pool forks, so that every pool process starts with them (imports only; no torch op runs).
    """
    import transformer_lens
    import transformer_lens.loading_from_pretrained
    import transformer_lens.weight_processing  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401


def _hooked_transformer() -> Any:
    from transformer_lens import HookedTransformer

    return HookedTransformer


class HFDirSource:
    """A local Hugging Face checkpoint: config.json, safetensors weights and tokenizer files.

    `HookedTransformer.from_pretrained(dir)` refuses local directories in TransformerLens 3.9, so
    the config is converted and the weights translated with TransformerLens's own converters.
    """

    name = "hf_dir"

    def recognises(self, ref: str) -> bool:
        return (Path(ref) / "config.json").is_file()

    def canonical_name(self, ref: str) -> str:
        return str(Path(ref).resolve())

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        import transformer_lens.loading_from_pretrained as loading
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = spec.name
        with _readable_config(Path(path)) as config_dir:
            try:
                cfg_dict = converted_config(config_dir)
            except UnsupportedArchitectureError as exc:
                raise UnsupportedArchitectureError(f"{path}: {exc}") from None
            except Exception as exc:
                raise UnsupportedArchitectureError(
                    f"{path}: TransformerLens cannot read this checkpoint's config.json ({exc}). "
                    "Supported: the architectures listed in docs/architectures.md."
                ) from exc
            _refuse_unexact(cfg_dict, path)
            applied = effective_processing(spec.processing, cfg_dict)
            with _converted_as(cfg_dict):
                cfg = loading.get_pretrained_model_config(
                    config_dir, fold_ln=applied.fold_ln, device="cpu", dtype=torch.float32
                )
        cfg.model_name = Path(path).name
        # A checkpoint without tokenizer files is usable with pre-tokenized (.npy) input only.
        tokenizer = AutoTokenizer.from_pretrained(path) if _has_tokenizer(Path(path)) else None
        if tokenizer is None:
            cfg.tokenizer_name = None  # else TransformerLens fetches one by the config's name
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        vocab = min(int(cfg.d_vocab_out), len(tokenizer)) if tokenizer is not None else None
        bos = _bos(tokenizer)
        # The parity reference: the Hugging Face model's own forward, run while it is loaded.
        reference = hugging_face_reference(
            hf_model, parity_tokens(vocab or int(cfg.d_vocab_out), bos, int(cfg.n_ctx))
        )
        state_dict = loading.get_pretrained_state_dict(path, cfg, hf_model, dtype=torch.float32)
        # The converted tensors are copies (or views that keep only their own storage alive):
        # free the Hugging Face model's weights now, not at the end of the load.
        free_module_tensors(hf_model, keep=state_dict.values())
        del hf_model
        # The model is built in float32 on the host, uninitialised (its pages are never touched
        # before the weights land); the state dict is processed in float32 and each tensor
        # copied into place, key by key. `load_model` measures parity, then casts the model to
        # the run's dtype and moves it to the run's device (folding in float32 and casting after
        # keeps low-precision runs accurate).
        cfg.init_weights = False
        model = _hooked_transformer()(cfg, tokenizer, move_to_device=True)
        load_state_dict_into(model, state_dict, applied)
        del state_dict
        return SourceLoad(model, tokenizer, applied, reference)


def free_module_tensors(module: torch.nn.Module, keep: Iterable[torch.Tensor] = ()) -> None:
    """Hand a module's parameter and buffer memory back now: each tensor's data becomes an
    empty tensor, so its storage is freed by reference counting once nothing else holds it.
    Tensors in `keep` (the very objects a converted state dict took over) are left alone; a
    view taken of one keeps its own storage alive either way. This frees what a full
    `gc.collect()` would have, were the module's objects in reference cycles, without one: a
    collection walks every object the process holds, up to a second a load in a worker or a
    test process that has made many."""
    kept = {id(t) for t in keep}
    with torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if id(tensor) not in kept:
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def _bos(tokenizer: Any) -> int:
    for attr in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


# Mechanisms TransformerLens 3.9 converts but runs differently from Hugging Face: refused by
# name before anything is loaded (the parity check would refuse them anyway, by a number).
_UNEXACT: tuple[tuple[str, str], ...] = ()


def _refuse_unexact(cfg_dict: dict[str, Any], path: str) -> None:
    architecture = cfg_dict.get("original_architecture")
    for arch, why in _UNEXACT:
        if architecture == arch:
            raise UnsupportedArchitectureError(f"{path}: {arch}: {why}")


@contextlib.contextmanager
def _converted_as(cfg_dict: dict[str, Any]) -> Iterator[None]:
    """TransformerLens's `get_pretrained_model_config` with its config conversion replaced by
    `cfg_dict` (built by `compute.models.configs`), so that the rest of its processing — the
    folded norm's name, the dtype, the defaults — is TransformerLens's own."""
    import transformer_lens.loading_from_pretrained as loading

    convert = loading.convert_hf_model_config
    loading.convert_hf_model_config = lambda *_a, **_k: dict(cfg_dict)
    try:
        yield
    finally:
        loading.convert_hf_model_config = convert


def _has_tokenizer(path: Path) -> bool:
    return any(
        (path / f).is_file()
        for f in ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json")
    )


@contextlib.contextmanager
def _readable_config(path: Path) -> Iterator[str]:
    """A directory holding a copy of the checkpoint's config.json that TransformerLens 3.9 can
    convert; the weights are still read from the original directory.

    The copy always goes to a neutrally named temporary directory: TransformerLens infers the
    architecture from the *name* of any path containing "llama" or "gemma" and then never reads
    the config at all (`/models/llama-3-8b` fails; a Mistral folder named `my-llama-tune` would
    be loaded with Llama's hard-coded dimensions). GPT-2 configs saved by transformers 5 lack
    `n_ctx`, which TransformerLens reads: for GPT-2 n_ctx means n_positions, so it is added.
    """
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}/config.json is unreadable: {exc}") from exc
    if raw.get("model_type") == "gpt2" and "n_ctx" not in raw and "n_positions" in raw:
        raw = {**raw, "n_ctx": raw["n_positions"]}
    with tempfile.TemporaryDirectory(prefix="strata-config-") as tmp:
        directory = Path(tmp) / "checkpoint"
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(raw))
        yield str(directory)


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
    from transformer_lens import HookedTransformerConfig

    fields, state, tokenizer = planted_weights(spec.name)
    applied = effective_processing(spec.processing, fields)
    model = _hooked_transformer()(
        HookedTransformerConfig(**fields, device=device), tokenizer, move_to_device=True
    )
    load_state_dict_into(model, {**model.state_dict(), **state}, applied)
    model.to(TORCH_DTYPES[spec.dtype], print_details=False)
    return SourceLoad(
        model,
        tokenizer,
        applied,
        no_reference="a planted control built by Strata from explicit "
        "weights: there is no Hugging Face original to compare with",
    )


class TransformerLensSource:
    """A TransformerLens official model name. Downloads from the Hugging Face hub."""

    name = "transformer_lens"

    def recognises(self, ref: str) -> bool:
        import transformer_lens.loading_from_pretrained as loading

        try:
            loading.get_official_model_name(ref)
        except ValueError:
            return False
        return True

    def canonical_name(self, ref: str) -> str:
        import transformer_lens.loading_from_pretrained as loading

        return str(loading.get_official_model_name(ref))

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        from transformers import AutoModelForCausalLM

        kwargs = {"revision": spec.revision} if spec.revision else {}
        applied = effective_processing(spec.processing, _official_config(spec.name, kwargs))
        try:
            # The Hugging Face original, loaded once: TransformerLens converts it, and its own
            # forward is the parity reference. Official names that are not Hugging Face models
            # (TransformerLens's own checkpoints) are loaded by TransformerLens alone.
            hf_model: Any = AutoModelForCausalLM.from_pretrained(
                loading_name(spec.name), dtype=torch.float32, **kwargs
            ).eval()
        except Exception:
            hf_model = None
        try:
            model = _hooked_transformer().from_pretrained(
                spec.name,
                fold_ln=applied.fold_ln,
                center_writing_weights=applied.center_writing_weights,
                center_unembed=applied.center_unembed,
                fold_value_biases=applied.fold_value_biases,
                device="cpu",
                dtype=torch.float32,
                hf_model=hf_model,
                **kwargs,
            )
        except OSError as exc:
            raise ModelLoadError(
                f"could not fetch {spec.name!r} from the Hugging Face hub ({exc}). "
                "Without network, "
                "use a local checkpoint directory or a zoo model."
            ) from exc
        if hf_model is None:
            return SourceLoad(
                model, model.tokenizer, applied, no_reference="not a Hugging Face model"
            )
        tokenizer = model.tokenizer
        vocab = min(int(model.cfg.d_vocab_out), len(tokenizer)) if tokenizer is not None else None
        tokens = parity_tokens(
            vocab or int(model.cfg.d_vocab_out), _bos(tokenizer), int(model.cfg.n_ctx)
        )
        reference = hugging_face_reference(hf_model, tokens)
        del hf_model
        gc.collect()
        return SourceLoad(model, tokenizer, applied, reference)


def loading_name(name: str) -> str:
    """The Hugging Face repository of a TransformerLens official name."""
    import transformer_lens.loading_from_pretrained as loading

    return str(loading.get_official_model_name(name))


def _official_config(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    import transformer_lens.loading_from_pretrained as loading

    try:
        return dict(loading.get_pretrained_model_config(name, **kwargs).to_dict())
    except Exception:  # config unavailable (offline); loading the weights will say why
        return {"normalization_type": "LN"}


class RandomSource:
    """Randomly initialised weights: `ModelSpec(source="random", architecture={...}, seed=s)`."""

    name = "random"

    def recognises(self, ref: str) -> bool:
        return False  # never chosen from a string reference; built explicitly

    def canonical_name(self, ref: str) -> str:
        return ref

    def load(self, spec: ModelSpec, device: str) -> SourceLoad:
        from transformer_lens import HookedTransformerConfig

        if spec.architecture is None or spec.seed is None:
            raise ModelLoadError("a random model needs `architecture` and `seed`")
        arch = dict(spec.architecture)
        applied = effective_processing(spec.processing, {"normalization_type": "LN", **arch})
        cfg = HookedTransformerConfig(
            **{**arch, "seed": spec.seed, "device": device, "init_weights": True}
        )
        model = _hooked_transformer()(cfg, move_to_device=True)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if applied.fold_ln:
            model.cfg.normalization_type = {"LN": "LNPre", "RMS": "RMSPre"}.get(
                model.cfg.normalization_type, model.cfg.normalization_type
            )
            model = _hooked_transformer()(model.cfg, move_to_device=True)
        load_state_dict_into(model, state, applied)
        model.to(TORCH_DTYPES[spec.dtype], print_details=False)
        return SourceLoad(
            model, None, applied, no_reference="random weights: there is no Hugging Face original"
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
