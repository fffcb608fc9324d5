"""Weight processing: what a run asks for and what can honestly be applied.

`effective_processing` turns the requested `Processing` into the `AppliedProcessing` that the
model's normalisation allows (stored with the model); TransformerLens's bridge applies it
(`compute.models.bridge.apply_processing`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compute.models.spec import Processing


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


# Architectures whose blocks normalise a sublayer's output before adding it to the residual
# stream (TransformerLens's POST_NORM_ARCHITECTURES, written out so the rule is read here).
POST_NORM_ARCHITECTURES = frozenset({"Olmo2ForCausalLM", "Olmo3ForCausalLM"})
# Architectures whose attention rows give part of their weight to a learned sink.
ATTENTION_SINK_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
# Architectures whose weights TransformerLens 4.3's processing (`enable_compatibility_mode`)
# does not leave computing the same function, as the architecture matrix measures it: any
# step applied, even one that is exact in principle, moves log-probabilities by over a nat.
# They run on their own weights, unprocessed.
UNPROCESSABLE: dict[str, str] = {
    "Gemma2ForCausalLM": "TransformerLens 4.3's weight processing changes Gemma 2's function "
    "(1.3 nats of log-probability on the architecture matrix): its weights are used as stored",
    "Gemma3ForCausalLM": "TransformerLens 4.3's weight processing changes Gemma 3's function "
    "(2.4 nats of log-probability on the architecture matrix): its weights are used as stored",
    "BitNetForCausalLM": "TransformerLens 4.3's weight processing changes BitNet's function "
    "(7.9 nats on the architecture matrix): its weights are used as stored",
    "Llama4ForCausalLM": "TransformerLens 4.3's weight processing changes Llama 4's function "
    "(2.8 nats on the architecture matrix): its weights are used as stored",
    "VaultGemmaForCausalLM": "TransformerLens 4.3 refuses to process VaultGemma's weights: "
    "they are used as stored",
    "Gemma4ForCausalLM": "TransformerLens 4.3's weight processing changes Gemma 4's function "
    "(2.0 nats on the architecture matrix): its weights are used as stored",
}


def effective_processing(requested: Processing, cfg: Mapping[str, Any] | None) -> AppliedProcessing:
    """Processing that can honestly be applied to a model with this TransformerLens config
    (a dict of HookedTransformer config fields; None: no normalisation at all).

    Each step is kept only where it leaves the model's function unchanged:
    - LayerNorm folding needs a norm before the weights it folds into: not for post-norm
      blocks (OLMo 2/3 normalise the sublayer's output), nor for models without a norm;
    - centering writing weights needs every read of the residual to remove the mean: not for
      RMSNorm, nor where a write passes through a norm of its own first (post-norm blocks and
      Gemma 2/3's post-sublayer norms);
    - centering the unembedding shifts every logit of a position by the same amount, which
      softmax ignores but a logit soft-cap (Gemma 2) does not;
    - folding value biases into b_O needs each attention row to sum to one: not with attention
      sinks (GPT-OSS), whose rows give part of their weight to the sink;
    - and none at all for the architectures of `UNPROCESSABLE`;
    - nor a step the architecture's TransformerLens adapter declares it does not take
      (`supports_fold_ln`, `supports_center_writing_weights`: TransformerLens skips it, so the
      stored record says it was not applied).
    """
    cfg = cfg or {}
    notes: list[str] = []
    norm = cfg.get("normalization_type")
    architecture = cfg.get("original_architecture")
    if architecture in UNPROCESSABLE:
        asked = (
            requested.fold_ln,
            requested.center_writing_weights,
            requested.center_unembed,
            requested.fold_value_biases,
        )
        why = (UNPROCESSABLE[str(architecture)],) if any(asked) else ()
        return AppliedProcessing(False, False, False, False, why)
    post_norm = architecture in POST_NORM_ARCHITECTURES
    fold, center = requested.fold_ln, requested.center_writing_weights
    unembed, values = requested.center_unembed, requested.fold_value_biases
    if norm is not None and str(norm).startswith("RMS") and center:
        center = False
        notes.append("RMSNorm does not remove the mean: writing weights were not centered")
    if norm is None and fold:
        fold = False
        notes.append("model has no normalisation: nothing to fold")
    if norm is None and center:
        center = False
        notes.append("model has no normalisation: writing weights were not centered")
    if post_norm and fold:
        fold = False
        notes.append(f"{architecture} normalises after each sublayer: norms were not folded")
    if (post_norm or cfg.get("use_normalization_before_and_after")) and center:
        center = False
        notes.append("writes pass through a norm of their own: writing weights were not centered")
    adapter = str(architecture or "this architecture")
    if fold and not cfg.get("adapter_folds_ln", True):
        fold = False
        notes.append(f"TransformerLens 4.3's adapter for {adapter} does not fold its norms")
    if center and not cfg.get("adapter_centers_writes", True):
        center = False
        notes.append(f"TransformerLens 4.3's adapter for {adapter} does not center writing weights")
    soft_cap = cfg.get("output_logits_soft_cap")
    if unembed and soft_cap is not None and soft_cap > 0:
        unembed = False
        notes.append("a logit soft-cap is not shift-invariant: the unembedding was not centered")
    if values and (cfg.get("use_attention_sinks") or architecture in ATTENTION_SINK_ARCHITECTURES):
        values = False
        notes.append("attention sinks: rows do not sum to one, value biases were not folded")
    return AppliedProcessing(fold, center, unembed, values, tuple(notes))
