"""Hugging Face config -> TransformerLens config, for the architectures TransformerLens 3.9
converts only under hard-coded official names.

TransformerLens's `convert_hf_model_config` knows Gemma 1/2/3 and OLMo 1/2 only by their hub
names (`google/gemma-2-2b`, `allenai/OLMo-2-0425-1B`, ...) with every dimension written out, so
a local checkpoint of any of them — a fine-tune, a smaller sibling, the matrix's tiny models —
fails with "... is not currently supported". And its Phi branch reads
`hf_config.partial_rotary_factor`, which transformers 5 moved into `rope_parameters`. For these
architectures the TransformerLens config is built here from the checkpoint's own config.json,
with the fields TransformerLens's hard-coded entries use; TransformerLens's weight converters
(chosen by `original_architecture`) then do the rest. Every other architecture goes through
TransformerLens's converter unchanged. The architecture matrix
(`compute/zoo/architectures.py`) holds each of these to the Hugging Face forward.

A mechanism that TransformerLens's blocks or converters do not implement raises
`UnsupportedArchitectureError`, naming it, instead of loading a model that computes something
else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compute.errors import UnsupportedArchitectureError

Converter = Callable[[Any], dict[str, Any]]


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _rope(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters (transformers 5 keeps them in `rope_parameters`, per layer type for
    models with two bases; older configs have `rope_theta` and `rope_scaling`)."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    elif "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]
    out = dict(params)
    if "rope_theta" not in out and getattr(config, "rope_theta", None) is not None:
        out["rope_theta"] = config.rope_theta
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict):
        out = {**scaling, **out}
    return out


def _plain_rope(config: Any, arch: str, layer_type: str | None = None) -> float:
    rope = _rope(config, layer_type)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise UnsupportedArchitectureError(
            f"{arch} with rope scaling {kind!r}: TransformerLens's {arch} blocks implement "
            "plain rotary embeddings only"
        )
    return float(rope.get("rope_theta", 10000.0))


def _head_dim(config: Any) -> int:
    return int(_get(config, "head_dim", default=config.hidden_size // config.num_attention_heads))


def _gemma_common(config: Any, arch: str) -> dict[str, Any]:
    act = _get(config, "hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    return {
        "d_model": config.hidden_size,
        "d_head": _head_dim(config),
        "n_heads": config.num_attention_heads,
        "d_mlp": config.intermediate_size,
        "n_layers": config.num_hidden_layers,
        "n_ctx": config.max_position_embeddings,
        "eps": config.rms_norm_eps,
        "d_vocab": config.vocab_size,
        "act_fn": act,
        "initializer_range": config.initializer_range,
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "rotary_dim": _head_dim(config),
        "use_attn_scale": True,
        "n_key_value_heads": config.num_key_value_heads,
        "gated_mlp": True,
        "final_rms": True,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", True)),
    }


def _query_scale(config: Any) -> dict[str, Any]:
    """Gemma 2/3 scale the scores by query_pre_attn_scalar ** -0.5, not d_head ** -0.5."""
    scalar = getattr(config, "query_pre_attn_scalar", None)
    return {} if scalar is None else {"attn_scale": float(scalar) ** 0.5}


def _layer_kinds(config: Any) -> list[str]:
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return ["local" if t == "sliding_attention" else "global" for t in types]


def _windows(config: Any) -> dict[str, Any]:
    kinds = _layer_kinds(config)
    window = getattr(config, "sliding_window", None)
    if "local" not in kinds or not window:
        return {"attn_types": ["global"] * len(kinds)}
    return {"use_local_attn": True, "window_size": int(window), "attn_types": kinds}


def gemma(config: Any) -> dict[str, Any]:
    arch = "GemmaForCausalLM"
    return {**_gemma_common(config, arch), "rotary_base": _plain_rope(config, arch)}


def gemma2(config: Any) -> dict[str, Any]:
    arch = "Gemma2ForCausalLM"
    return {
        **_gemma_common(config, arch),
        **_query_scale(config),
        **_windows(config),
        "rotary_base": _plain_rope(config, arch),
        "attn_scores_soft_cap": float(_get(config, "attn_logit_softcapping", default=-1.0)),
        "output_logits_soft_cap": float(_get(config, "final_logit_softcapping", default=-1.0)),
        "use_normalization_before_and_after": True,
    }


def gemma3(config: Any) -> dict[str, Any]:
    arch = "Gemma3ForCausalLM"
    out = {
        **_gemma_common(config, arch),
        **_query_scale(config),
        **_windows(config),
        "rotary_base": _plain_rope(config, arch, "full_attention"),
        "use_normalization_before_and_after": True,
        "use_qk_norm": True,
    }
    local = _plain_rope(config, arch, "sliding_attention")
    if local != out["rotary_base"]:
        out["rotary_base_local"] = local
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, field, None):
            raise UnsupportedArchitectureError(
                f"{arch} with {field}: TransformerLens's Gemma 3 blocks have no soft-cap"
            )
    return out


def _olmo_common(config: Any, arch: str) -> dict[str, Any]:
    if config.num_key_value_heads != config.num_attention_heads:
        raise UnsupportedArchitectureError(
            f"{arch} with grouped-query attention ({config.num_key_value_heads} key/value heads "
            f"for {config.num_attention_heads}): TransformerLens's {arch} weight converter "
            "assumes one key/value head per query head"
        )
    if getattr(config, "attention_bias", False):
        raise UnsupportedArchitectureError(
            f"{arch} with attention biases: TransformerLens's {arch} converter drops them"
        )
    return {
        "d_model": config.hidden_size,
        "d_head": config.hidden_size // config.num_attention_heads,
        "n_heads": config.num_attention_heads,
        "d_mlp": config.intermediate_size,
        "n_layers": config.num_hidden_layers,
        "n_ctx": config.max_position_embeddings,
        "d_vocab": config.vocab_size,
        "act_fn": config.hidden_act,
        "initializer_range": config.initializer_range,
        "rotary_base": _plain_rope(config, arch),
        "attn_types": ["global"] * config.num_hidden_layers,
        "positional_embedding_type": "rotary",
        "gated_mlp": True,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }


def olmo(config: Any) -> dict[str, Any]:
    # OLMo 1's LayerNorm has no parameters; TransformerLens's converter gives it unit gains.
    return {
        **_olmo_common(config, "OlmoForCausalLM"),
        "eps": 1e-5,
        "normalization_type": "LN",
        "clip_qkv": getattr(config, "clip_qkv", None),
    }


def olmo2(config: Any) -> dict[str, Any]:
    return {
        **_olmo_common(config, "Olmo2ForCausalLM"),
        "eps": config.rms_norm_eps,
        "normalization_type": "RMS",
    }


def phi(config: Any) -> dict[str, Any]:
    rope = _rope(config)
    factor = float(rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 0.5)))
    d_head = config.hidden_size // config.num_attention_heads
    if getattr(config, "qk_layernorm", False):
        raise UnsupportedArchitectureError(
            "PhiForCausalLM with qk_layernorm: TransformerLens's Phi blocks have no qk-norm"
        )
    if config.num_key_value_heads not in (None, config.num_attention_heads):
        raise UnsupportedArchitectureError(
            "PhiForCausalLM with grouped-query attention: TransformerLens's Phi converter "
            "assumes one key/value head per query head"
        )
    return {
        "d_model": config.hidden_size,
        "d_head": d_head,
        "n_heads": config.num_attention_heads,
        "d_mlp": config.intermediate_size,
        "n_layers": config.num_hidden_layers,
        "n_ctx": config.max_position_embeddings,
        "eps": config.layer_norm_eps,
        "d_vocab": config.vocab_size,
        "act_fn": config.hidden_act,
        "initializer_range": config.initializer_range,
        "normalization_type": "LN",
        "positional_embedding_type": "rotary",
        "rotary_base": _plain_rope(config, "PhiForCausalLM"),
        "rotary_dim": round(factor * d_head),
        "use_attn_scale": True,
        "parallel_attn_mlp": True,
        "default_prepend_bos": False,
    }


# The architectures whose TransformerLens config is built here (the rest: TransformerLens's).
CONVERTERS: dict[str, Converter] = {
    "GemmaForCausalLM": gemma,
    "Gemma2ForCausalLM": gemma2,
    "Gemma3ForCausalLM": gemma3,
    "OlmoForCausalLM": olmo,
    "Olmo2ForCausalLM": olmo2,
    "PhiForCausalLM": phi,
}


def converted_config(config_dir: str) -> dict[str, Any]:
    """The TransformerLens config dict for the checkpoint config in `config_dir`."""
    import transformer_lens.loading_from_pretrained as loading
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config_dir)
    architecture = (getattr(hf_config, "architectures", None) or [None])[0]
    convert = CONVERTERS.get(str(architecture))
    if convert is None:
        return dict(loading.convert_hf_model_config(config_dir))
    cfg_dict = convert(hf_config)
    cfg_dict["original_architecture"] = architecture
    cfg_dict["tokenizer_name"] = config_dir
    cfg_dict["quantization_method"] = None
    return cfg_dict
