"""TransformerLens weight processing: what a run asks for, what can honestly be applied, and
applying it one block at a time.

`effective_processing` turns the requested `Processing` into the `AppliedProcessing` that the
model's normalisation allows (stored with the model). `load_state_dict_into` runs
TransformerLens's own `load_and_process_state_dict`, with its whole-dict weight processing
patched to work block by block for the duration of the call (`_processing_block_by_block`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.module import _IncompatibleKeys

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


def effective_processing(requested: Processing, cfg: Mapping[str, Any] | None) -> AppliedProcessing:
    """Processing that can honestly be applied to a model with this TransformerLens config
    (a dict of `HookedTransformerConfig` fields; None: no normalisation at all).

    Each step is kept only where it leaves the model's function unchanged:
    - LayerNorm folding needs a norm before the weights it folds into: not for post-norm
      blocks (OLMo 2/3 normalise the sublayer's output), nor for models without a norm;
    - centering writing weights needs every read of the residual to remove the mean: not for
      RMSNorm, nor where a write passes through a norm of its own first (post-norm blocks and
      Gemma 2/3's post-sublayer norms);
    - centering the unembedding shifts every logit of a position by the same amount, which
      softmax ignores but a logit soft-cap (Gemma 2) does not;
    - folding value biases into b_O needs each attention row to sum to one: not with attention
      sinks (GPT-OSS), whose rows give part of their weight to the sink.
    """
    cfg = cfg or {}
    notes: list[str] = []
    norm = cfg.get("normalization_type")
    architecture = cfg.get("original_architecture")
    post_norm = architecture in POST_NORM_ARCHITECTURES
    fold, center = requested.fold_ln, requested.center_writing_weights
    unembed, values = requested.center_unembed, requested.fold_value_biases
    if norm is not None and str(norm).startswith("RMS") and center:
        center = False
        notes.append("RMSNorm does not remove the mean: writing weights were not centered")
    if norm is None and fold:
        fold = False
        notes.append("model has no normalisation: nothing to fold")
    if post_norm and fold:
        fold = False
        notes.append(f"{architecture} normalises after each sublayer: norms were not folded")
    if (post_norm or cfg.get("use_normalization_before_and_after")) and center:
        center = False
        notes.append("writes pass through a norm of their own: writing weights were not centered")
    soft_cap = cfg.get("output_logits_soft_cap")
    if unembed and soft_cap is not None and soft_cap > 0:
        unembed = False
        notes.append("a logit soft-cap is not shift-invariant: the unembedding was not centered")
    if values and cfg.get("use_attention_sinks"):
        values = False
        notes.append("attention sinks: rows do not sum to one, value biases were not folded")
    return AppliedProcessing(fold, center, unembed, values, tuple(notes))


def load_state_dict_into(
    model: Any, state_dict: dict[str, Tensor], applied: AppliedProcessing
) -> None:
    """Load `state_dict` into `model`, processed as `applied` says (block by block)."""
    with _processing_block_by_block(model):
        model.load_and_process_state_dict(
            state_dict,
            fold_ln=applied.fold_ln,
            center_writing_weights=applied.center_writing_weights,
            center_unembed=applied.center_unembed,
            fold_value_biases=applied.fold_value_biases,
            refactor_factored_attn_matrices=False,
        )


def _place(model: Any, key: str, value: Tensor) -> Tensor:
    """Copy a processed tensor into the model's own parameter (cast to its dtype and device) and
    return that parameter, so that the processed float32 copy is freed at once; `value` itself
    where the model has no such tensor or its shape differs (`load_state_dict` then decides)."""
    try:
        target = model.get_parameter(key)
    except AttributeError:
        return value
    if target.shape != value.shape:
        return value
    with torch.no_grad():
        target.copy_(value)
    return target


@contextlib.contextmanager
def _processing_block_by_block(model: Any) -> Iterator[None]:
    """TransformerLens's weight processing applied one block at a time.

    `ProcessWeights.process_weights` works on the whole state dict at once and keeps the
    unprocessed and processed versions of every tensor (and its temporaries) alive together:
    for GPT-2 small that is 2.3 GB on top of 0.6 GB of weights, the peak of a whole run. Every
    step of it is local to a block (folding a block's norms into its own weights, centering its
    writes, folding its value biases) or to the embeddings and unembedding, so it is applied to
    one block's keys at a time (renamed to block 0 of a one-layer config) and then to the rest,
    each source tensor released as soon as its block is done and each processed tensor copied
    into the model's own parameter at once (`_place`): the float32 processed state dict never
    exists whole next to the model. The processed tensors are identical; if a step needs keys
    outside a block (KeyError) the whole dict is processed as before.
    """
    from transformer_lens.weight_processing import ProcessWeights

    whole = ProcessWeights.process_weights

    def by_block(state_dict: dict[str, Tensor], cfg: Any, **kwargs: Any) -> dict[str, Tensor]:
        import copy

        one, rest = copy.copy(cfg), copy.copy(cfg)
        one.n_layers, rest.n_layers = 1, 0
        blocks_ = [
            {
                "blocks.0." + k.split(".", 2)[2]: k
                for k in state_dict
                if k.startswith(f"blocks.{layer}.")
            }
            for layer in range(cfg.n_layers)
        ]
        others = [k for k in state_dict if not k.startswith("blocks.")]
        # Centering insists on finding the embeddings and unembedding in any dict it is given:
        # a block's dict gets a one-row (two-column) stand-in of each, dropped afterwards.
        stand_ins: dict[str, Tensor] = {
            k: state_dict[k][:1].clone()
            for k in ("embed.W_E", "pos_embed.W_pos")
            if k in state_dict
        }
        stand_ins |= {
            k: state_dict[k][..., :2].clone()
            for k in ("unembed.W_U", "unembed.b_U")
            if k in state_dict
        }

        def block_dict(names: dict[str, str], take: Callable[[str], Tensor]) -> dict[str, Tensor]:
            return {
                **{new: take(old) for new, old in names.items()},
                **{k: v.clone() for k, v in stand_ins.items()},
            }

        out: dict[str, Tensor] = {}

        def place(done: dict[str, Tensor], keys: dict[str, str]) -> None:
            for k, v in done.items():
                if k in keys:
                    out[keys[k]] = _place(model, keys[k], v)

        # The embeddings, then the unembedding and final norm (each with stand-ins of the other),
        # then block 0: first and without consuming anything, so that a step needing keys
        # outside its part (KeyError) can still fall back to processing the whole dict. They go
        # first because the model's pages are then still untouched: their transients (several
        # vocabulary-sized copies) do not add to a nearly full model.
        embeds = [k for k in others if k.startswith(("embed.", "pos_embed."))]
        firsts: list[str] = []
        try:
            for group in (embeds, [k for k in others if k not in embeds]):
                part = {k: v.clone() for k, v in stand_ins.items() if k not in group}
                part.update({k: state_dict[k] for k in group})
                place(whole(part, rest, **kwargs), {k: k for k in group})
                firsts += group
                del part
            if blocks_:
                place(
                    whole(block_dict(blocks_[0], state_dict.__getitem__), one, **kwargs),
                    {new: "blocks.0." + new.split(".", 2)[2] for new in blocks_[0]},
                )
                firsts += blocks_[0].values()
        except KeyError:
            return whole(state_dict, cfg, **kwargs)
        for key in firsts:
            del state_dict[key]
        for layer, names in enumerate(blocks_[1:], start=1):
            prefix = f"blocks.{layer}."
            place(
                whole(block_dict(names, state_dict.pop), one, **kwargs),
                {new: prefix + new.split(".", 2)[2] for new in names},
            )
        return out

    # TransformerLens then loads the processed dict one key at a time, and each
    # `load_state_dict` call walks every module: keys x modules, 540,000 module visits and about
    # 4 s of CPU for SmolLM2-135M. A key whose tensor `_place` already put into the model is
    # skipped; any other goes through `load_state_dict` as before.
    load_whole = model.load_state_dict

    def load_unplaced(
        state_dict: dict[str, Tensor], strict: bool = True, assign: bool = False
    ) -> Any:
        if len(state_dict) == 1 and not assign:
            ((key, value),) = state_dict.items()
            with contextlib.suppress(AttributeError):
                if model.get_parameter(key) is value:
                    return _IncompatibleKeys([], [])
        return load_whole(state_dict, strict=strict, assign=assign)

    ProcessWeights.process_weights = staticmethod(by_block)  # type: ignore[method-assign,assignment]
    model.load_state_dict = load_unplaced
    try:
        yield
    finally:
        ProcessWeights.process_weights = staticmethod(whole)  # type: ignore[method-assign]
        del model.load_state_dict
