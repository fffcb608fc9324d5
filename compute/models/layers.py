"""What each block of a model has, read once from its bridge: its token mixer — attention with
heads, or a mixer without heads (a state-space layer, a gated delta-net, a short convolution) —
its MLP (dense, or a mixture of experts as a whole), and where Strata reads and zeroes their
writes and, on attention blocks, each head's z.

`block_layout` builds it from the bridge's modules and the tables below; a sublayer of a kind
the tables do not name is refused by name (`ModelLoadError`), never guessed. The metric
families ask the layout which of them run on a block (docs/metrics.md, "Block kinds"):

- whole-block families (drop, swap, the logit and tuned lenses, the residual norm, the pruning
  families) on every block;
- the token mixer's ablation (`drop_attn`, the `attn` component of `norms` and `similarity`) on
  every block with a mixer whose write Strata reads, attention or not;
- the MLP's (`drop_mlp`, `mlp` components, `neurons`) on every block with an MLP;
- the attention families (`attention`, `heads`, `heads_atp`) on attention blocks only.

`probed` then measures, on a short seeded sequence, what the families' shortcuts assume of each
block on the bridge's path: that its output is its input plus the writes Strata reads (so that
zeroing a write is subtracting it: `additive`), and that zeroing one head's z changes the
attention write by exactly that head's z through its rows of W_O (`heads_linear`). Where either
fails the families recompute the block with the write or the head zeroed instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from compute.errors import ModelLoadError


class LoadedModel(Protocol):
    """What the probe needs of `compute.models.loaded.LoadedModel` (named here, not imported:
    the loaded model imports this module)."""

    device: str

    @property
    def n_ctx(self) -> int: ...
    @property
    def d_vocab_real(self) -> int: ...
    @property
    def bos_token_id(self) -> int: ...
    def embed(self, tokens: Tensor) -> Tensor: ...
    def run_block(
        self,
        layer: int,
        resid: Tensor,
        *,
        zero_attn: bool = ...,
        zero_mlp: bool = ...,
        head_mask: Tensor | None = ...,
        capture_pattern: bool = ...,
        capture_z: bool = ...,
    ) -> Any: ...
    def head_writes(self, layer: int, z: Tensor, heads: list[int]) -> Tensor: ...


ATTENTION = "attention"
# Token mixers without heads, by the Hugging Face module that computes them: what a block's
# `attn` component is on these blocks (docs/metrics.md, "Block kinds").
TOKEN_MIXERS: dict[str, str] = {
    "MambaMixer": "Mamba",
    "FalconMambaMixer": "Mamba",
    "JambaMambaMixer": "Mamba",
    "Mamba2Mixer": "Mamba-2",
    "BambaMixer": "Mamba-2",
    "NemotronHMamba2Mixer": "Mamba-2",
    "Qwen3NextGatedDeltaNet": "gated delta-net",
    "Qwen3_5GatedDeltaNet": "gated delta-net",
    "Qwen3_5MoeGatedDeltaNet": "gated delta-net",
    "OlmoHybridGatedDeltaNet": "gated delta-net",
    "Lfm2ShortConv": "short convolution",
    "Lfm2MoeShortConv": "short convolution",
    "RecurrentGemmaRecurrentBlock": "RG-LRU",
}
# Attention modules without a TransformerLens attention bridge (an adapter wraps them as a
# generic mixer, or bridges their block whole): their heads are read at the input of the
# module's own output projection, `o_proj`, and their pattern from its eager weights.
ATTENTION_MODULES = frozenset({"NemotronHAttention", "RecurrentGemmaAttention"})
# MLPs without a TransformerLens MLP bridge (Nemotron-H's MLP-only blocks, RecurrentGemma's).
MLP_MODULES = frozenset({"NemotronHMLP", "RecurrentGemmaMlp"})
# Blocks the bridge runs as one module, by their class: the Hugging Face submodules that are
# their sublayers, read and zeroed with torch hooks on those modules (each one's output, or
# its first element, is what the block adds to the residual stream; `probed` holds it to that).
OPAQUE_BLOCKS: dict[str, tuple[str, ...]] = {
    "RecurrentGemmaDecoderLayer": ("temporal_block", "mlp_block"),
}
# Norm modules an adapter maps as plain components (Gemma 4's), by their class names' ending,
# and the identity a normless native model has in their place.
_NORMS = ("RMSNorm", "LayerNorm", "LayerNormPre", "RMSNormPre", "Identity")
# The names adapters give a block's MLP.
_MLP_NAMES = frozenset({"mlp"})


@dataclass(frozen=True)
class Heads:
    """An attention sublayer's heads: how many, how wide one head's z is, and where z is read.

    `hook_z`: TransformerLens's hook point (z in its layout, [batch, pos, head, d_head]).
    `o_proj`: the attention's own output projection, whose input [batch, pos, n_heads *
    d_head] is split into `n_heads` slices of `d_head` — under multi-head latent attention
    `d_head` is the value width (v_head_dim), not the query/key width."""

    n_heads: int
    d_head: int
    hook_z: Any = None
    o_proj: Any = None

    def w_o(self, attn: Any) -> Tensor:
        """[n_heads, d_head, d_model]: each head's rows of the output projection."""
        if self.o_proj is None:
            return attn.W_O.detach()
        weight = getattr(self.o_proj, "original_component", self.o_proj).weight.detach()
        return weight.T.reshape(self.n_heads, self.d_head, weight.shape[0])


@dataclass(frozen=True)
class BlockKind:
    """One block: its token mixer and MLP, and the hook points of their writes."""

    mixer: str | None  # ATTENTION, a TOKEN_MIXERS kind, or None (no token mixer)
    mlp: str | None  # "dense", "experts" or None
    mixer_write: Any = None  # the hook point whose output is the mixer's residual write
    mlp_write: Any = None
    # attention blocks: TransformerLens's pattern hook (None: the module's eager weights), the
    # module whose output carries those weights, and the heads (None: not readable)
    pattern: Any = None
    attention_module: Any = None
    attn: Any = None  # the attention bridge (W_O)
    heads: Heads | None = None
    mlp_module: Any = None
    # measured by `probed` (true by construction on the fused blocks)
    additive: bool = True
    heads_linear: bool = True

    @property
    def attention(self) -> bool:
        return self.mixer == ATTENTION

    def describe(self) -> dict[str, str | None]:
        return {"mixer": self.mixer, "mlp": self.mlp}

    @property
    def label(self) -> str:
        """ "attention + MLP", "Mamba-2", "MLP", "gated delta-net + experts", ..."""
        mlp = {"dense": "MLP", "experts": "experts"}.get(self.mlp or "")
        return " + ".join(part for part in (self.mixer, mlp) if part)


def block_layout(bridge: Any, architecture: str) -> tuple[BlockKind, ...]:
    """Each block's kind, from the bridge's modules (the blocks the bridge runs)."""
    return tuple(
        _block_kind(bridge, block, i, architecture) for i, block in enumerate(bridge.blocks)
    )


def _block_kind(bridge: Any, block: Any, index: int, architecture: str) -> BlockKind:
    from transformer_lens.model_bridge.generalized_components import (
        AttentionBridge,
        MLPBridge,
        MoEBridge,
        NormalizationBridge,
    )

    def refuse(why: str) -> ModelLoadError:
        inner = type(getattr(block, "original_component", block)).__name__
        return ModelLoadError(f"{architecture}: block {index} ({inner}) {why}")

    mixers: list[tuple[str, Any, str]] = []
    mlps: list[tuple[str, Any]] = []
    original = getattr(block, "original_component", block)
    opaque = OPAQUE_BLOCKS.get(type(original).__name__)
    children = (
        [(name, getattr(original, name)) for name in opaque]
        if opaque is not None
        else list(block.named_children())
    )
    for name, child in children:
        if name.startswith("hook") or name == "_original_component":
            continue
        inner = type(getattr(child, "original_component", child)).__name__
        if isinstance(child, NormalizationBridge) or inner.endswith(_NORMS):
            continue
        if isinstance(child, AttentionBridge) or inner in ATTENTION_MODULES:
            mixers.append((name, child, ATTENTION))
        elif inner in TOKEN_MIXERS:
            mixers.append((name, child, TOKEN_MIXERS[inner]))
        elif (
            inner in MLP_MODULES or name in _MLP_NAMES or isinstance(child, (MLPBridge, MoEBridge))
        ):
            mlps.append((name, child))
        else:
            raise refuse(f"has a sublayer {name!r} ({inner}) Strata does not know")
    if not mixers and not mlps:
        raise refuse("exposes no sublayer to read (the bridge runs it whole)")
    if len(mixers) > 1:
        raise refuse("has token mixers in parallel (" + ", ".join(m[2] for m in mixers) + ")")
    if len(mlps) > 1:
        raise refuse("has MLPs side by side (" + ", ".join(m[0] for m in mlps) + ")")
    kind = BlockKind(None, None)
    if mixers:
        name, mixer, what = mixers[0]
        # The block's own write hook where the adapter defines one (after anything the block
        # applies to the sublayer's output: a post-norm, a residual multiplier), else the
        # mixer's output; `probed` holds either to what the block adds.
        write = None if opaque else _alias(block, "hook_attn_out")
        write = write if write is not None else getattr(mixer, "hook_out", mixer)
        kind = replace(kind, mixer=what, mixer_write=write)
        if what == ATTENTION:
            kind = replace(kind, **_attention(block, mixer, refuse))
    if mlps:
        name, mlp = mlps[0]
        write = None if opaque else _alias(block, "hook_mlp_out")
        experts = fused_experts(mlp) is not None
        kind = replace(
            kind,
            mlp="experts" if experts else "dense",
            mlp_write=write if write is not None else getattr(mlp, "hook_out", mlp),
            mlp_module=mlp,
        )
    return kind


def _alias(block: Any, name: str) -> Any:
    """A block's hook point (or TransformerLens alias of one), None where it does not resolve."""
    try:
        return getattr(block, name)
    except AttributeError:
        return None


def _attention(block: Any, attn: Any, refuse: Callable[[str], Exception]) -> dict[str, Any]:
    """An attention sublayer's pattern, heads and module."""
    from transformer_lens.model_bridge.generalized_components import (
        AttentionBridge,
        MLAAttentionBridge,
    )

    inner = getattr(attn, "original_component", attn)
    found: dict[str, Any] = {"attn": attn, "attention_module": inner}
    if isinstance(attn, AttentionBridge):
        found["pattern"] = _alias(attn, "hook_pattern")
    o_proj = inner._modules.get("o_proj") if isinstance(inner, torch.nn.Module) else None

    def at_o_proj() -> dict[str, Any]:
        # the heads read at the module's own output projection: its input split in n_heads
        n_heads = _n_heads(inner)
        if o_proj is None or n_heads is None:
            return found
        linear: Any = getattr(o_proj, "original_component", o_proj)
        width = int(linear.in_features)
        if width % n_heads:
            raise refuse(f"has an output projection of {width} inputs for {n_heads} heads")
        return found | {"heads": Heads(n_heads, width // n_heads, o_proj=o_proj)}

    if isinstance(attn, MLAAttentionBridge) or not isinstance(attn, AttentionBridge):
        # multi-head latent attention (each head's value is v_head_dim wide, which
        # TransformerLens's hook_z does not split by), or attention an adapter wraps as a
        # generic mixer
        return at_o_proj()
    hook_z = _alias(attn, "hook_z")
    if hook_z is None:
        return found  # no per-head output (JetMoE's mixture of attention heads)
    from transformer_lens.model_bridge.generalized_components.attention import (
        PerLayerGeometryError,
    )

    try:
        w_o = attn.W_O
    except PerLayerGeometryError:
        # this layer's heads are not the config's d_head wide (Gemma 4's global layers), so
        # neither its hook_z nor its W_O splits by them
        return at_o_proj()
    except (AttributeError, NotImplementedError):
        return found
    found["heads"] = Heads(int(w_o.shape[0]), int(w_o.shape[1]), hook_z=hook_z)
    return found


def _n_heads(inner: Any) -> int | None:
    for name in ("num_heads", "num_attention_heads", "n_heads"):
        value = getattr(inner, name, None)
        if isinstance(value, int):
            return value
    config = getattr(inner, "config", None)
    value = getattr(config, "num_attention_heads", None)
    return int(value) if isinstance(value, int) else None


def fused_experts(mlp: Any) -> Tensor | None:
    """A mixture of experts' output rows, [n_experts, d_expert, d_model], from the one
    stacked `down_proj` parameter transformers 5 keeps ([n_experts, d_model, d_expert], or
    [n_experts, d_expert, d_model] where the experts are `is_transposed`, as GPT-OSS's); None
    for a dense MLP."""
    inner = getattr(mlp, "original_component", None)
    experts = mlp._modules.get("experts")
    if experts is None:
        experts = inner._modules.get("experts") if inner is not None else None
    down = getattr(experts, "down_proj", None) if experts is not None else None
    if not isinstance(down, Tensor) and inner is not None:
        # JetMoE's parallel experts: `output_linear.weight`, [n_experts, d_model, d_expert]
        parallel = inner._modules.get("output_linear")
        down, experts = getattr(parallel, "weight", None), None
    if not isinstance(down, Tensor) or down.dim() != 3:
        return None
    down = down.detach()
    return down if getattr(experts, "is_transposed", False) else down.transpose(1, 2)


def w_out(kind: BlockKind) -> Tensor:
    """Each neuron's output row of a block's MLP, [n_neurons, d_model]: every expert's rows in
    expert order under a mixture of experts, else the MLP's output projection."""
    mlp = kind.mlp_module
    if mlp is None:
        raise ModelLoadError("the block has no MLP")
    down = fused_experts(mlp)
    if down is not None:
        return down.reshape(-1, down.shape[-1])
    try:
        return mlp.W_out.detach()
    except (AttributeError, NotImplementedError):
        pass
    inner = getattr(mlp, "original_component", mlp)
    proj = inner._modules.get("down_proj")
    if proj is None:
        raise ModelLoadError(f"{type(inner).__name__}: no output projection to read")
    return getattr(proj, "original_component", proj).weight.detach().T


# ---- the probe

PROBE_SEQ_LEN = 16
PROBE_SEED = 48


def probed(lm: LoadedModel, layout: tuple[BlockKind, ...]) -> tuple[BlockKind, ...]:
    """`layout` with each block's `additive` and `heads_linear` measured on the bridge's blocks:
    a seeded sequence of `PROBE_SEQ_LEN` tokens, each block run clean, with its mixer's write,
    its MLP's write and both zeroed, and with its first head zeroed. The tolerances are float
    rounding of the model's dtype (a load measures it in float32, before any cast)."""
    gen = torch.Generator().manual_seed(PROBE_SEED)
    length = min(PROBE_SEQ_LEN, lm.n_ctx)
    tokens = torch.randint(0, lm.d_vocab_real, (1, length), generator=gen)
    tokens[:, 0] = lm.bos_token_id
    out = []
    with torch.no_grad():
        resid = lm.embed(tokens.to(lm.device))
        eps = torch.finfo(resid.dtype).eps
        for layer, kind in enumerate(layout):
            additive, linear = _probe_block(lm, layer, kind, resid, eps)
            out.append(replace(kind, additive=additive, heads_linear=linear))
            resid = lm.run_block(layer, resid).resid
    return tuple(out)


def _probe_block(
    lm: LoadedModel, layer: int, kind: BlockKind, resid: Tensor, eps: float
) -> tuple[bool, bool]:
    clean = lm.run_block(layer, resid, capture_z=kind.heads is not None)
    scale = float(clean.resid.abs().max())
    tol = 64 * eps * max(scale, 1.0)

    def close(a: Tensor, b: Tensor, within: float = tol) -> bool:
        return bool(torch.isfinite(a).all()) and float((a - b).abs().max()) <= within

    zero = torch.zeros_like(resid)
    a = clean.attn_out if clean.attn_out is not None else zero
    m = clean.mlp_out if clean.mlp_out is not None else zero
    additive = close(clean.resid, resid + a + m)
    # each write alone: what the block adds is what Strata read (with the mixer's write
    # zeroed the MLP reads the block's input itself, as `run_mlp` gives it)
    for zero_attn in (True, False):
        alone = lm.run_block(layer, resid, zero_attn=zero_attn, zero_mlp=not zero_attn)
        write = alone.mlp_out if zero_attn else alone.attn_out
        additive &= close(alone.resid, resid + (write if write is not None else zero))
    both = lm.run_block(layer, resid, zero_attn=True, zero_mlp=True).resid
    additive &= close(both, resid)
    if kind.heads is None or clean.z is None or clean.attn_out is None:
        return additive, False
    mask = torch.ones(1, kind.heads.n_heads, device=resid.device)
    mask[0, 0] = 0.0
    ablated = lm.run_block(layer, resid, head_mask=mask).attn_out
    assert ablated is not None
    expected = clean.attn_out - lm.head_writes(layer, clean.z, [0])[0]
    width = 1024 * eps * max(float(clean.attn_out.abs().max()), 1.0)
    return additive, additive and close(ablated, expected, width)


def attention_layers(layout: tuple[BlockKind, ...]) -> Iterator[int]:
    """The attention blocks whose heads Strata reads."""
    return (i for i, kind in enumerate(layout) if kind.heads is not None)
