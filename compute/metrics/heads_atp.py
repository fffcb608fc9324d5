"""heads_atp.* — a screen of every head at once: attribution patching (AtP, Kramár et al. 2024).

`heads.ablation_loss_delta` zeroes one head's z and reruns everything after it: H x L downstream
passes, each with its unembedding. Its first-order Taylor estimate needs one forward pass with
gradients and one backward pass for every head together: with L(z) the batch's summed next-token
loss over the evaluated positions,

    loss(z_h = 0) - loss(z)  ~  (0 - z_h) . dL/dz_h  =  -sum over positions and d_head of z_h g_h

where g_h is the gradient at head h's z (the tensor the exact ablation zeroes, so the estimate is
of exactly that intervention, on any architecture: a norm after attention, grouped-query heads
and soft-caps are differentiated through). Sequences of a batch are independent, so each
sequence's estimate comes from its own tokens; divided by its T-2 evaluated positions it
estimates that sequence's mean loss delta, and sequences are the unit of `stderr` as everywhere.

Why loss and not KL: KL(P || Q) is zero with zero gradient at Q = P, so its first-order estimate
is 0 by construction; the loss has a nonzero first derivative. Where to trust it (measured in
docs/performance.md, "The head screen"): it ranks heads whose ablation is a small change well;
it is blind to what is second order — saturated softmaxes downstream, and a head whose removal
matters only through attention patterns it changes — which is where AtP is known to miss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from compute.errors import ComputeError
from compute.memory import ModelDims, batch_budget_bytes, graph_bytes_per_sequence
from compute.metrics.base import BatchContext, EngineOptions, FamilyBase
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator


def loss_gradient(
    lm: LoadedModel,
    final: Float[Tensor, "n d_model"],
    targets: Tensor,
    rows: int,
) -> Float[Tensor, "n d_model"]:
    """d(sum of next-token losses)/d(final residual), `rows` positions at a time: the final
    norm, the unembedding and any soft-cap are differentiated by autograd, and only one row
    block of [rows, vocab] logits (with its softmax's gradient) exists at once."""
    grad = torch.empty_like(final)
    for start in range(0, final.shape[0], rows):
        block = slice(start, start + rows)
        x = final[block].detach().requires_grad_()
        logits = lm.logit_columns(lm.normed(x), 0, lm.d_vocab).float()
        loss = F.cross_entropy(logits, targets[block], reduction="sum")
        (grad[block],) = torch.autograd.grad(loss, x)
    return grad


def graph_sequences(
    lm: LoadedModel, seq_len: int, opts: EngineOptions, per_sequence: int | None = None
) -> int:
    """Sequences differentiated through at once: as many as the batch's memory budget
    (`compute.memory.batch_budget_bytes`) holds at `per_sequence` bytes each (by default
    `graph_bytes_per_sequence`; `heads_screen` gives its own, with the gradients it keeps).
    The batch's own size is chosen without the graph (every other family would pay for it);
    the screen takes the batch in parts instead, which gives the same numbers: sequences are
    independent."""
    budget = batch_budget_bytes(lm.n_params, lm.dtype_bytes, lm.device, opts.memory_budget_mb)
    if per_sequence is None:
        per_sequence = graph_bytes_per_sequence(ModelDims.of(lm), seq_len, lm.dtype_bytes)
    return max(1, budget // per_sequence)


def atp_loss_delta(ctx: BatchContext, opts: EngineOptions) -> list[Float[Tensor, "head batch"]]:
    """Per attention block (`LoadedModel.attention_layers`), head and sequence of the batch: the
    AtP estimate of the mean loss delta (nats) when the head's z is zeroed. One forward with
    gradients from the cached embeddings and one backward to every attention block's z,
    `graph_sequences` sequences at a time."""
    if not ctx.lm.attention_layers:
        return []  # no heads (a state-space model): nothing to screen
    part = graph_sequences(ctx.lm, ctx.tokens.shape[1], opts)
    parts = [slice(first, first + part) for first in range(0, ctx.tokens.shape[0], part)]
    done = [_atp_part(ctx.lm, ctx.tokens[p], ctx.resid[0][p], opts) for p in parts]
    return [torch.cat(per_layer, -1) for per_layer in zip(*done, strict=True)]


def _atp_part(
    lm: LoadedModel, tokens: Tensor, embedded: Tensor, opts: EngineOptions
) -> list[Float[Tensor, "head batch"]]:
    t = tokens.shape[1]
    rows = max(1, opts.logits_budget_mb * 2**20 // (3 * 4 * lm.d_vocab))
    attention = set(lm.attention_layers)
    with torch.inference_mode(False), torch.enable_grad():
        resid = embedded.clone().requires_grad_()  # a normal tensor: the graph's input
        zs = []
        for layer in range(lm.n_layers):
            run = lm.run_block(layer, resid, capture_z=layer in attention)
            if layer in attention:
                if run.z is None:
                    raise ComputeError(
                        f"block {layer} did not return its z: no gradient to attribute"
                    )
                zs.append(run.z)
            resid = run.resid
        final = resid[:, 1:-1].reshape(-1, lm.d_model)
        # a normal tensor: on an accelerator the batch's tokens were moved there in inference
        # mode, and cross-entropy saves its targets for the backward
        targets = tokens[:, 2:].reshape(-1).clone()
        grad_final = loss_gradient(lm, final, targets, rows)
        grads = torch.autograd.grad(final, zs, grad_outputs=grad_final)
    # [b, pos, head, d_head] -> per sequence and head: -z . g summed over positions and d_head
    return [
        -(z.detach().float() * g.float()).sum(dim=(1, 3)).T / (t - 2)
        for z, g in zip(zs, grads, strict=True)
    ]  # per attention block: [head, batch]


class HeadsAtpFamily(FamilyBase):
    name = "heads_atp"
    key_fields = ("metric", "layer", "head")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        estimates = atp_loss_delta(ctx, opts)  # per attention block: [H, b]
        for layer, estimate in zip(ctx.lm.attention_layers, estimates, strict=True):
            acc.add_many([("loss_delta", layer, h) for h in range(estimate.shape[0])], estimate)
        ctx.tick(1)
