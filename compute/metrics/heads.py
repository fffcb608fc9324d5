"""heads.* — per-head ablation (`ablation_kl`, `ablation_loss_delta`) and `induction`.

Ablation zeroes one head's z at layer l: the cached attention write minus that head's term
(z_h W_O[h]) gives the ablated write without recomputing attention, and blocks l+1.. restart
from it. All heads of a layer run as one batch: the batch is repeated n_heads times and variant h
has head h removed, so a layer's heads cost one wide pass instead of n_heads narrow ones.

Induction runs the model on seeded random sequences BOS, r_1..r_n, r_1..r_n and scores each head
by its mean attention from position n+i (the second r_i) to position i+1, over i = 1..n-1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from compute.memory import ModelDims, variant_bytes_per_sequence
from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator
from compute.tokens import random_repeated_tokens


def induction_scores(lm: LoadedModel, opts: EngineOptions) -> torch.Tensor:
    """Per (layer, head, item) induction attention: [L, H, sequences * (n-1)]."""
    n = min(opts.induction_n, (lm.n_ctx - 1) // 2)
    tokens = random_repeated_tokens(
        opts.induction_sequences, n, lm.d_vocab_real, lm.bos_token_id, opts.induction_seed
    ).to(lm.device)
    i = torch.arange(1, n, device=lm.device)
    scores = []
    with torch.inference_mode():
        resid = lm.embed(tokens)
        for layer in range(lm.n_layers):
            run = lm.run_block(layer, resid, capture_pattern=True)
            resid = run.resid
            assert run.pattern is not None
            # pattern[b, h, n+i, i+1] for i = 1..n-1
            picked = run.pattern[:, :, n + i, i + 1].float()  # [b, h, n-1]
            scores.append(picked.transpose(0, 1).reshape(lm.n_heads, -1))
    return torch.stack(scores)


def _ablated_block_output(ctx: BatchContext, layer: int, group: list[int]) -> torch.Tensor:
    """Residual after block `layer` with each head of `group` zeroed in turn: [g*batch, pos, d].

    The attention write is b_O + sum_h z_h W_O[h], so zeroing head h's z subtracts exactly its
    term from the cached write: no attention is recomputed, only the MLP of the layer (which
    reads the changed residual; parallel and attention-only blocks need not even that).
    Architectures whose write is not linear in z rerun the block with the head masked.
    """
    lm, b = ctx.lm, ctx.tokens.shape[0]
    if ctx.z is None or not lm.attn_write_is_linear_in_z:
        mask = torch.ones(len(group), lm.n_heads, device=ctx.tokens.device)
        mask[torch.arange(len(group)), group] = 0.0
        mask = mask.repeat_interleave(b, dim=0)  # variant-major, like the residual
        pre = ctx.resid[layer].repeat(len(group), 1, 1)
        return lm.run_block(layer, pre, head_mask=mask).resid
    delta = lm.head_writes(layer, ctx.z[layer], group)  # [g, b, pos, d]
    if lm.has_mlp and not lm.parallel:
        mid = ((ctx.resid[layer] + ctx.attn_out[layer])[None] - delta).flatten(0, 1)
        return mid + lm.run_mlp(layer, mid)
    return (ctx.resid[layer + 1][None] - delta).flatten(0, 1)


# Head variants run together on a CPU: about this many tokens (variants x batch tokens) per
# wide pass. Matmuls are as fast at 2048 rows as at 10,240, while the wider passes' temporaries
# (each block's QKV, MLP hidden and activation, [rows, d_mlp] float32) raised GPT-2 small's peak
# RSS from 2.65x to 4.0x its weights (docs/performance.md).
CPU_HEAD_GROUP_TOKENS = 2048


def head_group_size(lm: LoadedModel, batch: int, seq_len: int, opts: EngineOptions) -> int:
    """How many head variants of a layer run as one wide pass.

    CPU: about `CPU_HEAD_GROUP_TOKENS` tokens per pass (at least one variant). Accelerator: as
    many variants as `logits_budget_mb` holds at the working set of one intervention
    (`compute.memory.variant_bytes_per_sequence`)."""
    if lm.device == "cpu":
        return max(1, min(lm.n_heads, CPU_HEAD_GROUP_TOKENS // (batch * seq_len)))
    per_variant = batch * variant_bytes_per_sequence(ModelDims.of(lm), seq_len, lm.dtype_bytes)
    return max(1, min(lm.n_heads, opts.logits_budget_mb * 2**20 // max(per_variant, 1)))


class HeadsFamily(FamilyBase):
    name = "heads"
    needs_z = True
    key_fields = ("metric", "layer", "head")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return lm.n_layers

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        return 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        lm = ctx.lm
        heads = lm.n_heads
        chunk = head_group_size(lm, ctx.tokens.shape[0], ctx.tokens.shape[1], opts)
        for layer in range(ctx.n_layers):
            for first in range(0, heads, chunk):
                group = list(range(first, min(heads, first + chunk)))
                after = _ablated_block_output(ctx, layer, group)
                final = ctx.run_from(layer + 1, after)
                q = ctx.compare(final, f"head ablation at layer {layer}")
                acc.add_many([("ablation_kl", layer, h) for h in group], q.kl)
                acc.add_many(
                    [("ablation_loss_delta", layer, h) for h in group],
                    q.loss - ctx.ref.loss[None, :],
                )
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
        for layer in range(lm.n_layers):
            acc.add_many([("induction", layer, h) for h in range(lm.n_heads)], scores[layer])
        tick(1)
        return super().finish(lm, acc, opts, tick)
