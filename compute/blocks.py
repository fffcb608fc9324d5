"""A fast forward of one TransformerLens block, from the block's own (processed) weights.

TransformerLens's `TransformerBlock.forward` is written for hooking, not speed: it re-lays out
W_Q, W_K, W_V and W_O on every call, runs three projections instead of one, materialises the
attention pattern even when nobody reads it, and computes GELU in seven elementwise passes. For
the architectures it covers (`supports`), this module computes the same function with

- one fused QKV projection (`addmm` on a [d_model, 3 * n_heads * d_head] matrix laid out once),
- PyTorch's scaled-dot-product attention (fused, no [q, k] pattern in memory) when no family
  needs the pattern, and an explicit float32 softmax when one does,
- `F.layer_norm` for LayerNorm / LayerNormPre and `F.gelu(approximate="tanh")` for gelu_new
  (the same formula as TransformerLens's, fused).

Anything else — grouped-query attention, post-norm architectures, ALiBi, soft-capped scores,
attention sinks — runs through the TransformerLens block with hooks (`LoadedModel.run_block`
falls back). The float32 results agree with TransformerLens to float rounding; the reference
tests (`tests/unit/test_reference_engine.py`) hold both paths to 1e-4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

_ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


def supports(cfg: Any, block: Any) -> bool:
    """Whether `fast_block` computes exactly what this TransformerLens block computes."""
    from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    norms = (LayerNorm, LayerNormPre, RMSNorm, RMSNormPre)
    ok = (
        not cfg.use_attn_in and not cfg.use_split_qkv_input and not cfg.use_attn_result
        and not cfg.use_normalization_before_and_after
        and cfg.original_architecture not in POST_NORM_ARCHITECTURES
        and cfg.positional_embedding_type in ("standard", "rotary")
        and (cfg.n_key_value_heads is None or cfg.n_key_value_heads == cfg.n_heads)
        and (not cfg.attn_scores_soft_cap or cfg.attn_scores_soft_cap <= 0)
    )
    ok = ok and not getattr(cfg, "use_attention_sinks", False) and cfg.clip_qkv is None
    ok = ok and not getattr(cfg, "use_logn_attn", False) and cfg.attention_dir == "causal"
    ok = ok and not getattr(cfg, "use_dynamic_ntk_rope", False) and not cfg.load_in_4bit
    ok = ok and not getattr(cfg, "use_qk_norm", False) and cfg.original_architecture not in (
        "OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
    ok = ok and isinstance(block.ln1, norms)
    ok = ok and type(block.attn).__name__ == "Attention"
    if not cfg.attn_only:
        ok = ok and isinstance(block.ln2, norms)
    return bool(ok)


@dataclass
class FastWeights:
    """Weights of one block laid out for the fast forward (derived; rebuilt when they change)."""

    w_qkv: Float[Tensor, "d_model three_hd"]
    b_qkv: Float[Tensor, " three_hd"]
    w_o: Float[Tensor, "hd d_model"]
    b_o: Float[Tensor, " d_model"]


def fast_weights(block: Any) -> FastWeights:
    attn = block.attn
    h, d, dh = attn.W_Q.shape
    # [h, d, dh] -> [d, h * dh]; Q, K, V side by side so one matmul projects all three.
    w = torch.cat([attn.W_Q, attn.W_K, attn.W_V]).detach()  # [3h, d, dh]
    w_qkv = w.permute(1, 0, 2).reshape(d, 3 * h * dh).contiguous()
    b_qkv = torch.cat([attn.b_Q, attn.b_K, attn.b_V]).detach().reshape(-1).contiguous()
    w_o = attn.W_O.detach().reshape(h * dh, d).contiguous()
    return FastWeights(w_qkv, b_qkv, w_o, attn.b_O.detach())


def norm(module: Any, x: Tensor) -> Tensor:
    """A TransformerLens norm module applied with PyTorch's fused kernel where one exists."""
    from transformer_lens.components import LayerNorm, LayerNormPre

    if isinstance(module, LayerNormPre):
        return F.layer_norm(x, x.shape[-1:], eps=module.eps)
    if isinstance(module, LayerNorm):
        return F.layer_norm(x, x.shape[-1:], module.w, module.b, eps=module.eps)
    return module(x)  # RMSNorm(Pre): TransformerLens's own (no fused kernel gains much)


def mlp(block: Any, cfg: Any, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
    """The block's MLP on an already normalised input."""
    m = block.mlp
    act = _ACTIVATIONS.get(cfg.act_fn)
    if act is None or cfg.gated_mlp or type(m).__name__ != "MLP":
        return m(x)
    flat = x.reshape(-1, x.shape[-1])
    pre = torch.addmm(m.b_in, flat, m.W_in)
    out = torch.addmm(m.b_out, act(pre), m.W_out)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def attention(
    block: Any,
    weights: FastWeights,
    x: Float[Tensor, "batch pos d_model"],
    *,
    head_mask: Float[Tensor, "batch head"] | None,
    capture_pattern: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Attention write, z ([batch, pos, head, d_head]) and, if asked, the pattern."""
    attn = block.attn
    b, t, d = x.shape
    h, dh = attn.W_Q.shape[0], attn.W_Q.shape[2]
    qkv = torch.addmm(weights.b_qkv, x.reshape(-1, d), weights.w_qkv).view(b, t, 3, h, dh)
    q, k, v = qkv.unbind(2)  # [b, t, h, dh]
    if attn.cfg.positional_embedding_type == "rotary":
        q, k = attn.apply_rotary(q), attn.apply_rotary(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, h, t, dh]
    pattern = None
    if capture_pattern:
        scores = (q.float() @ k.float().transpose(-1, -2)) / float(attn.attn_scale)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril_()
        pattern = torch.softmax(scores.masked_fill_(~causal, float("-inf")), dim=-1)
        z = pattern.to(v.dtype) @ v
    else:
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           scale=1.0 / float(attn.attn_scale))
    z = z.transpose(1, 2)  # [b, t, h, dh]
    if head_mask is not None:
        z = z * head_mask[:, None, :, None].to(z.dtype)
    out = torch.addmm(weights.b_o, z.reshape(b * t, h * dh), weights.w_o).view(b, t, d)
    return out, z, pattern
