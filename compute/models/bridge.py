"""TransformerLens 4's `TransformerBridge` as Strata's one way into a model.

Every model Strata loads — a Hugging Face checkpoint, a GGUF file dequantized into one, a hub
name, a planted control or random weights — becomes a bridge: TransformerLens's hook points and
HookedTransformer-style weight views (`blocks[i].attn.W_Q`, `unembed.W_U`, ...) over the
model's own modules. Hugging Face models keep their own forward (the adapter for their
architecture maps the modules); Strata's planted and random models are TransformerLens's native
model (`boot_native`), built from HookedTransformer-layout tensors.

Which architectures the bridge adapts is read from TransformerLens's adapter registry without
importing it (`supported_architectures`), so an unsupported checkpoint is refused before torch,
transformers or any weight is loaded.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from compute.errors import ModelLoadError

# The registry's module, relative to the transformer_lens package.
_REGISTRY = Path("factories") / "architecture_adapter_factory.py"
NATIVE = "TransformerLensNative"


@functools.cache
def supported_architectures() -> frozenset[str]:
    """The Hugging Face architecture names TransformerLens's installed version adapts: the keys
    of its `SUPPORTED_ARCHITECTURES`, read from the source without importing the package."""
    spec = importlib.util.find_spec("transformer_lens")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("TransformerLens is not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / _REGISTRY
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and target.id == "SUPPORTED_ARCHITECTURES"
            and isinstance(value, ast.Dict)
        ):
            return frozenset(str(k.value) for k in value.keys if isinstance(k, ast.Constant))
    raise ModelLoadError(f"no SUPPORTED_ARCHITECTURES in {source}")


def import_bridge() -> None:
    """Import what booting any model needs, without booting one (a worker does this before its
    pool forks, so every pool process starts with the imports done)."""
    import transformer_lens.model_bridge.sources.native  # noqa: F401
    from transformer_lens.model_bridge.sources._bridge_builder import (  # noqa: F401
        build_bridge_from_module,
    )


def boot_hf(hf_model: Any, architecture: str, name: str) -> Any:
    """A bridge over a loaded Hugging Face causal LM (modified in place: the adapter's
    components replace its submodules; attention becomes eager, so patterns can be read)."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    hf_model.config.architectures = [architecture]
    shim = _TRANSFORMERS_4_ATTRIBUTES.get(architecture)
    if shim is not None:
        shim(hf_model)
    # Eager attention everywhere: its weights are the pattern the attention families read
    # (the adapters that do not ask for it would otherwise run SDPA, which returns none).
    setter = getattr(hf_model, "set_attn_implementation", None)
    if callable(setter):
        # (a model with no eager attention of its own keeps what it has)
        with contextlib.suppress(ValueError, NotImplementedError):
            setter("eager")
    return build_bridge_from_module(
        hf_model, architecture, hf_config=hf_model.config, model_name=name
    )


def _codegen_attributes(hf_model: Any) -> None:
    """CodeGen's attention as transformers 4 had it: `embed_positions`, the sinusoidal table
    its rotary embedding indexes by position (transformers 5 keeps the same table on the
    model's `rotary_emb`), and `scale_attn`, sqrt(head_dim), which the scores are divided by
    (transformers 5 keeps its inverse as `scaling`)."""
    table = hf_model.transformer.rotary_emb.embed_positions
    for layer in hf_model.transformer.h:
        attn = layer.attn
        attn.register_buffer("embed_positions", table.detach().clone(), persistent=False)
        attn.scale_attn = torch.tensor(float(attn.head_dim)).sqrt()


# What TransformerLens 4.3's adapter for an architecture reads of transformers 4's modules that
# transformers 5 dropped, restored with the same values before booting (the parity check at
# every load holds the result to the Hugging Face forward).
_TRANSFORMERS_4_ATTRIBUTES: dict[str, Any] = {"CodeGenForCausalLM": _codegen_attributes}


def boot_native(fields: dict[str, Any], state: dict[str, Tensor] | None, seed: int | None) -> Any:
    """A bridge over TransformerLens's native model with HookedTransformer config `fields`:
    randomly initialised from `seed`, then given `state` (HookedTransformer-layout tensors,
    e.g. `blocks.0.attn.W_Q` [n_heads, d_model, d_head]) where one is given."""
    import transformer_lens.model_bridge.sources.native  # noqa: F401  (registers boot_native)
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    known = {k: v for k, v in fields.items() if k not in _NOT_NATIVE}
    cfg = TransformerBridgeConfig.from_dict(
        {**known, "seed": seed, "init_weights": seed is not None}
    )
    boot = TransformerBridge.boot_native  # type: ignore[attr-defined]
    bridge = boot(cfg, model_name=str(fields.get("model_name", NATIVE)))
    if state is not None:
        load_tl_weights(bridge, state)
    return bridge


def load_tl_weights(bridge: Any, state: dict[str, Tensor]) -> None:
    """Load HookedTransformer-layout tensors (`blocks.0.attn.W_Q` [n_heads, d_model, d_head],
    ...) into a native bridge's own parameters; every parameter must be given."""
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    converted = convert_tl_checkpoint(dict(state), bridge.cfg)
    result = bridge.load_state_dict(converted, strict=False)
    if result.missing_keys:
        raise ModelLoadError(f"weights missing for {sorted(result.missing_keys)[:5]}")


# HookedTransformer config fields that only name things (the native model has no use for them).
_NOT_NATIVE = frozenset({"original_architecture", "tokenizer_name"})


def to_dtype(bridge: Any, dtype: torch.dtype) -> None:
    """`bridge.to(dtype)` as TransformerLens 4 does it — the config's dtype set, then
    `nn.Module.to` on the bridge and on the Hugging Face model it wraps — without that method's
    loop over `state_dict()` (4.3's `move_to_and_update_config` builds the whole state dict once
    per entry and assigns into the fresh copy: no effect, and quadratic in the number of weights,
    6 s of a bfloat16 load of SmolLM2-135M on 2 cores). Held to `bridge.to(dtype)` by
    tests/unit/test_dtype.py."""
    if hasattr(bridge.cfg, "dtype"):
        bridge.cfg.dtype = dtype
    torch.nn.Module.to(bridge, dtype)
    original = getattr(bridge, "original_model", None)
    if original is not None:
        original.to(dtype)


def apply_processing(bridge: Any, processing: Any) -> None:
    """TransformerLens's weight processing (fold norms, centre writes and the unembedding, fold
    value biases), in place, as `processing` (an `AppliedProcessing`) says; none at all when
    every step is off (the checkpoint's own weights)."""
    steps = (
        processing.fold_ln,
        processing.center_writing_weights,
        processing.center_unembed,
        processing.fold_value_biases,
    )
    if not any(steps):
        return
    with steps_free_their_input():
        bridge.enable_compatibility_mode(
            disable_warnings=True,
            fold_ln=processing.fold_ln,
            center_writing_weights=processing.center_writing_weights,
            center_unembed=processing.center_unembed,
            fold_value_biases=processing.fold_value_biases,
            refactor_factored_attn_matrices=False,
        )


# TransformerLens 4.3's weight-processing steps, in the order `ProcessWeights.process_weights`
# runs them. Each begins by cloning every tensor of the state dict it is given ("a deep copy to
# avoid modifying the original") and returns the clones, processed.
_STEPS = ("fold_layer_norm", "center_writing_weights", "center_unembed", "fold_value_biases")
_STEPS_LOCK = threading.Lock()


class _HandedOn(dict[str, Any]):
    """A processing step's output, held only by the pipeline that passes it to the next step.
    The next step's clone of it reads it once, through `items()`; each entry leaves this dict as
    it is read, so the input's tensor is freed as soon as its clone exists, instead of the whole
    input living until the step returns beside the whole output."""

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        for key in list(self.keys()):
            yield key, self.pop(key)


@contextlib.contextmanager
def steps_free_their_input() -> Iterator[None]:
    """While TransformerLens processes weights, each step after the first frees its input as it
    clones it. Unchanged, a step holds its input and its output whole at once, beside the model's
    own parameters: three float32 copies of the weights at the peak of a load (8.2 GiB for Qwen
    2.5-Coder-0.5B's 2.5 GiB). With this, two and the largest tensor. The steps compute exactly
    what they did (tests/unit/test_loading.py holds the processed weights to TransformerLens's
    own processing, bit for bit). One processing at a time per process: the steps are patched on
    the class."""
    from transformer_lens.weight_processing import ProcessWeights

    def handing_on(step: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        @functools.wraps(step)
        def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return _HandedOn(step(*args, **kwargs))

        return run

    with _STEPS_LOCK:
        originals = {name: ProcessWeights.__dict__[name] for name in _STEPS}
        for name, step in originals.items():
            setattr(ProcessWeights, name, staticmethod(handing_on(step.__func__)))
        try:
            yield
        finally:
            for name, step in originals.items():
                setattr(ProcessWeights, name, step)


@dataclass
class BlockInputs:
    """What the model's own forward passes each block besides the residual — its attention
    mask, rotary position embeddings, position ids — for one sequence length, captured once
    from a forward of that length and reused for every block run (they depend on the length
    and the device, never on the tokens: Strata's batches have no padding)."""

    bridge: Any
    # A model split over devices (`compute.placement`): its home device, where the forward
    # that captures the inputs runs, and each block's, where that block's inputs are kept
    # (`resid` is then on the block's device). None: the model is on one device.
    split: tuple[torch.device, tuple[torch.device, ...]] | None = None
    # per (length, device): batch 1's inputs, captured; per (batch, length, device): those
    # made for the batch (made once, not on every block run)
    _by_length: dict[tuple[int, str], list[dict[str, Any]]] = field(default_factory=dict)
    _by_batch: dict[tuple[int, int, str], list[dict[str, Any]]] = field(default_factory=dict)

    def of(self, layer: int, resid: Tensor) -> dict[str, Any]:
        """The inputs of block `layer` for a residual of `resid`'s batch, length and device."""
        batch, length = int(resid.shape[0]), int(resid.shape[1])
        device = resid.device if self.split is None else self.split[0]
        key = (batch, length, str(device))
        if key not in self._by_batch:
            base = (length, str(device))
            if base not in self._by_length:
                self._by_length[base] = self._capture(length, device)
            self._by_batch[key] = [_for_batch(i, batch) for i in self._by_length[base]]
        return self._by_batch[key][layer]

    def _capture(self, length: int, device: torch.device) -> list[dict[str, Any]]:
        """Every block's inputs at `length`, from one forward of the model on zeros. Only the
        first block computes: each later one, once its inputs are kept, passes its input
        through (shaped as the first one's output), and the forward stops after the last block
        — no final norm, no unembedding. Where that shortcut fails (an architecture whose loop
        needs more of its blocks), the whole forward runs instead. Held to the whole forward on
        every supported architecture by tests/unit/test_architectures.py."""
        try:
            return self.captured(length, device, skip_blocks=True)
        except Exception:
            return self.captured(length, device, skip_blocks=False)

    def captured(
        self, length: int, device: torch.device, *, skip_blocks: bool
    ) -> list[dict[str, Any]]:
        """`_capture`, with (`skip_blocks`) or without its shortcut."""
        modules = [block.original_component for block in self.bridge.blocks]
        names = [_positional_names(m) for m in modules]
        captured: list[dict[str, Any]] = [{} for _ in modules]
        first_output: list[Any] = []

        def keep(i: int) -> Any:
            def hook(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                inputs = {k: v for k, v in kwargs.items() if k not in _CACHE_KWARGS}
                # Positional inputs after the residual (XGLM passes its mask so), by name.
                for name, value in zip(names[i][1:], args[1:], strict=False):
                    if name not in _CACHE_KWARGS:
                        inputs[name] = value
                captured[i] = inputs

            return hook

        def passed_through(i: int) -> Any:
            def forward(*args: Any, **kwargs: Any) -> Any:
                hidden = args[0] if args else kwargs[names[i][0]]  # the block's own first name
                out = first_output[0]
                if isinstance(out, Tensor):
                    return hidden
                if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
                    return type(out)((hidden, *out[1:]))
                raise TypeError(f"a block's output of type {type(out).__name__}")

            return forward

        def first(_m: Any, _args: Any, output: Any) -> None:
            first_output.append(output)

        def stop(_m: Any, _args: Any, _output: Any) -> None:
            raise _AllCapturedError

        handles = [
            m.register_forward_pre_hook(keep(i), with_kwargs=True) for i, m in enumerate(modules)
        ]
        if self.split is not None:  # each block's inputs moved to it, its output home
            handles += _routed(self.bridge, *self.split)
        # a block's own `forward` where an instance has one (a wrapper set on it), put back after
        own = [m.__dict__.get("forward") for m in modules]
        if skip_blocks:
            handles.append(modules[0].register_forward_hook(first))
            handles.append(self.bridge.blocks[-1].register_forward_hook(stop))
            for i, m in enumerate(modules[1:], start=1):
                m.forward = passed_through(i)
        try:
            # Normal tensors, not inference tensors, whatever mode the first caller runs in: a
            # family that differentiates through the blocks (heads_atp) uses them in autograd.
            with torch.inference_mode(False), torch.no_grad():
                self.bridge(torch.zeros(1, length, dtype=torch.long, device=device))
        except _AllCapturedError:
            pass
        finally:
            for handle in handles:
                handle.remove()
            if skip_blocks:
                for m, forward in zip(modules[1:], own[1:], strict=True):
                    if forward is None:
                        del m.forward
                    else:
                        m.forward = forward
        return captured


class _AllCapturedError(Exception):
    """Raised after the last block's forward while capturing: the rest of the model's forward
    is not needed."""


def _routed(bridge: Any, home: torch.device, devices: tuple[torch.device, ...]) -> list[Any]:
    """Hooks through which a forward of the whole model runs over a split one: every block's
    inputs moved to the block's device, its output back home (the handles)."""

    def to(device: torch.device) -> Any:
        def pre(
            _m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return to_device(args, device), to_device(kwargs, device)

        return pre

    def back(_m: Any, _args: Any, output: Any) -> Any:
        return to_device(output, home)

    handles = []
    for block, device in zip(bridge.blocks, devices, strict=True):
        handles.append(block.register_forward_pre_hook(to(device), with_kwargs=True))
        handles.append(block.register_forward_hook(back))
    return handles


def to_device(value: Any, device: torch.device) -> Any:
    """`value` with every tensor in it (inside tuples, lists and dicts too) on `device`."""
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        moved = [to_device(v, device) for v in value]
        return type(value)(*moved) if hasattr(value, "_fields") else tuple(moved)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def _for_batch(inputs: dict[str, Any], batch: int) -> dict[str, Any]:
    """Batch 1's block inputs made for `batch` sequences of the same positions."""
    if batch == 1:
        return inputs
    inputs = dict(inputs)
    if "alibi" in inputs:
        # ALiBi biases come per (sequence, head) as [batch * heads, 1, pos]: batch 1's repeat
        inputs["alibi"] = inputs["alibi"].repeat(batch, 1, 1)
    mask = inputs.get("attention_mask")
    if isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[0] == 1:
        # layers that check the mask's batch size (XGLM) get batch 1's, broadcast
        inputs["attention_mask"] = mask.expand(batch, *mask.shape[1:])
    return inputs


# What a decoder layer takes from its model's forward that is about caching (left out: Strata
# runs every block without a cache); everything else — masks, position embeddings and ids,
# ALiBi or position biases — is passed on.
_CACHE_KWARGS = frozenset(
    {
        "past_key_values",
        "past_key_value",
        "layer_past",
        "cache",
        "use_cache",
        "cache_position",
        "output_attentions",
        "output_hidden_states",
    }
)


def _positional_names(module: Any) -> list[str]:
    import inspect

    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
