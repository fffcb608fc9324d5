"""What Strata refuses to load, and why: one entry per architecture or mechanism, read from a
checkpoint's config alone (no weights, no heavy imports), so a refusal is fast and names its
cause.

A checkpoint is loaded only if
1. its architecture is a causal language model's head (`...ForCausalLM`, `...LMHeadModel`):
   Strata's metrics read next-token predictions;
2. TransformerLens's installed version has an adapter for it (`supported_architectures`);
3. no entry of `REFUSED` matches it. Each entry names a mechanism that the bridge's hook points
   cannot take apart the way Strata's families need, found by the architecture matrix
   (`compute/zoo/architectures.py`), which holds everything else to the Hugging Face forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from compute.models.bridge import supported_architectures

_CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class Refusal:
    """An architecture (or a mechanism within one) Strata will not run, and why."""

    architecture: str
    reason: str
    # None: every checkpoint of the architecture; else only configs it returns True for
    applies: Callable[[Mapping[str, Any]], bool] | None = None


def _no_attention(layers: str, block: str) -> str:
    return (
        f"{layers} have no attention: Strata runs every block as attention then MLP and reads "
        f"its attention write (hook_attn_out), which TransformerLens 4.3's {block} blocks do "
        "not have, so the clean forward itself cannot run (families that would run per block "
        "on these layers, and attention families on the attention layers only, are not "
        "implemented)"
    )


_MLA = (
    "multi-head latent attention: each head's value is v_head_dim wide, not TransformerLens "
    "4.3's d_head (the rotary query/key width), so its hook_z split and its W_O split disagree "
    "(W_O raises PerLayerGeometryError) and the head-ablation families cannot compute one "
    "head's write; the clean forward matches Hugging Face"
)


REFUSED: tuple[Refusal, ...] = (
    Refusal(
        "PhiForCausalLM",
        "PhiForCausalLM with qk_layernorm: TransformerLens 4.3's Phi attention declares no "
        "q/k norms, so the bridge refuses to boot it (its forward would skip the norms)",
        lambda c: bool(c.get("qk_layernorm")),
    ),
    Refusal(
        "GraniteMoeHybridForCausalLM",
        "Mamba-2 layers: TransformerLens 4.3 cannot boot a Granite hybrid without a rotary "
        "embedding (its adapter binds model.rotary_emb; Granite 4.0's hybrids have "
        "position_embedding_type 'nope'); " + _no_attention("its Mamba-2 layers", "Granite hybrid"),
    ),
    Refusal(
        "FalconForCausalLM",
        "Falcon's new decoder architecture with grouped key/value heads: TransformerLens 4.3 "
        "splits the fused QKV projection as if there were one key/value head (split sizes "
        "[64, 16, 16] for a 128-wide projection on the matrix), so the model cannot be loaded",
        lambda c: bool(c.get("new_decoder_architecture")) and int(c.get("num_kv_heads") or 1) > 1,
    ),
    Refusal(
        "CodeGenForCausalLM",
        "TransformerLens 4.3's CodeGen attention reads attention.embed_positions, which "
        "transformers 5's CodeGenAttention no longer has: the bridge cannot run a forward",
    ),
    Refusal(
        "Gemma4ForCausalLM",
        "cross-layer key/value state: Gemma 4's attention stores its keys and values in a "
        "shared_kv_states dict that the model's forward hands every layer (and the per-layer-"
        "input variants also read a per-layer embedding of the tokens), while Strata runs each "
        "block from its residual stream alone, so its blocks fail",
    ),
    Refusal(
        "HrmTextForCausalLM",
        "hierarchical recurrent stacks: the model runs two stacks (H and L) in cycles, and "
        "TransformerLens 4.3's bridge for it has no single block list for Strata to run in order",
    ),
    Refusal(
        "DeepseekV4ForCausalLM",
        "hyper-connections and compressed sparse attention: each block mixes several residual "
        "streams, and TransformerLens 4.3's DeepSeek V4 block exposes no attention write "
        "(hook_attn_out) for Strata to read",
    ),
    Refusal(
        "JetMoeForCausalLM",
        "mixture of attention heads: heads are routed experts, and TransformerLens 4.3's JetMoE "
        "attention has no hook_z, so the head-ablation families have no per-head output to "
        "zero; the clean forward matches Hugging Face",
    ),
    Refusal(
        "ModernBertDecoderForCausalLM",
        "prediction head: a dense layer, GELU and LayerNorm sit between the final norm and the "
        "unembedding, and Strata's logits are the final norm and W_U only (10 nats of "
        "log-probability on the architecture matrix)",
    ),
    Refusal("DeepseekV2ForCausalLM", _MLA),
    Refusal("DeepseekV3ForCausalLM", _MLA),
    Refusal("Glm4MoeLiteForCausalLM", _MLA),
    Refusal("GlmMoeDsaForCausalLM", _MLA + " (and a learned indexer picks which keys it reads)"),
    Refusal("YoutuForCausalLM", _MLA),
    Refusal(
        "FalconH1ForCausalLM",
        "parallel Mamba-2 branch: TransformerLens 4.3's LayerNorm folding fails on Falcon-H1 "
        "(a shape mismatch in fold_layer_norm_weight_single) and Strata processes weights by "
        "default; and each block's Mamba-2 write joins the residual stream beside attention's, "
        "outside Strata's attention/MLP decomposition of a block (unprocessed, the clean forward "
        "matches Hugging Face)",
    ),
    Refusal(
        "Qwen3NextForCausalLM",
        _no_attention("its gated delta-net (linear attention) layers", "Qwen3-Next"),
    ),
    Refusal(
        "Qwen3_5ForCausalLM",
        _no_attention("its gated delta-net (linear attention) layers", "Qwen 3.5"),
    ),
    Refusal(
        "Qwen3_5MoeForCausalLM",
        _no_attention("its gated delta-net (linear attention) layers", "Qwen 3.5 MoE"),
    ),
    Refusal(
        "OlmoHybridForCausalLM",
        _no_attention("its gated delta-net (linear attention) layers", "OLMo hybrid"),
    ),
    Refusal("JambaForCausalLM", _no_attention("its Mamba layers", "Jamba")),
    Refusal("BambaForCausalLM", _no_attention("its Mamba-2 layers", "Bamba")),
    Refusal("Zamba2ForCausalLM", _no_attention("its Mamba-2 layers", "Zamba 2")),
    Refusal("NemotronHForCausalLM", _no_attention("its Mamba-2 and MLP-only layers", "Nemotron-H")),
    Refusal("Lfm2ForCausalLM", _no_attention("its short-convolution layers", "LFM2")),
    Refusal("Lfm2MoeForCausalLM", _no_attention("its short-convolution layers", "LFM2 MoE")),
    Refusal("MambaForCausalLM", _no_attention("state-space (Mamba) layers", "Mamba")),
    Refusal("Mamba2ForCausalLM", _no_attention("state-space (Mamba-2) layers", "Mamba-2")),
    Refusal("FalconMambaForCausalLM", _no_attention("state-space (Mamba) layers", "Falcon Mamba")),
    Refusal("RwkvForCausalLM", _no_attention("RWKV's time-mixing layers", "RWKV")),
    Refusal(
        "RecurrentGemmaForCausalLM",
        _no_attention("its linear-recurrence (RG-LRU) layers", "RecurrentGemma"),
    ),
)


def refusal_of(architecture: str, config: Mapping[str, Any]) -> str | None:
    """Why Strata refuses a checkpoint of `architecture` with config.json `config` (None:
    it does not)."""
    if not architecture.endswith(_CAUSAL_HEADS):
        return (
            "not a causal language model (Strata measures next-token predictions; it loads "
            "architectures whose head is ...ForCausalLM or ...LMHeadModel)"
        )
    if architecture not in supported_architectures():
        from importlib.metadata import version

        return (
            f"TransformerLens {version('transformer-lens')} has no adapter for this "
            "architecture, so it cannot be hooked"
        )
    for entry in REFUSED:
        if entry.architecture == architecture and (entry.applies is None or entry.applies(config)):
            return entry.reason
    return None
