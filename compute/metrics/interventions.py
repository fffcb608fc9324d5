"""intervention.* — drop, swap, drop_attn, drop_mlp and the `none` baseline (METRICS.md).

Every intervention at layer l restarts from the cached clean residual before block l: layers
0..l-1 are never recomputed, the baseline is the shared clean pass, and a swap reorders execution
of the existing blocks (no weights are moved or reloaded).
"""

from __future__ import annotations

import torch

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator, TokenStats

KINDS = ("drop", "swap", "drop_attn", "drop_mlp")
METRICS = ("kl", "top1_agreement", "entropy", "entropy_delta", "loss", "loss_delta", "accuracy")


def _kinds(lm: LoadedModel) -> tuple[str, ...]:
    return KINDS if lm.has_mlp else ("drop", "swap", "drop_attn")


def _add(acc: MeanAccumulator, kind: str, layer: int | None, q: TokenStats,
         ctx: BatchContext) -> None:
    ref = ctx.ref
    values = torch.stack([q.kl[0], q.agree[0], q.entropy_bits[0],
                          q.entropy_bits[0] - ref.entropy_bits, q.loss[0], q.loss[0] - ref.loss,
                          q.correct[0]])
    acc.add_many([(m, kind, layer) for m in METRICS], values)


class InterventionFamily(FamilyBase):
    name = "intervention"
    key_fields = ("metric", "component", "layer")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 1 + len(_kinds(lm)) * lm.n_layers - 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        lm, n_layers = ctx.lm, ctx.n_layers
        _add(acc, "none", None, ctx.compare(ctx.resid[n_layers], "unmodified model"), ctx)
        ctx.tick(1)
        for layer in range(n_layers):
            pre = ctx.resid[layer]
            runs = {"drop": lambda pre=pre, layer=layer: ctx.run_from(layer + 1, pre)}
            runs["drop_attn"] = lambda pre=pre, layer=layer: ctx.run_from(
                layer + 1, lm.run_block(layer, pre, zero_attn=True).resid)
            if lm.has_mlp:
                runs["drop_mlp"] = lambda pre=pre, layer=layer: ctx.run_from(
                    layer + 1, lm.run_block(layer, pre, zero_mlp=True).resid)
            if layer < n_layers - 1:
                runs["swap"] = lambda pre=pre, layer=layer: ctx.run_from(
                    layer + 2, lm.run_block(layer, lm.run_block(layer + 1, pre).resid).resid)
            for kind, run in runs.items():
                _add(acc, kind, layer, ctx.compare(run(), f"{kind} at layer {layer}"), ctx)
                ctx.tick(1)
