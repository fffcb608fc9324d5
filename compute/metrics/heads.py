"""heads.* — per-head ablation (`ablation_kl`, `ablation_loss_delta`) and `induction`.

Ablation zeroes one head's z at layer l: the cached attention write minus that head's term
(z_h W_O[h]) gives the ablated write without recomputing attention, and blocks l+1.. restart
from it. All heads of a layer run as one batch: the batch is repeated n_heads times and variant h
has head h removed, so a layer's heads cost one wide pass instead of n_heads narrow ones.

Induction runs the model on seeded random sequences BOS, r_1..r_n, r_1..r_n and scores each head
by its mean attention from position n+i (the second r_i) to position i+1, over i = 1..n-1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from jaxtyping import Float
from torch import Tensor

from compute.memory import ModelDims, variant_bytes_per_sequence
from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator
from compute.tokens import random_repeated_tokens


def induction_scores(lm: LoadedModel, opts: EngineOptions) -> dict[int, torch.Tensor]:
    """Per attention block, (head, item) induction attention: [H, sequences * (n-1)]."""
    n = min(opts.induction_n, (lm.n_ctx - 1) // 2)
    tokens = random_repeated_tokens(
        opts.induction_sequences, n, lm.d_vocab_real, lm.bos_token_id, opts.induction_seed
    ).to(lm.device)
    i = torch.arange(1, n, device=lm.device)
    attention = set(lm.attention_layers)
    scores = {}
    with torch.inference_mode():
        resid = lm.embed(tokens)
        for layer in range(lm.n_layers):
            run = lm.run_block(layer, resid, capture_pattern=layer in attention)
            resid = run.resid
            if layer not in attention:
                continue
            assert run.pattern is not None
            # pattern[b, h, n+i, i+1] for i = 1..n-1
            picked = run.pattern[:, :, n + i, i + 1].float()  # [b, h, n-1]
            scores[layer] = picked.transpose(0, 1).reshape(picked.shape[1], -1)
    return scores


def ablated_block_output(ctx: BatchContext, layer: int, group: list[int]) -> torch.Tensor:
    """Residual after block `layer` with each head of `group` zeroed in turn: [g*batch, pos, d].

    The attention write is b_O + sum_h z_h W_O[h], so zeroing head h's z subtracts exactly its
    term from the cached write: no attention is recomputed, only the MLP of the layer (which
    reads the changed residual; parallel and attention-only blocks need not even that).
    Blocks whose write is not linear in z (`LoadedModel.head_writes_are_linear`) rerun the
    block with the head masked.
    """
    lm, b = ctx.lm, ctx.tokens.shape[0]
    z = ctx.z[layer] if ctx.z is not None else None
    attn = ctx.attn_out[layer]
    if z is None or attn is None or not lm.head_writes_are_linear(layer):
        heads = lm.layers[layer].heads
        assert heads is not None, f"block {layer} has no heads"
        mask = torch.ones(len(group), heads.n_heads, device=ctx.tokens.device)
        mask[torch.arange(len(group)), group] = 0.0
        mask = mask.repeat_interleave(b, dim=0)  # variant-major, like the residual
        pre = ctx.resid[layer].repeat(len(group), 1, 1)
        return lm.run_block(layer, pre, head_mask=mask).resid
    delta = lm.head_writes(layer, z, group)  # [g, b, pos, d]
    if lm.layers[layer].mlp is not None and not lm.parallel:
        mid = ((ctx.resid[layer] + attn)[None] - delta).flatten(0, 1)
        return mid + lm.run_mlp(layer, mid)
    return (ctx.resid[layer + 1][None] - delta).flatten(0, 1)


def head_ablations(
    ctx: BatchContext, layer: int, group: list[int]
) -> tuple[Float[Tensor, "group n"], Float[Tensor, "group n"]]:
    """The exact ablation of each head of `group` (block `layer`), per head and evaluated token
    of the batch (batch-major): (KL(P || Q) and loss(Q) - loss(P), both in nats). The one
    implementation of `heads.ablation_*`; the head screen's exact top k (`heads_screen`) calls
    it through `add_head_ablations`."""
    after = ablated_block_output(ctx, layer, group)
    final = ctx.run_from(layer + 1, after)
    q = ctx.compare(final, f"head ablation at layer {layer}")
    return q.kl, q.loss - ctx.ref.loss[None, :]


def head_groups(ctx: BatchContext, heads: list[int], opts: EngineOptions) -> Iterator[list[int]]:
    """`heads` of one block in the groups run together on the batch (`head_group_size`)."""
    chunk = head_group_size(ctx.lm, ctx.tokens.shape[0], ctx.tokens.shape[1], opts, len(heads))
    for start in range(0, len(heads), chunk):
        yield heads[start : start + chunk]


def add_head_ablations(
    ctx: BatchContext, acc: MeanAccumulator, layer: int, heads: list[int], opts: EngineOptions
) -> None:
    """`ablation_kl` and `ablation_loss_delta` of each of `heads` (block `layer`) on the batch,
    added to `acc` under (metric, layer, head): what `heads` records for every head and
    `heads_screen` for its top k."""
    for group in head_groups(ctx, heads, opts):
        kl, loss_delta = head_ablations(ctx, layer, group)
        acc.add_many([("ablation_kl", layer, h) for h in group], kl)
        acc.add_many([("ablation_loss_delta", layer, h) for h in group], loss_delta)


# Head variants run together on a CPU: about this many tokens (variants x batch tokens) per
# wide pass. Matmuls are as fast at 2048 rows as at 10,240, while the wider passes' temporaries
# (each block's QKV, MLP hidden and activation, [rows, d_mlp] float32) raised GPT-2 small's peak
# RSS from 2.65x to 4.0x its weights (docs/performance.md).
CPU_HEAD_GROUP_TOKENS = 2048


def head_group_size(
    lm: LoadedModel, batch: int, seq_len: int, opts: EngineOptions, n_heads: int | None = None
) -> int:
    """How many head variants of a layer (of `n_heads`, default the model's) run as one wide
    pass.

    CPU: about `CPU_HEAD_GROUP_TOKENS` tokens per pass (at least one variant). Accelerator: as
    many variants as `logits_budget_mb` holds at the working set of one intervention
    (`compute.memory.variant_bytes_per_sequence`)."""
    heads = n_heads or lm.n_heads
    if lm.device == "cpu":
        return max(1, min(heads, CPU_HEAD_GROUP_TOKENS // (batch * seq_len)))
    per_variant = batch * variant_bytes_per_sequence(ModelDims.of(lm), seq_len, lm.dtype_bytes)
    return max(1, min(heads, opts.logits_budget_mb * 2**20 // max(per_variant, 1)))


class HeadsFamily(FamilyBase):
    name = "heads"
    needs_z = True
    key_fields = ("metric", "layer", "head")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return len(lm.attention_layers)

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        return 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        lm = ctx.lm
        for layer in lm.attention_layers:  # the attention blocks only: no rows elsewhere
            head_kind = lm.layers[layer].heads
            assert head_kind is not None
            add_head_ablations(ctx, acc, layer, list(range(head_kind.n_heads)), opts)
            ctx.tick(1)

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        scores = induction_scores(lm, opts)  # batch-major over the induction sequences
        acc.start_batch(0, opts.induction_sequences)  # the unit: one induction sequence
        for layer, per_head in scores.items():
            acc.add_many([("induction", layer, h) for h in range(per_head.shape[0])], per_head)
        tick(1)
        return super().finish(lm, acc, opts, tick)
