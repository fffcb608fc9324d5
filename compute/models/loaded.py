"""Model specs, the registry of model sources, and the model layer.

This is the only module that boots TransformerLens. Everything else talks to a `LoadedModel`,
which exposes exactly the operations the metrics need: embed, run one block (optionally with a
component or heads zeroed, optionally capturing the attention pattern), unembed through the final
norm, and the processed weights.

Sources (looked up in `SOURCES`, in order):
  zoo               a tiny model that ships with Strata (`compute/zoo/checkpoints/<name>`)
  hf_dir            a local Hugging Face checkpoint directory (GPT-2, GPT-NeoX, GPT-Neo and
                    Llama verified against Hugging Face's forward)
  gguf              a llama.cpp GGUF file, dequantized once into a cached checkpoint directory
                    (`compute.gguf`) and then loaded as `hf_dir`
  transformer_lens  a TransformerLens official name (`gpt2`, `pythia-410m-deduped`, ...): needs
                    network or a warm Hugging Face cache
  random            randomly initialised weights with a given architecture (tests, null baselines)

>>> spec = resolve_model_spec("zoo:tiny-4l-s0")   # doctest: +SKIP
>>> lm = load_model(spec)                           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from jaxtyping import Float, Int
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from compute import blocks
from compute.errors import ModelLoadError, StrataError, UnknownModelError
from compute.memory import ModelDims, check_fits

DType = Literal["float32", "bfloat16", "float16"]
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
ZOO_DIR = Path(__file__).parent / "zoo" / "checkpoints"

log = logging.getLogger(__name__)


class Processing(BaseModel):
    """TransformerLens weight processing requested for a run (docs/metrics.md, shared
    conventions)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    fold_ln: bool = True
    center_writing_weights: bool = True
    center_unembed: bool = True
    fold_value_biases: bool = True


class ModelSpec(BaseModel):
    """Everything that identifies the weights a run analyses. Stored with every run."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: Literal["zoo", "hf_dir", "gguf", "transformer_lens", "random"]
    name: str
    revision: str | None = None
    # Only for weights read from a quantized file (source="gguf"): its quantization type, e.g.
    # "Q4_1". Left out of the identity when None, so specs from before it keep their hashes.
    quantization: str | None = Field(default=None, exclude_if=lambda v: v is None)
    dtype: DType = "float32"
    processing: Processing = Processing()
    # Only for source="random": HookedTransformerConfig fields and the init seed.
    architecture: dict[str, Any] | None = None
    seed: int | None = None


class ModelSource(Protocol):
    name: str

    def recognises(self, ref: str) -> bool: ...
    def canonical_name(self, ref: str) -> str: ...
    def load(self, spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:
        """The processed model, its tokenizer (or None), and the processing applied."""
        ...


@dataclass(frozen=True)
class AppliedProcessing:
    """What processing was actually applied, and why anything requested was not."""

    fold_ln: bool
    center_writing_weights: bool
    center_unembed: bool
    fold_value_biases: bool
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "fold_ln": self.fold_ln,
            "center_writing_weights": self.center_writing_weights,
            "center_unembed": self.center_unembed,
            "fold_value_biases": self.fold_value_biases,
            "notes": list(self.notes),
        }


def effective_processing(requested: Processing,
                         normalization_type: str | None) -> AppliedProcessing:
    """Processing that can honestly be applied given the model's normalisation."""
    notes: list[str] = []
    center = requested.center_writing_weights
    fold = requested.fold_ln
    if normalization_type is not None and normalization_type.startswith("RMS") and center:
        center = False
        notes.append("RMSNorm does not remove the mean: writing weights were not centered")
    if normalization_type is None and fold:
        fold = False
        notes.append("model has no normalisation: nothing to fold")
    return AppliedProcessing(fold, center, requested.center_unembed, requested.fold_value_biases,
                             tuple(notes))


# --------------------------------------------------------------------------- sources


def _hooked_transformer() -> Any:
    from transformer_lens import HookedTransformer

    return HookedTransformer


def _load_state_dict_into(model: Any, state_dict: dict[str, Tensor],
                          applied: AppliedProcessing) -> None:
    with _processing_block_by_block(model):
        model.load_and_process_state_dict(
            state_dict,
            fold_ln=applied.fold_ln,
            center_writing_weights=applied.center_writing_weights,
            center_unembed=applied.center_unembed,
            fold_value_biases=applied.fold_value_biases,
            refactor_factored_attn_matrices=False,
        )


def _place(model: Any, key: str, value: Tensor) -> Tensor:
    """Copy a processed tensor into the model's own parameter (cast to its dtype and device) and
    return that parameter, so that the processed float32 copy is freed at once; `value` itself
    where the model has no such tensor or its shape differs (`load_state_dict` then decides)."""
    try:
        target = model.get_parameter(key)
    except AttributeError:
        return value
    if target.shape != value.shape:
        return value
    with torch.no_grad():
        target.copy_(value)
    return target


@contextlib.contextmanager
def _processing_block_by_block(model: Any) -> Iterator[None]:
    """TransformerLens's weight processing applied one block at a time.

    `ProcessWeights.process_weights` works on the whole state dict at once and keeps the
    unprocessed and processed versions of every tensor (and its temporaries) alive together:
    for GPT-2 small that is 2.3 GB on top of 0.6 GB of weights, the peak of a whole run. Every
    step of it is local to a block (folding a block's norms into its own weights, centering its
    writes, folding its value biases) or to the embeddings and unembedding, so it is applied to
    one block's keys at a time (renamed to block 0 of a one-layer config) and then to the rest,
    each source tensor released as soon as its block is done and each processed tensor copied
    into the model's own parameter at once (`_place`): the float32 processed state dict never
    exists whole next to the model. The processed tensors are identical; if a step needs keys
    outside a block (KeyError) the whole dict is processed as before.
    """
    from transformer_lens.weight_processing import ProcessWeights

    whole = ProcessWeights.process_weights

    def by_block(state_dict: dict[str, Tensor], cfg: Any, **kwargs: Any) -> dict[str, Tensor]:
        import copy

        one, rest = copy.copy(cfg), copy.copy(cfg)
        one.n_layers, rest.n_layers = 1, 0
        blocks_ = [{"blocks.0." + k.split(".", 2)[2]: k for k in state_dict
                    if k.startswith(f"blocks.{layer}.")} for layer in range(cfg.n_layers)]
        others = [k for k in state_dict if not k.startswith("blocks.")]
        # Centering insists on finding the embeddings and unembedding in any dict it is given:
        # a block's dict gets a one-row (two-column) stand-in of each, dropped afterwards.
        stand_ins: dict[str, Tensor] = {
            k: state_dict[k][:1].clone() for k in ("embed.W_E", "pos_embed.W_pos")
            if k in state_dict}
        stand_ins |= {k: state_dict[k][..., :2].clone() for k in ("unembed.W_U", "unembed.b_U")
                      if k in state_dict}

        def block_dict(names: dict[str, str], take: Callable[[str], Tensor]) -> dict[str, Tensor]:
            return {**{new: take(old) for new, old in names.items()},
                    **{k: v.clone() for k, v in stand_ins.items()}}

        out: dict[str, Tensor] = {}

        def place(done: dict[str, Tensor], keys: dict[str, str]) -> None:
            for k, v in done.items():
                if k in keys:
                    out[keys[k]] = _place(model, keys[k], v)

        # The embeddings, then the unembedding and final norm (each with stand-ins of the other),
        # then block 0: first and without consuming anything, so that a step needing keys
        # outside its part (KeyError) can still fall back to processing the whole dict. They go
        # first because the model's pages are then still untouched: their transients (several
        # vocabulary-sized copies) do not add to a nearly full model.
        embeds = [k for k in others if k.startswith(("embed.", "pos_embed."))]
        firsts: list[str] = []
        try:
            for group in (embeds, [k for k in others if k not in embeds]):
                part = {k: v.clone() for k, v in stand_ins.items() if k not in group}
                part.update({k: state_dict[k] for k in group})
                place(whole(part, rest, **kwargs), {k: k for k in group})
                firsts += group
                del part
            if blocks_:
                place(whole(block_dict(blocks_[0], state_dict.__getitem__), one, **kwargs),
                      {new: "blocks.0." + new.split(".", 2)[2] for new in blocks_[0]})
                firsts += blocks_[0].values()
        except KeyError:
            return whole(state_dict, cfg, **kwargs)
        for key in firsts:
            del state_dict[key]
        for layer, names in enumerate(blocks_[1:], start=1):
            prefix = f"blocks.{layer}."
            place(whole(block_dict(names, state_dict.pop), one, **kwargs),
                  {new: prefix + new.split(".", 2)[2] for new in names})
        return out

    ProcessWeights.process_weights = staticmethod(by_block)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ProcessWeights.process_weights = staticmethod(whole)  # type: ignore[method-assign]


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

    def load(self, spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:
        import transformer_lens.loading_from_pretrained as loading
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = spec.name
        with _readable_config(Path(path)) as config_dir:
            try:
                cfg_dict = loading.convert_hf_model_config(config_dir)
            except Exception as exc:
                raise ModelLoadError(
                    f"{path}: TransformerLens cannot read this checkpoint's config.json ({exc}). "
                    "Supported: the architectures TransformerLens converts (GPT-2, GPT-NeoX, ...)."
                ) from exc
            applied = effective_processing(spec.processing, cfg_dict.get("normalization_type"))
            cfg = loading.get_pretrained_model_config(config_dir, fold_ln=applied.fold_ln,
                                                      device=device, dtype=torch.float32)
        cfg.model_name = Path(path).name
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        state_dict = loading.get_pretrained_state_dict(path, cfg, hf_model, dtype=torch.float32)
        # The converted tensors are copies (or views that keep only their own storage alive):
        # free the Hugging Face model now, not at the end of the load.
        del hf_model
        gc.collect()
        # A checkpoint without tokenizer files is usable with pre-tokenized (.npy) input only.
        tokenizer = AutoTokenizer.from_pretrained(path) if _has_tokenizer(Path(path)) else None
        if tokenizer is None:
            cfg.tokenizer_name = None  # else TransformerLens fetches one by the config's name
        # The model is built straight in the run's dtype on the run's device, uninitialised
        # (its pages are never touched before the weights land): the state dict is processed
        # in float32 on the host and each tensor is cast and copied into place, key by key.
        # Folding in float32 and casting after keeps low-precision runs accurate.
        cfg.dtype = TORCH_DTYPES[spec.dtype]
        cfg.init_weights = False
        model = _hooked_transformer()(cfg, tokenizer, move_to_device=True)
        _load_state_dict_into(model, state_dict, applied)
        del state_dict
        return model, tokenizer, applied


def _has_tokenizer(path: Path) -> bool:
    return any((path / f).is_file() for f in
               ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json"))


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
        return "/" not in ref and ((ZOO_DIR / ref / "config.json").is_file()
                                   or _is_planted(ref))

    def canonical_name(self, ref: str) -> str:
        return ref.removeprefix("zoo:")

    def load(self, spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:
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

    def load(self, spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:
        from compute.gguf import dequantized_checkpoint

        sha = spec.revision.removeprefix("sha256:") if spec.revision else None
        checkpoint, info = dequantized_checkpoint(Path(spec.name), sha if sha and len(sha) == 64
                                                  else None)
        if spec.quantization is not None and spec.quantization != info.quantization:
            raise ModelLoadError(f"{spec.name}: the file is now {info.quantization}, the run "
                                 f"asked for {spec.quantization}: the file changed")
        model, tokenizer, applied = super().load(
            spec.model_copy(update={"name": str(checkpoint)}), device)
        model.cfg.model_name = Path(spec.name).stem
        return model, tokenizer, applied


def _is_planted(name: str) -> bool:
    from compute.zoo.planted import PLANTED

    return name in PLANTED


def _load_planted(spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:
    """A planted-structure control (`compute.zoo.planted`): built from explicit weights."""
    from transformer_lens import HookedTransformerConfig

    from compute.zoo.planted import planted_weights

    fields, state, tokenizer = planted_weights(spec.name)
    applied = effective_processing(spec.processing, None)
    model = _hooked_transformer()(HookedTransformerConfig(**fields, device=device), tokenizer,
                                  move_to_device=True)
    _load_state_dict_into(model, {**model.state_dict(), **state}, applied)
    model.to(TORCH_DTYPES[spec.dtype])
    return model, tokenizer, applied


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

    def load(self, spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:

        kwargs = {"revision": spec.revision} if spec.revision else {}
        applied = effective_processing(spec.processing, _official_normalization(spec.name, kwargs))
        try:
            model = _hooked_transformer().from_pretrained(
                spec.name, fold_ln=applied.fold_ln,
                center_writing_weights=applied.center_writing_weights,
                center_unembed=applied.center_unembed, fold_value_biases=applied.fold_value_biases,
                device=device, dtype=TORCH_DTYPES[spec.dtype], **kwargs)
        except OSError as exc:
            raise ModelLoadError(
                f"could not fetch {spec.name!r} from the Hugging Face hub ({exc}). "
                "Without network, "
                "use a local checkpoint directory or a zoo model."
            ) from exc
        return model, model.tokenizer, applied


def _official_normalization(name: str, kwargs: dict[str, Any]) -> str | None:
    import transformer_lens.loading_from_pretrained as loading

    try:
        return loading.get_pretrained_model_config(name, **kwargs).normalization_type
    except Exception:  # config unavailable (offline); loading the weights will say why
        return "LN"


class RandomSource:
    """Randomly initialised weights: `ModelSpec(source="random", architecture={...}, seed=s)`."""

    name = "random"

    def recognises(self, ref: str) -> bool:
        return False  # never chosen from a string reference; built explicitly

    def canonical_name(self, ref: str) -> str:
        return ref

    def load(self, spec: ModelSpec, device: str) -> tuple[Any, Any, AppliedProcessing]:
        from transformer_lens import HookedTransformerConfig

        if spec.architecture is None or spec.seed is None:
            raise ModelLoadError("a random model needs `architecture` and `seed`")
        arch = dict(spec.architecture)
        applied = effective_processing(spec.processing, arch.get("normalization_type", "LN"))
        cfg = HookedTransformerConfig(**{**arch, "seed": spec.seed, "device": device,
                                         "init_weights": True})
        model = _hooked_transformer()(cfg, move_to_device=True)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if applied.fold_ln:
            model.cfg.normalization_type = {"LN": "LNPre", "RMS": "RMSPre"}.get(
                model.cfg.normalization_type, model.cfg.normalization_type)
            model = _hooked_transformer()(model.cfg, move_to_device=True)
        _load_state_dict_into(model, state, applied)
        model.to(TORCH_DTYPES[spec.dtype])
        return model, None, applied


SOURCES: dict[str, ModelSource] = {
    s.name: s for s in (ZooSource(), GGUFSource(), HFDirSource(), TransformerLensSource(),
                        RandomSource())
}


def zoo_path(name: str) -> Path:
    return ZOO_DIR / name


def zoo_names() -> list[str]:
    """Shipped checkpoints and the planted controls built by code (`compute.zoo.planted`)."""
    from compute.zoo.planted import PLANTED

    shipped = [p.name for p in ZOO_DIR.iterdir()
               if (p / "config.json").is_file()] if ZOO_DIR.is_dir() else []
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
            return ModelSpec(source=source.name, name=source.canonical_name(ref),
                             revision=revision or _checksum(source.name, ref), dtype=dtype,
                             processing=processing or Processing())
    hint = ", ".join(zoo_names()[:8])
    raise UnknownModelError(
        f"unknown model {ref!r}: not a zoo model ({hint}), not a directory with config.json, "
        "and not a TransformerLens official name (e.g. gpt2, pythia-410m-deduped)"
    )


def _gguf_spec(ref: str, *, dtype: DType, processing: Processing | None) -> ModelSpec:
    """A GGUF file's spec: its full SHA-256 as the revision and its quantization type, both read
    (and the file checked) before anything is dequantized."""
    from compute.gguf import inspect_gguf

    info = inspect_gguf(Path(ref))
    return ModelSpec(source="gguf", name=str(Path(ref).resolve()), revision="sha256:" +
                     info.sha256, quantization=info.quantization, dtype=dtype,
                     processing=processing or Processing())


def _checksum(source: str, ref: str) -> str | None:
    """A content checksum for local weights, so a run can tell when a checkpoint changed."""
    if source == "zoo" and _is_planted(ref.removeprefix("zoo:")):
        from compute.zoo.planted import planted_checksum

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


# --------------------------------------------------------------------------- the model layer


@dataclass
class BlockRun:
    """The result of running one block: its output residual and what it wrote."""

    resid: Float[Tensor, "batch pos d_model"]
    attn_out: Float[Tensor, "batch pos d_model"]
    mlp_out: Float[Tensor, "batch pos d_model"] | None
    pattern: Float[Tensor, "batch head q k"] | None = None
    z: Float[Tensor, "batch pos head d_head"] | None = None


@dataclass
class LoadedModel:
    """A processed TransformerLens model plus the few operations the metrics are built from."""

    spec: ModelSpec
    model: Any
    tokenizer: Any
    applied: AppliedProcessing
    device: str
    _ctx: dict[str, Any] = field(default_factory=dict)

    # ---- architecture numbers
    @property
    def cfg(self) -> Any:
        return self.model.cfg

    @property
    def n_layers(self) -> int:
        return int(self.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.cfg.n_heads)

    @property
    def d_model(self) -> int:
        return int(self.cfg.d_model)

    @property
    def d_mlp(self) -> int:
        return 0 if self.cfg.attn_only else int(self.cfg.d_mlp)

    @property
    def d_vocab(self) -> int:
        return int(self.cfg.d_vocab_out)

    @property
    def n_ctx(self) -> int:
        return int(self.cfg.n_ctx)

    @property
    def has_mlp(self) -> bool:
        return not self.cfg.attn_only

    @property
    def d_vocab_real(self) -> int:
        """Vocabulary size without padding columns of W_U beyond the tokenizer's vocabulary."""
        if self.tokenizer is None:
            return self.d_vocab
        return min(self.d_vocab, len(self.tokenizer))

    @property
    def bos_token_id(self) -> int:
        tok = self.tokenizer
        for attr in ("bos_token_id", "eos_token_id"):
            value = getattr(tok, attr, None) if tok is not None else None
            if value is not None:
                return int(value)
        return 0

    @property
    def dtype_bytes(self) -> int:
        return int(next(self.model.parameters()).element_size())

    @property
    def n_params(self) -> int:
        return int(sum(p.numel() for p in self.model.parameters()))

    def describe(self) -> dict[str, Any]:
        """Architecture numbers and processing, as stored with a registered model."""
        return {
            "architecture": str(self.cfg.original_architecture or "HookedTransformer"),
            "n_layers": self.n_layers, "d_model": self.d_model, "n_heads": self.n_heads,
            "d_mlp": self.d_mlp, "d_vocab": self.d_vocab, "d_vocab_real": self.d_vocab_real,
            "n_ctx": self.n_ctx, "n_params": self.n_params,
            "normalization_type": self.cfg.normalization_type,
            "parallel_attn_mlp": bool(self.cfg.parallel_attn_mlp),
            "processing": self.applied.as_dict(),
        }

    # ---- forward pieces
    def embed(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """Residual stream before block 0 (token + positional embedding as the model does it)."""
        resid, _, shortformer, _ = self.model.input_to_embed(tokens)
        self._ctx["shortformer"] = shortformer
        return resid

    def run_block(
        self,
        layer: int,
        resid: Float[Tensor, "batch pos d_model"],
        *,
        zero_attn: bool = False,
        zero_mlp: bool = False,
        head_mask: Float[Tensor, "batch head"] | None = None,
        capture_pattern: bool = False,
        capture_z: bool = False,
    ) -> BlockRun:
        """Run block `layer` on `resid`.

        `zero_attn` / `zero_mlp` zero that component's residual write (biases included);
        `head_mask` multiplies each head's z (1 keeps, 0 ablates), row by row of the batch;
        `capture_z` returns each head's z (for ablations that subtract one head's write).
        Supported architectures run the fast forward of `compute.blocks`; the rest run the
        TransformerLens block with hooks.
        """
        block = self.model.blocks[layer]
        if self.fast_path:
            return self._run_fast_block(layer, resid, zero_attn=zero_attn, zero_mlp=zero_mlp,
                                        head_mask=head_mask, capture_pattern=capture_pattern)
        captured: dict[str, Tensor] = {}

        def attn_hook(_m: Any, _i: Any, out: Tensor) -> Tensor:
            captured["attn"] = torch.zeros_like(out) if zero_attn else out
            return captured["attn"]

        def mlp_hook(_m: Any, _i: Any, out: Tensor) -> Tensor:
            captured["mlp"] = torch.zeros_like(out) if zero_mlp else out
            return captured["mlp"]

        def pattern_hook(_m: Any, _i: Any, out: Tensor) -> None:
            captured["pattern"] = out

        def z_hook(_m: Any, _i: Any, z: Tensor) -> Tensor:
            if head_mask is not None:
                z = z * head_mask[:, None, :, None].to(z.dtype)
            captured["z"] = z
            return z

        hooks: list[tuple[Any, Callable[..., Any]]] = [(block.hook_attn_out, attn_hook)]
        if self.has_mlp:
            hooks.append((block.hook_mlp_out, mlp_hook))
        if capture_pattern:
            hooks.append((block.attn.hook_pattern, pattern_hook))
        if head_mask is not None or capture_z:
            hooks.append((block.attn.hook_z, z_hook))
        with _forward_hooks(hooks):
            out = block(resid, shortformer_pos_embed=self._ctx.get("shortformer"))
        return BlockRun(out, captured["attn"], captured.get("mlp"), captured.get("pattern"),
                        captured.get("z"))

    def _run_fast_block(self, layer: int, resid: Tensor, *, zero_attn: bool, zero_mlp: bool,
                        head_mask: Tensor | None, capture_pattern: bool) -> BlockRun:
        block = self.model.blocks[layer]
        weights = self._fast_weights(layer)
        attn_out, z, pattern = blocks.attention(
            block, weights, blocks.norm(block.ln1, resid), head_mask=head_mask,
            capture_pattern=capture_pattern)
        if zero_attn:
            attn_out = torch.zeros_like(attn_out)
        if not self.has_mlp:
            return BlockRun(resid + attn_out, attn_out, None, pattern, z)
        mlp_in = resid if self.parallel else resid + attn_out
        mlp_out = blocks.mlp(block, self.cfg, blocks.norm(block.ln2, mlp_in), weights)
        if zero_mlp:
            mlp_out = torch.zeros_like(mlp_out)
        out = resid + attn_out + mlp_out if self.parallel else mlp_in + mlp_out
        return BlockRun(out, attn_out, mlp_out, pattern, z)

    def run_mlp(self, layer: int, resid: Float[Tensor, "batch pos d_model"]
                ) -> Float[Tensor, "batch pos d_model"]:
        """Block `layer`'s MLP write given the residual it reads (resid_mid, or resid_pre for
        parallel attention/MLP): its norm, the MLP, and nothing else."""
        block = self.model.blocks[layer]
        if self.fast_path:
            return blocks.mlp(block, self.cfg, blocks.norm(block.ln2, resid),
                              self._fast_weights(layer))
        return block.apply_mlp(block.ln2(resid))

    def head_writes(self, layer: int, z: Float[Tensor, "batch pos head d_head"],
                    heads: list[int]) -> Float[Tensor, "group batch pos d_model"]:
        """What each of `heads` adds to the residual stream (its z through its rows of W_O).

        The attention write is b_O plus the sum of these over heads, so zeroing one head's z
        changes the write by exactly minus its term (when `attn_write_is_linear_in_z`).
        """
        # A contiguous group is a slice: indexing with a list would copy it to the device
        # and wait there.
        pick: slice | list[int] = heads
        if heads == list(range(heads[0], heads[-1] + 1)):
            pick = slice(heads[0], heads[-1] + 1)
        w_o = self.model.blocks[layer].attn.W_O.detach()[pick]  # [g, d_head, d_model]
        return torch.einsum("bphk,hkd->hbpd", z[:, :, pick], w_o)

    @property
    def attn_write_is_linear_in_z(self) -> bool:
        """True when the attention write is b_O + sum over heads of z_h W_O[h] (no norm after
        attention, no grouped or quantised projections)."""
        return self.fast_path or (
            not self.cfg.use_normalization_before_and_after and not self.cfg.load_in_4bit
            and self.cfg.n_key_value_heads in (None, self.cfg.n_heads))

    @property
    def parallel(self) -> bool:
        return bool(self.cfg.parallel_attn_mlp)

    @property
    def fast_path(self) -> bool:
        """Whether every block runs the fast forward of `compute.blocks` (decided once)."""
        if "fast_path" not in self._ctx:
            self._ctx["fast_path"] = all(blocks.supports(self.cfg, b) for b in self.model.blocks)
        return bool(self._ctx["fast_path"])

    def _fast_weights(self, layer: int) -> blocks.FastWeights:
        cache = self._ctx.setdefault("fast_weights", {})
        if layer not in cache:
            cache[layer] = blocks.fast_weights(self.model.blocks[layer])
        return cache[layer]

    def logits(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """Final norm (recomputed on this residual), W_U, b_U and any logit soft-cap: the same
        arithmetic as TransformerLens's Unembed."""
        x = self.normed(resid)
        flat = x.reshape(-1, x.shape[-1])
        return self.logit_columns(flat, 0, self.d_vocab).view(*x.shape[:-1], self.d_vocab)

    def normed(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The final norm of a residual (identity for models without one)."""
        if self.cfg.normalization_type is None:
            return resid
        return blocks.norm(self.model.ln_final, resid) if self.fast_path else \
            self.model.ln_final(resid)

    def logit_columns(self, x: Float[Tensor, "n d_model"], start: int, stop: int
                      ) -> Float[Tensor, "n cols"]:
        """Logits of vocabulary columns start..stop-1 of a normed residual: one `addmm` on a
        column range of W_U as stored ([d_model, vocab]; BLAS reads it in place, no copy)."""
        from transformer_lens.utilities import apply_softcap

        unembed = self.model.unembed
        logits = torch.addmm(unembed.b_U[start:stop], x, unembed.W_U.detach()[:, start:stop])
        return apply_softcap(logits, self.cfg.output_logits_soft_cap)

    def forget_derived_weights(self) -> None:
        """Drop copies derived from the weights (fused attention matrices), e.g. after editing
        weights in place."""
        self._ctx.pop("fast_weights", None)

    # ---- processed weights
    def w_out(self, layer: int) -> Float[Tensor, "d_mlp d_model"]:
        return self.model.blocks[layer].mlp.W_out.detach()

    def w_u(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.model.unembed.W_U.detach()

    def token_strings(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [f"<{i}>" for i in ids]
        return [self.tokenizer.decode([i]) for i in ids]


@contextlib.contextmanager
def _forward_hooks(hooks: list[tuple[Any, Callable[..., Any]]]) -> Iterator[None]:
    handles = [module.register_forward_hook(fn) for module, fn in hooks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# glibc malloc options (mallopt parameters).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc on Linux (mallopt, malloc_trim), else None. Looked up
    once: `find_library` runs a subprocess, and `release_free_memory` is called per batch."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _mallopt(*settings: tuple[int, int]) -> None:
    """Set glibc malloc parameters; a no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        for param, value in settings:
            libc.mallopt(param, value)


def allocator_for_loading() -> None:
    """Make glibc hand every freed allocation above 256 KiB back to the system at once.

    By default glibc raises its mmap threshold each time a large block is freed (up to 32 MB),
    after which tensors of a few MB come from the heap and their memory is kept, fragmented,
    when they are freed: loading GPT-2 small then left 0.6 GB more resident than the weights,
    and peaked 0.3 GB higher. A fixed threshold keeps the process at weights plus what is live.
    Process-wide; `allocator_for_sweeping` undoes it.
    """
    _mallopt((_M_MMAP_THRESHOLD, 256 * 1024), (_M_TRIM_THRESHOLD, 128 * 1024))


def allocator_for_sweeping() -> None:
    """Keep freed temporaries of up to 32 MiB in the heap for reuse while sweeping.

    The sweep allocates and frees the same few-MB temporaries (logit blocks, MLP activations)
    thousands of times. Handed back to the system at each free (as while loading), every one
    is page-faulted in afresh on its next use: an `intervention` sweep of GPT-2 small took 36 s
    that way, 26 s with glibc's default and 21 s with this setting. Larger tensors (the
    reference distribution, caches) are still mapped and unmapped on their own. Process-wide.
    """
    _mallopt((_M_MMAP_THRESHOLD, 32 * 2**20), (_M_TRIM_THRESHOLD, 64 * 2**20))


def release_free_memory() -> None:
    """Hand the heap's free memory back to the system (glibc `malloc_trim`): called between
    batches, so what one batch freed does not stay resident under the next step (the neurons
    family, the next model). A no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def load_model(spec: ModelSpec, device: str = "cpu") -> LoadedModel:
    """Load and process the weights a spec names. The one entry point to TransformerLens."""
    allocator_for_loading()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available here")
    dims = _dims_before_loading(spec)
    if dims is not None:  # refuse what will not fit before loading anything
        check_fits(dims, spec.dtype, device, name=spec.name)
    source = SOURCES[spec.source]
    try:
        model, tokenizer, applied = source.load(spec, device)
    except StrataError:
        raise
    except Exception as exc:  # a loader's own error (corrupt weights, ...): one type for callers
        raise ModelLoadError(f"{spec.name} could not be loaded: {type(exc).__name__}: {exc}"
                             ) from exc
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(spec=spec, model=model, tokenizer=tokenizer, applied=applied, device=device)



def _dims_before_loading(spec: ModelSpec) -> ModelDims | None:
    """The model's dimensions from its config alone (None where that needs the network)."""
    if spec.source == "random" and spec.architecture is not None:
        try:
            return ModelDims.from_tl_config(spec.architecture)
        except (KeyError, TypeError, ValueError):
            return None
    if spec.source in ("zoo", "hf_dir"):
        path = zoo_path(spec.name) if spec.source == "zoo" else Path(spec.name)
        return ModelDims.from_hf_config(path)
    return None  # a GGUF file's dimensions are checked once its checkpoint exists (hf_dir)
