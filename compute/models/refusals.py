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

`REFUSED_FAMILIES` names, per architecture Strata runs, the metric families it does not run
there and why (a mechanism that leaves a family nothing to measure as defined).
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


REFUSED: tuple[Refusal, ...] = (
    Refusal(
        "PhiForCausalLM",
        "PhiForCausalLM with qk_layernorm: TransformerLens 4.3's Phi attention declares no "
        "q/k norms, so the bridge refuses to boot it (its forward would skip the norms)",
        lambda c: bool(c.get("qk_layernorm")),
    ),
    Refusal(
        "GraniteMoeHybridForCausalLM",
        "scaled sublayer writes: TransformerLens 4.3 cannot boot a Granite hybrid without a "
        "rotary embedding (its adapter binds model.rotary_emb; Granite 4.0's hybrids have "
        "position_embedding_type 'nope'), and where it boots, each block adds its sublayers' "
        "outputs times residual_multiplier inline while the bridge hooks the Mamba-2 mixer's "
        "output before that scale and the MLP's write (experts plus a shared MLP) as no single "
        "tensor, so no write can be read or zeroed as the block adds it",
    ),
    Refusal(
        "FalconForCausalLM",
        "Falcon's new decoder architecture with grouped key/value heads: TransformerLens 4.3 "
        "splits the fused QKV projection as if there were one key/value head (split sizes "
        "[64, 16, 16] for a 128-wide projection on the matrix), so the model cannot be loaded",
        lambda c: bool(c.get("new_decoder_architecture")) and int(c.get("num_kv_heads") or 1) > 1,
    ),
    Refusal(
        "Gemma4ForCausalLM",
        "per-layer token inputs: a Gemma 4 with hidden_size_per_layer_input > 0 (the default) "
        "hands every layer its own embedding of the tokens besides the residual stream, an "
        "input the model's forward computes from the token ids, while Strata runs each block "
        "from its residual stream alone",
        lambda c: int(c.get("hidden_size_per_layer_input", 256) or 0) > 0,
    ),
    Refusal(
        "Gemma4ForCausalLM",
        "cross-layer key/value state: with num_kv_shared_layers > 0 Gemma 4's last layers "
        "reuse the keys and values an earlier layer stored in a shared_kv_states dict during "
        "the same forward, so a block's output depends on another block's run, not on its "
        "residual stream alone (a dropped, swapped or head-ablated block would read stale keys)",
        lambda c: int(c.get("num_kv_shared_layers") or 0) > 0,
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
        "FalconH1ForCausalLM",
        "parallel Mamba-2 branch: each block's attention and Mamba-2 mixer read the same input "
        "and both write to the residual stream (each times its own multiplier), two token "
        "mixers side by side where Strata's block kinds have one; and TransformerLens 4.3's "
        "LayerNorm folding fails on Falcon-H1 (a shape mismatch in "
        "fold_layer_norm_weight_single) while Strata processes weights by default "
        "(unprocessed, the clean forward matches Hugging Face)",
    ),
    Refusal(
        "Zamba2ForCausalLM",
        "shared attention block on a second input: Zamba 2's hybrid layers run one shared "
        "transformer block on the residual stream concatenated with the token embeddings (an "
        "input the model's forward hands those layers besides the residual stream), and "
        "TransformerLens 4.3 bridges a hybrid layer as one opaque module, so Strata can neither "
        "run the block from its residual stream alone nor read its sublayers' writes",
    ),
    Refusal(
        "RwkvForCausalLM",
        "rescaled residual stream: at inference RWKV divides its output projections by "
        "2^(layer // rescale_every) and halves the residual stream after every rescale_every-th "
        "block in the model's own loop, between blocks, which Strata's runs of one block at a "
        "time do not reproduce (the matrix's 3-layer model never reaches a halving; a 4-layer "
        "one rescaled every 2 blocks differs from Hugging Face by 0.52 nats)",
    ),
)


@dataclass(frozen=True)
class FamilyRefusal:
    """Metric families Strata will not run on an architecture it otherwise runs exactly, and
    why: the mechanism leaves the family nothing it could measure as docs/metrics.md defines
    it. A run asking for them records the refusal (the model's `refused_families`) and
    computes the rest; one asking for nothing else is refused."""

    architecture: str
    families: tuple[str, ...]
    reason: str


REFUSED_FAMILIES: tuple[FamilyRefusal, ...] = (
    FamilyRefusal(
        "JetMoeForCausalLM",
        ("attention", "heads", "heads_atp", "heads_screen"),
        "mixture of attention heads: each token's query heads come from the attention experts "
        "its router picks (each expert with its own query and output projections over shared "
        "keys and values), so one head slot of the pattern and of z holds a different expert "
        "from token to token: there is no fixed head whose pattern to read, whose z to "
        "ablate or to screen",
    ),
    FamilyRefusal(
        "ModernBertDecoderForCausalLM",
        ("neurons",),
        "prediction head: a dense layer, GELU and LayerNorm sit between the final norm and the "
        "unembedding (Strata's logits read a residual through all three), so W_U's columns "
        "live in the head's output space, not the residual stream's, and a neuron's output "
        "row has no cosine with them to classify",
    ),
)


def refused_families(architecture: str) -> dict[str, str]:
    """The metric families Strata refuses on `architecture` (its name alone: known from
    config.json before any weight is read), each with the reason."""
    return {
        family: entry.reason
        for entry in REFUSED_FAMILIES
        if entry.architecture == architecture
        for family in entry.families
    }


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
