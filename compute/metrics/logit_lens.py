"""logit_lens.* — each residual point i = 0..L through the final norm and the unembedding.

The final norm is recomputed on the residual at point i (never the cached final-layer scale), so
point L reproduces the model's own output and `kl_to_final` is exactly 0 there.
"""

from __future__ import annotations

import torch

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator

METRICS = ("kl_to_final", "entropy", "top1_agreement", "loss")


class LogitLensFamily(FamilyBase):
    name = "logit_lens"

    def units_per_batch(self, lm: LoadedModel) -> int:
        return lm.n_layers + 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        for point in range(ctx.n_layers + 1):
            q = ctx.point_stats(point)  # point L: the clean reference itself
            values = torch.stack([q.kl[0], q.entropy_bits[0], q.agree[0], q.loss[0]])
            acc.add_many([(m, point) for m in METRICS], values)
            ctx.tick(1)
