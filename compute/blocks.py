"""A fast forward of one TransformerLens block, from the block's own (processed) weights.

TransformerLens's `TransformerBlock.forward` is written for hooking, not speed: it re-lays out
W_Q, W_K, W_V and W_O on every call, runs three projections instead of one, materialises the
attention pattern even when nobody reads it, and computes GELU in seven elementwise passes. For
the architectures it covers (`supports`), this module computes the same function with

- one fused QKV projection (`addmm` on a [d_model, (n_heads + 2 n_kv) * d_head] matrix laid out
  once; grouped-query attention projects K and V for its n_kv key/value heads only and shares
  each among its group of query heads, as TransformerLens's `GroupedQueryAttention` does),
- PyTorch's scaled-dot-product attention (fused, no [q, k] pattern in memory) when no family
  needs the pattern, and an explicit float32 softmax when one does; GPT-Neo's local layers
  (`attn_type == "local"`) get the same window mask as TransformerLens's (a key is visible
  while q - k < window_size),
- `F.layer_norm` for LayerNorm / LayerNormPre, `F.rms_norm` for RMSNorm / RMSNormPre (float32
  reductions in any dtype, as TransformerLens's) and `F.gelu(approximate="tanh")` for gelu_new
  (the same formula as TransformerLens's, fused); rotary embeddings by TransformerLens's
  formula, on the query and key heads of the fused projection at once,
- gated MLPs (Llama, Mistral, Qwen, OLMo, Gemma) with W_gate and W_in fused into one matmul,
  where TransformerLens's `GatedMLP` makes a transposed copy of both on every call.

Anything else — post-norm architectures, ALiBi, soft-capped scores, attention sinks — runs
through the TransformerLens block with hooks (`LoadedModel.run_block` falls back). The float32
results agree with TransformerLens to float rounding; the reference tests
(`tests/unit/test_reference_engine.py`) hold both paths to 1e-4.
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
        not cfg.use_attn_in
        and not cfg.use_split_qkv_input
        and not cfg.use_attn_result
        and not cfg.use_normalization_before_and_after
        and cfg.original_architecture not in POST_NORM_ARCHITECTURES
        and cfg.positional_embedding_type in ("standard", "rotary")
        and (not cfg.attn_scores_soft_cap or cfg.attn_scores_soft_cap <= 0)
    )
    ok = ok and not getattr(cfg, "use_attention_sinks", False) and cfg.clip_qkv is None
    ok = ok and not getattr(cfg, "use_logn_attn", False) and cfg.attention_dir == "causal"
    ok = ok and not getattr(cfg, "use_dynamic_ntk_rope", False) and not cfg.load_in_4bit
    ok = (
        ok
        and not getattr(cfg, "use_qk_norm", False)
        and cfg.original_architecture
        not in ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
    )
    ok = ok and isinstance(block.ln1, norms)
    ok = ok and type(block.attn).__name__ in ("Attention", "GroupedQueryAttention")
    ok = ok and block.attn.attn_type in ("global", "local")
    if not cfg.attn_only:
        ok = ok and isinstance(block.ln2, norms)
    return bool(ok)


@dataclass
class FastWeights:
    """Weights of one block laid out for the fast forward (derived; rebuilt when they change)."""

    w_qkv: Float[Tensor, "d_model qkv"]
    b_qkv: Float[Tensor, " qkv"]
    w_o: Float[Tensor, "hd d_model"]
    b_o: Float[Tensor, " d_model"]
    n_kv_heads: int  # key/value heads (n_heads unless grouped-query attention)
    # A gated MLP's W_gate and W_in side by side ([d_model, 2 * d_mlp]); None otherwise.
    w_gate_in: Float[Tensor, "d_model two_mlp"] | None = None


def fast_weights(block: Any) -> FastWeights:
    attn = block.attn
    h, d, dh = attn.W_Q.shape
    # Grouped-query attention keeps its n_kv key/value projections unexpanded (_W_K, _W_V).
    w_k, w_v = getattr(attn, "_W_K", attn.W_K), getattr(attn, "_W_V", attn.W_V)
    b_k, b_v = getattr(attn, "_b_K", attn.b_K), getattr(attn, "_b_V", attn.b_V)
    # [heads, d, dh] -> [d, heads * dh]; Q, K, V side by side so one matmul projects all three.
    w = torch.cat([attn.W_Q, w_k, w_v]).detach()
    w_qkv = w.permute(1, 0, 2).reshape(d, -1).contiguous()
    b_qkv = torch.cat([attn.b_Q, b_k, b_v]).detach().reshape(-1).contiguous()
    w_o = attn.W_O.detach().reshape(h * dh, d).contiguous()
    w_gate_in = None
    mlp = getattr(block, "mlp", None)
    if mlp is not None and type(mlp).__name__ == "GatedMLP":
        w_gate_in = torch.cat([mlp.W_gate, mlp.W_in], dim=1).detach().contiguous()
    return FastWeights(w_qkv, b_qkv, w_o, attn.b_O.detach(), int(w_k.shape[0]), w_gate_in)


def norm(module: Any, x: Tensor) -> Tensor:
    """A TransformerLens norm module applied with PyTorch's fused kernel.

    RMSNorm: `F.rms_norm`, which reduces in float32 whatever the input's dtype (as
    TransformerLens's does) without its seven passes: a float32 copy of the whole activation,
    its square, the mean, the root, the division, the cast back and the scale.
    """
    from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

    if isinstance(module, LayerNormPre):
        return F.layer_norm(x, x.shape[-1:], eps=module.eps)
    if isinstance(module, LayerNorm):
        return F.layer_norm(x, x.shape[-1:], module.w, module.b, eps=module.eps)
    if isinstance(module, RMSNormPre):
        return F.rms_norm(x, x.shape[-1:], eps=module.eps)
    if isinstance(module, RMSNorm):
        return F.rms_norm(x, x.shape[-1:], module.w, eps=module.eps)
    return module(x)


def rotary(attn: Any, x: Float[Tensor, "batch pos heads d_head"]) -> Tensor:
    """TransformerLens's rotary embedding (`apply_rotary`), op for op, applied to the query and
    key heads of the fused projection in one call (TransformerLens's clones and rewrites each
    of q and k separately). Sequences longer than its tables go to its own method, which
    extends them."""
    t = x.shape[1]
    if t > attn.rotary_cos.shape[0]:
        return attn.apply_rotary(x)
    r = int(attn.cfg.rotary_dim)
    cos, sin = attn.rotary_cos[None, :t, None, :], attn.rotary_sin[None, :t, None, :]
    x_rot = x[..., :r]
    if attn.cfg.rotary_adjacent_pairs:  # [x0, x1] -> [-x1, x0] pair by pair
        flip = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), dim=-1).flatten(-2)
    else:  # halves: [a, b] -> [-b, a]
        half = r // 2
        flip = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    out = x_rot * cos + flip * sin
    return out if r == x.shape[-1] else torch.cat((out, x[..., r:]), dim=-1)


def mlp(
    block: Any, cfg: Any, x: Float[Tensor, "... d_model"], weights: FastWeights | None = None
) -> Float[Tensor, "... d_model"]:
    """The block's MLP on an already normalised input.

    A gated MLP computes (act(x W_gate) * (x W_in) + b_in) W_out + b_out, TransformerLens's
    `GatedMLP` formula, with both input projections in one matmul when `weights` carries them.
    """
    m = block.mlp
    act = _ACTIVATIONS.get(cfg.act_fn)
    kind = type(m).__name__
    w_gate_in = weights.w_gate_in if weights is not None else None
    plain = kind == "MLP" and not cfg.gated_mlp
    if act is None or not (plain or (kind == "GatedMLP" and w_gate_in is not None)):
        return m(x)
    flat = x.reshape(-1, x.shape[-1])
    if w_gate_in is not None:
        gate, linear = (flat @ w_gate_in).chunk(2, dim=-1)
        # SiLU in place: `gate` is a view of this function's own matmul output (not where a
        # gradient is taken: autograd refuses in-place writes to one of several views).
        in_place = cfg.act_fn == "silu" and not torch.is_grad_enabled()
        gate = F.silu(gate, inplace=True) if in_place else act(gate)
        post = torch.addcmul(m.b_in, gate, linear)
    else:
        post = act(torch.addmm(m.b_in, flat, m.W_in))
    out = torch.addmm(m.b_out, post, m.W_out)
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
    kv = weights.n_kv_heads
    qkv = torch.addmm(weights.b_qkv, x.reshape(-1, d), weights.w_qkv).view(b, t, h + 2 * kv, dh)
    if attn.cfg.positional_embedding_type == "rotary":
        q, k = rotary(attn, qkv[:, :, : h + kv]).split([h, kv], dim=2)
        v = qkv[:, :, h + kv :]
    else:
        q, k, v = qkv.split([h, kv, kv], dim=2)  # [b, t, heads, dh]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, t, dh]
    if kv != h:  # each key/value head serves h // kv consecutive query heads
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    visible = torch.ones(t, t, dtype=torch.bool, device=x.device).tril_()
    if attn.attn_type == "local":
        visible.triu_(1 - int(attn.cfg.window_size))  # keys q - window < k <= q
    pattern = None
    if capture_pattern:
        scores = (q.float() @ k.float().transpose(-1, -2)) / float(attn.attn_scale)
        pattern = torch.softmax(scores.masked_fill_(~visible, float("-inf")), dim=-1)
        z = pattern.to(v.dtype) @ v
    elif attn.attn_type == "local":
        z = F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=1.0 / float(attn.attn_scale)
        )
    else:
        z = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=1.0 / float(attn.attn_scale)
        )
    z = z.transpose(1, 2)  # [b, t, h, dh]
    if head_mask is not None:
        z = z * head_mask[:, None, :, None].to(z.dtype)
    out = torch.addmm(weights.b_o, z.reshape(b * t, h * dh), weights.w_o).view(b, t, d)
    return out, z, pattern
