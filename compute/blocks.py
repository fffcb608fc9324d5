"""A fast forward of one transformer block, from the weights of a TransformerLens bridge.

The bridge runs each block as its own architecture's module does, with TransformerLens's hook
points around every piece: exact for any architecture, but written for hooking, not speed. For
the architectures listed in `FAST_ARCHITECTURES`, whose blocks are the plain pre-norm pattern,
this module computes the same function from the bridge's weights (read once per block,
`fast_block`) with

- one fused QKV projection (`addmm` on a [d_model, (n_heads + 2 n_kv) * d_head] matrix laid out
  once; grouped-query attention projects K and V for its n_kv key/value heads only and shares
  each among its group of query heads),
- PyTorch's scaled-dot-product attention (fused, no [q, k] pattern in memory) when no family
  needs the pattern, and an explicit float32 softmax when one does,
- `F.layer_norm` / `F.rms_norm` (float32 reductions in any dtype) and `F.gelu(approximate=
  "tanh")` for gelu_new (the same formula, fused); rotary embeddings from the cosines and sines
  the model's own rotary module gives (so every rope scaling it implements is the model's own),
  applied to the query and key heads of the fused projection at once,
- gated MLPs (Llama, Mistral, Qwen 2) with the gate and input projections fused into one matmul.

Anything else — post-norms, ALiBi, soft-capped scores, qk-norms, attention sinks, sliding
windows, mixtures of experts, state-space layers — runs on the bridge's own blocks with hooks
(`LoadedModel.run_block`). `fast_path_refusal` says, by name, why a model is not eligible; the
parity report at every load holds either path to the Hugging Face forward, and the reference
tests (`tests/unit/test_reference_engine.py`) hold both to 1e-4.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}

# Architectures whose blocks are x + attn(norm(x)) then + mlp(norm(.)) (or both from x, in
# parallel), with plain causal attention: the fused forward computes them exactly.
FAST_ARCHITECTURES = frozenset(
    {
        "GPT2LMHeadModel",
        "GPTNeoXForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "TransformerLensNative",
    }
)
# Norm modules whose function is F.layer_norm / F.rms_norm with their weight (or none).
_LAYER_NORMS = frozenset({"LayerNorm", "NativeLayerNormPre"})
_RMS_NORMS = frozenset(
    {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "NativeRMSNorm", "NativeRMSNormPre"}
)


@dataclass(frozen=True)
class Norm:
    """A pre-norm: LayerNorm or RMSNorm with an optional gain (and bias), or none at all."""

    kind: str  # "ln", "rms" or "none"
    eps: float = 1e-5
    weight: Tensor | None = None
    bias: Tensor | None = None

    def __call__(self, x: Tensor) -> Tensor:
        if self.kind == "ln":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, eps=self.eps)
        if self.kind == "rms":
            return F.rms_norm(x, x.shape[-1:], self.weight, eps=self.eps)
        return x


@dataclass(frozen=True)
class FastMLP:
    w_in: Float[Tensor, "d_model d_mlp"]
    b_in: Float[Tensor, " d_mlp"]
    w_out: Float[Tensor, "d_mlp d_model"]
    b_out: Float[Tensor, " d_model"]
    act_fn: str
    # A gated MLP's gate and input projections side by side ([d_model, 2 * d_mlp]).
    w_gate_in: Float[Tensor, "d_model two_mlp"] | None = None


@dataclass(frozen=True)
class FastBlock:
    """One block's weights laid out for the fast forward (derived; rebuilt when they change)."""

    ln1: Norm
    w_qkv: Float[Tensor, "d_model qkv"]
    b_qkv: Float[Tensor, " qkv"]
    w_o: Float[Tensor, "hd d_model"]
    b_o: Float[Tensor, " d_model"]
    n_heads: int
    n_kv_heads: int  # key/value heads (n_heads unless grouped-query attention)
    d_head: int
    scale: float  # scores are q.k times this
    rotary: bool  # rotary position embeddings, from the model's own rotary module
    parallel: bool
    ln2: Norm | None = None
    mlp: FastMLP | None = None
    # The native model's rotary tables ([n_ctx, rotary_dim] cosines and sines, rotating
    # adjacent pairs); None for Hugging Face models, whose own rotary module gives them per
    # forward (`rotate_half` convention).
    native_rope: tuple[Tensor, Tensor] | None = None


def has_post_sublayer_norms(bridge: Any) -> bool:
    """Whether any block normalises a sublayer's output before adding it to the residual
    stream (the adapter maps a `ln1_post` / `ln2_post`: Gemma 2/3, OLMo 2/3, ...)."""
    return any(hasattr(b, n) for b in bridge.blocks for n in ("ln1_post", "ln2_post"))


def fast_path_refusal(bridge: Any) -> str | None:
    """Why the fused forward cannot compute this model exactly (None: it can)."""
    cfg = bridge.cfg
    arch = str(cfg.architecture)
    if arch not in FAST_ARCHITECTURES:
        return f"{arch} is not among the fused forward's architectures"
    hf = getattr(bridge, "original_model", None)
    hf_cfg = getattr(hf, "config", None)
    if hf_cfg is not None and arch != "TransformerLensNative":
        layer_types = getattr(hf_cfg, "layer_types", None) or []
        window = getattr(hf_cfg, "sliding_window", None)
        if any(t != "full_attention" for t in layer_types) or (
            arch == "MistralForCausalLM" and window is not None and window < int(cfg.n_ctx)
        ):
            return "sliding-window attention"
        if getattr(hf_cfg, "scale_attn_by_inverse_layer_idx", False):
            return "scores scaled by the inverse layer index"
    if arch == "TransformerLensNative" and cfg.positional_embedding_type not in (
        "standard",
        "rotary",
    ):
        return f"positional embedding {cfg.positional_embedding_type!r}"
    if cfg.attn_scores_soft_cap is not None and cfg.attn_scores_soft_cap > 0:
        return "soft-capped attention scores"
    if cfg.act_fn not in _ACTIVATIONS:
        return f"activation {cfg.act_fn!r}"
    if has_post_sublayer_norms(bridge):
        return "norms after the sublayers"
    for block in bridge.blocks:
        for name in ("ln1", "ln2"):
            module = getattr(block, name, None)
            if module is not None and _norm_kind(module) is None:
                kind = type(getattr(module, "original_component", module)).__name__
                return f"norm {kind}"
    return None


def _norm_kind(module: Any) -> str | None:
    inner = getattr(module, "original_component", module)
    name = type(inner).__name__
    if name in _LAYER_NORMS:
        return "ln"
    if name in _RMS_NORMS:
        return "rms"
    if name == "Identity":
        return "none"
    return None


def _norm(module: Any) -> Norm:
    inner = getattr(module, "original_component", module)
    kind = _norm_kind(module)
    if kind is None or kind == "none":
        return Norm("none")
    eps = getattr(inner, "eps", None) or getattr(inner, "variance_epsilon", None) or 1e-5
    eps = float(eps)
    weight = getattr(inner, "weight", None)
    bias = getattr(inner, "bias", None)
    return Norm(
        kind,
        eps,
        weight.detach() if weight is not None else None,
        bias.detach() if bias is not None else None,
    )


def final_norm(bridge: Any) -> Norm:
    return _norm(bridge.ln_final)


def _zeros_if_none(t: Tensor | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    if t is None:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return t.detach()


def fast_block(bridge: Any, layer: int) -> FastBlock:
    """The weights of block `layer` of an eligible bridge (`fast_path_refusal` is None), laid
    out for `attention` and `mlp`."""
    cfg = bridge.cfg
    block = bridge.blocks[layer]
    attn = block.attn
    w_q, w_k, w_v = attn.W_Q.detach(), attn.W_K.detach(), attn.W_V.detach()
    h, d, dh = w_q.shape
    kv = int(w_k.shape[0])
    # [heads, d, dh] -> [d, heads * dh]; Q, K, V side by side so one matmul projects all three.
    w_qkv = torch.cat([w_q, w_k, w_v]).permute(1, 0, 2).reshape(d, -1).contiguous()
    b_qkv = torch.cat(
        [
            _zeros_if_none(attn.b_Q, (h, dh), w_q),
            _zeros_if_none(attn.b_K, (kv, dh), w_q),
            _zeros_if_none(attn.b_V, (kv, dh), w_q),
        ]
    ).reshape(-1)
    w_o = attn.W_O.detach().reshape(h * dh, d).contiguous()
    b_o = _zeros_if_none(attn.b_O, (d,), w_q)
    mlp = None
    ln2 = None
    if not cfg.attn_only and getattr(block, "mlp", None) is not None:
        m = block.mlp
        w_in = m.W_in.detach()
        gate = getattr(m, "W_gate", None)
        d_mlp = int(w_in.shape[1])
        mlp = FastMLP(
            w_in,
            _zeros_if_none(getattr(m, "b_in", None), (d_mlp,), w_in),
            m.W_out.detach(),
            _zeros_if_none(getattr(m, "b_out", None), (d,), w_in),
            str(cfg.act_fn),
            torch.cat([gate.detach(), w_in], dim=1).contiguous() if gate is not None else None,
        )
        ln2 = _norm(block.ln2)
    native_rope = None
    rotary_module = getattr(getattr(attn, "original_component", None), "rotary", None)
    if cfg.architecture == "TransformerLensNative" and rotary_module is not None:
        native_rope = (rotary_module.cos_cached.detach(), rotary_module.sin_cached.detach())
    return FastBlock(
        native_rope=native_rope,
        ln1=_norm(block.ln1),
        w_qkv=w_qkv,
        b_qkv=b_qkv,
        w_o=w_o,
        b_o=b_o,
        n_heads=h,
        n_kv_heads=kv,
        d_head=dh,
        scale=_scale(bridge, attn, dh),
        rotary=cfg.positional_embedding_type == "rotary",
        parallel=bool(cfg.parallel_attn_mlp),
        ln2=ln2,
        mlp=mlp,
    )


def _scale(bridge: Any, attn: Any, d_head: int) -> float:
    """What the model multiplies q.k by: the module's own `scaling` where it has one (Llama,
    Mistral, Qwen 2, GPT-NeoX), the native model's 1 / `scale`, GPT-2's 1 / sqrt(d_head)."""
    inner = getattr(attn, "original_component", attn)
    if getattr(inner, "scaling", None) is not None:
        return float(inner.scaling)
    if getattr(inner, "scale", None) is not None and not isinstance(inner.scale, bool):
        return 1.0 / float(inner.scale)
    if getattr(inner, "scale_attn_weights", True) is False:
        return 1.0
    return float(d_head) ** -0.5


def rotary(
    x: Float[Tensor, "batch pos heads d_head"], cos: Tensor, sin: Tensor, adjacent: bool = False
) -> Float[Tensor, "batch pos heads d_head"]:
    """The rotary embedding as the model applies it to the first `cos.shape[-1]` dimensions of
    each head, on the query and key heads of the fused projection at once: Hugging Face's
    `rotate_half` ([a, b] -> [-b, a]), or pair by pair ([x0, x1] -> [-x1, x0]) where
    `adjacent` (the native model). `cos`, `sin`: [1, pos, rotary_dim]."""
    r = int(cos.shape[-1])
    cos, sin = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    x_rot = x[..., :r]
    if adjacent:
        flip = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), dim=-1).flatten(-2)
    else:
        half = r // 2
        flip = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    out = x_rot * cos + flip * sin
    return out if r == x.shape[-1] else torch.cat((out, x[..., r:]), dim=-1)


def mlp(fb: FastBlock, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
    """The block's MLP on an already normalised input: (act(x W_gate) * (x W_in) + b_in) W_out
    + b_out for a gated MLP, act(x W_in + b_in) W_out + b_out otherwise."""
    m = fb.mlp
    assert m is not None, "mlp() called on an attention-only block"
    act = _ACTIVATIONS[m.act_fn]
    flat = x.reshape(-1, x.shape[-1])
    if m.w_gate_in is not None:
        gate, linear = (flat @ m.w_gate_in).chunk(2, dim=-1)
        # SiLU in place: `gate` is a view of this function's own matmul output (not where a
        # gradient is taken: autograd refuses in-place writes to one of several views).
        in_place = m.act_fn == "silu" and not torch.is_grad_enabled()
        gate = F.silu(gate, inplace=True) if in_place else act(gate)
        post = torch.addcmul(m.b_in, gate, linear)
    else:
        post = act(torch.addmm(m.b_in, flat, m.w_in))
    out = torch.addmm(m.b_out, post, m.w_out)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def attention(
    fb: FastBlock,
    x: Float[Tensor, "batch pos d_model"],
    rope: tuple[Tensor, Tensor] | None,
    *,
    head_mask: Float[Tensor, "batch head"] | None,
    capture_pattern: bool,
    z_hook: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Attention write, z ([batch, pos, head, d_head]) and, if asked, the pattern. `z_hook`
    replaces z (after the head mask) with what it returns, which the write is made from."""
    b, t, d = x.shape
    h, kv, dh = fb.n_heads, fb.n_kv_heads, fb.d_head
    qkv = torch.addmm(fb.b_qkv, x.reshape(-1, d), fb.w_qkv).view(b, t, h + 2 * kv, dh)
    if fb.rotary:
        if rope is None:
            raise ValueError("a rotary block needs the model's cosines and sines")
        adjacent = fb.native_rope is not None
        q, k = rotary(qkv[:, :, : h + kv], *rope, adjacent=adjacent).split([h, kv], dim=2)
        v = qkv[:, :, h + kv :]
    else:
        q, k, v = qkv.split([h, kv, kv], dim=2)  # [b, t, heads, dh]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, t, dh]
    if kv != h:  # each key/value head serves h // kv consecutive query heads
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    pattern = None
    if capture_pattern:
        visible = torch.ones(t, t, dtype=torch.bool, device=x.device).tril_()
        scores = (q.float() @ k.float().transpose(-1, -2)) * fb.scale
        pattern = torch.softmax(scores.masked_fill_(~visible, float("-inf")), dim=-1)
        z = pattern.to(v.dtype) @ v
    else:
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=fb.scale)
    z = z.transpose(1, 2)  # [b, t, h, dh]
    if head_mask is not None:
        z = z * head_mask[:, None, :, None].to(z.dtype)
    if z_hook is not None:
        z = z_hook(z)
    out = torch.addmm(fb.b_o, z.reshape(b * t, h * dh), fb.w_o).view(b, t, d)
    return out, z, pattern
