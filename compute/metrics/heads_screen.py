"""heads_screen.* — every head screened, then the screen's top k heads ablated exactly.

`heads.ablation_loss_delta` zeroes one head's z and reruns everything after it (H x L
downstream passes, each with its unembedding); `heads_atp` linearises the whole model around
the clean pass at the head's z. This screen keeps what is cheap to compute exactly exact and
linearises only what is expensive:

1. **The block, exactly.** For block l and head h, the residual after the block with h's z
   zeroed, r_h = `heads.ablated_block_output` (the same function the exact family uses): the
   head's term removed from the attention write, then whatever the block does after it — the
   MLP that reads the changed residual and, on models with a norm after attention (Gemma 2/3,
   OLMo 2/3), that norm, which rescales the remaining heads' writes when one is zeroed. On the
   fused blocks this is one MLP per head; on blocks whose write is not linear in z, one block.
   AtP differentiates through that norm at the clean point and sees none of the rescaling:
   docs/performance.md measured its Spearman at 0.31 on Gemma 3 270M for that reason.

2. **What follows, to first order, integrated along a path.** With F_l the summed next-token
   loss over the evaluated positions as a function of the residual after block l,

       loss(h zeroed) - loss  ~  (r_h - r) . (1/S) sum_i dF_l/dr at path point alpha_i

   alpha_i = (i-1)/S, i = 1..S (`EngineOptions.screen_steps`): the points where every head of
   every block has its z scaled by 1 - alpha_i, the path from the clean heads' outputs to zero
   that EAP-IG (Hanna et al. 2024) integrates along for all components at once. S = 1 is the
   gradient at the clean model. One forward with gradients and one backward per point gives
   dF_l/dr for every block at once. Divided by the sequence's T-2 evaluated positions, the
   estimate is of the sequence's mean loss delta, as the exact number is.

3. **The top k, exactly.** After every batch is screened, the k heads with the largest mean
   estimate (`EngineOptions.screen_top_k`) are ablated exactly by `heads.head_ablations` — the
   implementation of `heads.ablation_*`, called, not copied — on every batch again (its clean
   pass recomputed from the tokens the screen saw): `heads_screen.ablation_loss_delta` and
   `heads_screen.ablation_kl` are those heads' exact numbers, so the heads a user acts on are
   measured, not estimated.

Why a path shared by all heads and not one per head: integrating dF_l along head h's own
straight line from r to r_h costs S downstream passes with gradients per head — S times the
exact ablation it estimates. The shared path costs S passes for every head together. It is not
the integral along each head's own line (it is where the model has every head scaled at once),
so its accuracy for one head's ablation is a question of measurement, and the measurement
(docs/performance.md, "The head screen against exact ablation") decided the default S.

AtP*'s fixes (Kramár et al. 2024), where they apply: the QK fix computes exactly the part of a
patch that passes through a softmax it would otherwise linearise; zeroing z changes no pattern
of its own block, and step 1 is the same idea for the nonlinear parts this intervention does
pass through locally (the norm after attention, the block's MLP). GradDrop (one backward per
block with that block's gradient path dropped, against cancellation between paths) costs L
backward passes and is not implemented: the exact top k is the screen's safeguard instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor

from compute.memory import ModelDims, batch_budget_bytes, screen_bytes_per_sequence
from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.metrics.heads import ablated_block_output, head_ablations, head_group_size
from compute.metrics.heads_atp import loss_gradient
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator

# The batches the screen saw, per run (its accumulator): the exact top k runs on them again in
# `finish`, when the screen's ranking over every batch is known.
_SEEN: weakref.WeakKeyDictionary[MeanAccumulator, list[tuple[int, Tensor]]] = (
    weakref.WeakKeyDictionary()
)


def path_points(steps: int) -> list[float]:
    """alpha_1..alpha_S = 0, 1/S, .., (S-1)/S: each head's z is scaled by 1 - alpha."""
    return [i / steps for i in range(steps)]


def residual_gradients(
    lm: LoadedModel, tokens: Tensor, embedded: Tensor, alphas: list[float], opts: EngineOptions
) -> list[Float[Tensor, "batch pos d_model"]]:
    """Per attention block l: dF_l/dr (r the residual after block l, F the summed next-token
    loss over the evaluated positions) averaged over the path points `alphas` (every head's z
    scaled by 1 - alpha), as many sequences at a time as the batch's memory budget holds at
    `compute.memory.screen_bytes_per_sequence`. Float32."""
    budget = batch_budget_bytes(lm.n_params, lm.dtype_bytes, lm.device, opts.memory_budget_mb)
    per_sequence = screen_bytes_per_sequence(ModelDims.of(lm), tokens.shape[1], lm.dtype_bytes)
    part = max(1, budget // per_sequence)  # as heads_atp's graph_sequences, with the gradients
    done = [
        _gradients_part(
            lm, tokens[first : first + part], embedded[first : first + part], alphas, opts
        )
        for first in range(0, tokens.shape[0], part)
    ]
    return [torch.cat(per_layer, 0) for per_layer in zip(*done, strict=True)]


def _gradients_part(
    lm: LoadedModel, tokens: Tensor, embedded: Tensor, alphas: list[float], opts: EngineOptions
) -> list[Tensor]:
    rows = max(1, opts.logits_budget_mb * 2**20 // (3 * 4 * lm.d_vocab))
    attention = lm.attention_layers
    b = tokens.shape[0]
    sums: list[Tensor] = []
    for alpha in alphas:
        with torch.inference_mode(False), torch.enable_grad():
            resid = embedded.clone().requires_grad_()  # a normal tensor: the graph's input
            points = []
            for layer in range(lm.n_layers):
                mask = None
                if alpha and layer in attention:
                    heads = lm.layers[layer].heads
                    assert heads is not None
                    mask = torch.full((b, heads.n_heads), 1.0 - alpha, device=resid.device)
                resid = lm.run_block(layer, resid, head_mask=mask).resid
                if layer in attention:
                    points.append(resid)
            final = resid[:, 1:-1].reshape(-1, lm.d_model)
            # a normal tensor: cross-entropy saves its targets for the backward
            targets = tokens[:, 2:].reshape(-1).clone()
            grad_final = loss_gradient(lm, final, targets, rows)
            grads = torch.autograd.grad(final, points, grad_outputs=grad_final)
        if not sums:
            sums = [g.detach().float() for g in grads]
        else:
            for total, g in zip(sums, grads, strict=True):
                total += g.detach().float()
    return [total / len(alphas) for total in sums]


def screen_loss_delta(ctx: BatchContext, opts: EngineOptions) -> list[Float[Tensor, "head batch"]]:
    """Per attention block, head and sequence of the batch: the screen's estimate of the mean
    loss delta (nats) when the head's z is zeroed (module docstring, steps 1-2)."""
    if not ctx.lm.attention_layers:
        return []  # no heads (a state-space model): nothing to screen
    alphas = path_points(opts.screen_steps)
    grads = residual_gradients(ctx.lm, ctx.tokens, ctx.resid[0], alphas, opts)
    return estimates_from_gradients(ctx, grads, opts)


def estimates_from_gradients(
    ctx: BatchContext, grads: list[Tensor], opts: EngineOptions
) -> list[Float[Tensor, "head batch"]]:
    """(r_h - r) . grad per attention block, head and sequence, over the evaluated positions'
    count: r_h the exact residual after the block with head h's z zeroed."""
    lm = ctx.lm
    b, t = ctx.tokens.shape
    out = []
    for layer, grad in zip(lm.attention_layers, grads, strict=True):
        heads = lm.layers[layer].heads
        assert heads is not None
        chunk = head_group_size(lm, b, t, opts, heads.n_heads)
        per_group = []
        for first in range(0, heads.n_heads, chunk):
            group = list(range(first, min(heads.n_heads, first + chunk)))
            after = ablated_block_output(ctx, layer, group).unflatten(0, (len(group), b))
            delta = after.float() - ctx.resid[layer + 1].float()[None]
            per_group.append((delta * grad[None]).sum(dim=(2, 3)) / (t - 2))  # [g, b]
        out.append(torch.cat(per_group, 0))
    return out


def top_heads(acc: MeanAccumulator, k: int) -> list[tuple[int, int]]:
    """The k (layer, head) of largest mean screen estimate (ties: the lower layer, head)."""
    scored = [
        (-stat.value, int(str(key[1])), int(str(key[2])))
        for key, stat in acc.results().items()
        if key[0] == "loss_delta"
    ]
    return [(layer, head) for _, layer, head in sorted(scored)[:k]]


class HeadsScreenFamily(FamilyBase):
    name = "heads_screen"
    needs_z = True  # the exact block output subtracts one head's write from the cached one
    key_fields = ("metric", "layer", "head")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 1

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        return opts.screen_top_k if lm.attention_layers else 0

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        estimates = screen_loss_delta(ctx, opts)  # per attention block: [H, b]
        for layer, estimate in zip(ctx.lm.attention_layers, estimates, strict=True):
            acc.add_many([("loss_delta", layer, h) for h in range(estimate.shape[0])], estimate)
        if opts.screen_top_k and estimates:
            assert acc.batch is not None  # the engine's start_batch for this batch
            _SEEN.setdefault(acc, []).append((acc.batch[0], ctx.tokens))
        ctx.tick(1)

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        seen = _SEEN.pop(acc, [])
        chosen = top_heads(acc, opts.screen_top_k) if seen else []
        by_layer: dict[int, list[int]] = {}
        for layer, head in sorted(chosen):
            by_layer.setdefault(layer, []).append(head)
        for index, (first, tokens) in enumerate(seen):
            ctx = _clean_context(lm, tokens, opts)
            acc.start_batch(first, tokens.shape[0])
            for layer, heads in by_layer.items():
                chunk = head_group_size(lm, tokens.shape[0], tokens.shape[1], opts, len(heads))
                for start in range(0, len(heads), chunk):
                    group = heads[start : start + chunk]
                    kl, loss_delta = head_ablations(ctx, layer, group)
                    acc.add_many([("ablation_kl", layer, h) for h in group], kl)
                    acc.add_many([("ablation_loss_delta", layer, h) for h in group], loss_delta)
                if index == len(seen) - 1:
                    tick(len(heads))
            del ctx
        return super().finish(lm, acc, opts, tick)


def _clean_context(lm: LoadedModel, tokens: Tensor, opts: EngineOptions) -> BatchContext:
    """The batch's clean pass again (the screen kept its tokens, not its activations)."""
    from compute.engine import clean_pass  # the engine imports the families
    from compute.metrics.base import logit_chunks

    return clean_pass(lm, tokens, False, logit_chunks(lm, opts), lambda _: None, capture_z=True)
