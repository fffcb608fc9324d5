"""intervention.* — drop, swap, drop_attn, drop_mlp and the `none` baseline (docs/metrics.md).

Every intervention at layer l restarts from the cached clean residual before block l: layers
0..l-1 are never recomputed, the `none` row is the clean pass's own reference (no unembedding),
`drop_mlp` reuses the cached attention write and `drop_attn` reruns only the MLP of l, and a swap
reorders execution of the existing blocks (no weights are moved or reloaded). FLOP counts per
kind: docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator, Reference, TokenStats

KINDS = ("drop", "swap", "drop_attn", "drop_mlp")
METRICS = ("kl", "top1_agreement", "entropy", "entropy_delta", "loss", "loss_delta", "accuracy")
# Paired differences, swap of (l, l+1) minus drop of l at the same tokens, l = 0..L-2:
# (metric name, the per-token metric they difference). Component `swap-drop`.
PAIRED = (("swap_minus_drop_kl", "kl"), ("swap_minus_drop_top1", "top1_agreement"))
PAIRED_COMPONENT = "swap-drop"


def _kinds(lm: LoadedModel, layer: int) -> tuple[str, ...]:
    """The kinds measured at block `layer`: drop everywhere, swap but at the last block,
    drop_attn where the block has a token mixer (attention or not), drop_mlp where it has an
    MLP."""
    kind = lm.layers[layer]
    return tuple(
        k
        for k, present in (
            ("drop", True),
            ("swap", layer < lm.n_layers - 1),
            ("drop_attn", kind.mixer is not None),
            ("drop_mlp", kind.mlp is not None),
        )
        if present
    )


def metric_values(q: TokenStats, ref: Reference) -> Tensor:
    """[len(METRICS), tokens]: the per-token values of `METRICS` for one intervened model Q
    against the clean reference (also `pruning_drops`' measures)."""
    return torch.stack(
        [
            q.kl[0],
            q.agree[0],
            q.entropy_bits[0],
            q.entropy_bits[0] - ref.entropy_bits,
            q.loss[0],
            q.loss[0] - ref.loss,
            q.correct[0],
        ]
    )


def _add(
    acc: MeanAccumulator, kind: str, layer: int | None, q: TokenStats, ctx: BatchContext
) -> None:
    acc.add_many([(m, kind, layer) for m in METRICS], metric_values(q, ctx.ref))


class InterventionFamily(FamilyBase):
    name = "intervention"
    key_fields = ("metric", "component", "layer")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 1 + sum(len(_kinds(lm, layer)) for layer in range(lm.n_layers))

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        n_layers = ctx.n_layers
        _add(acc, "none", None, ctx.point_stats(n_layers), ctx)
        ctx.tick(1)
        for layer in range(n_layers):
            for kind, stats in _layer_runs(ctx, layer):
                _add(acc, kind, layer, stats(), ctx)
                ctx.tick(1)

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        """Adds the paired swap-minus-drop means. Per sequence, the mean over its tokens of
        (swap value - drop value) is the difference of the two per-sequence means (the same
        tokens), so they come from the accumulated per-sequence sums at no cost in the sweep;
        their stderr is that of the per-sequence differences (paired)."""
        for layer in range(lm.n_layers - 1):
            for name, metric in PAIRED:
                acc.derive(
                    (name, PAIRED_COMPONENT, layer),
                    [(1.0, (metric, "swap", layer)), (-1.0, (metric, "drop", layer))],
                )
        return super().finish(lm, acc, opts, tick)


def _layer_runs(ctx: BatchContext, layer: int) -> list[tuple[str, Callable[[], TokenStats]]]:
    """Each kind at `layer`, computing only what the clean cache does not already hold.

    - drop: blocks l+1.. on the cached residual before l (at the last block that residual is
      logit-lens point L-1, shared with the lens);
    - drop_mlp: the cached residual plus the cached attention write of l (no attention rerun);
    - drop_attn: the cached residual plus the MLP of l rerun on it (parallel models: plus the
      cached MLP write, which reads the same residual; blocks without an MLP: same as drop);
    - swap: block l+1 then block l on the cached residual (the first half is shared with the
      similarity family).

    The "attention" of drop_attn is the block's token mixer, attention or not; a block without
    one has no drop_attn, a block without an MLP no drop_mlp (an MLP-only block's drop_mlp is
    its drop). A block whose output is not its input plus its writes (`BlockKind.additive`:
    a norm after the residual sum, GPT-1's) is rerun with the write zeroed instead.
    """
    lm = ctx.lm
    pre = ctx.resid[layer]
    kind = lm.layers[layer]

    def finish(after_block: Tensor, what: str) -> Callable[[], TokenStats]:
        return lambda: ctx.compare(ctx.run_from(layer + 1, after_block), f"{what} at {layer}")

    dropped: list[TokenStats] = []

    def drop() -> TokenStats:
        if not dropped:  # attention-only models: drop_attn is the same run
            dropped.append(ctx.dropped(layer))  # shared with pruning_drops (width 1)
        return dropped[0]

    def drop_attn() -> TokenStats:
        if kind.mlp is None:
            return drop()
        if not kind.additive:
            return finish(lm.run_block(layer, pre, zero_attn=True).resid, "drop_attn")()
        cached = ctx.mlp_out[layer]
        mlp = cached if lm.parallel and cached is not None else lm.run_mlp(layer, pre)
        return finish(pre + mlp, "drop_attn")()

    def drop_mlp() -> TokenStats:
        attn = ctx.attn_out[layer]
        if attn is None:
            return drop()
        if not kind.additive:
            return finish(lm.run_block(layer, pre, zero_mlp=True).resid, "drop_mlp")()
        return finish(pre + attn, "drop_mlp")()

    def swap() -> TokenStats:
        first = ctx.moved(layer).resid
        both = lm.run_block(layer, first).resid
        return ctx.compare(ctx.run_from(layer + 2, both), f"swap at layer {layer}")

    runs: dict[str, Callable[[], TokenStats]] = {
        "drop": drop,
        "drop_attn": drop_attn,
        "drop_mlp": drop_mlp,
        "swap": swap,
    }
    order = ("drop", "drop_attn", "drop_mlp", "swap")
    present = set(_kinds(lm, layer))
    return [(k, runs[k]) for k in order if k in present]
