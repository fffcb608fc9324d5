"""tuned_lens.* — the logit lens read through a trained affine translator per point.

Point i = 0..L-1 is read as Q_i = unembed(h_i + h_i A_i^T + b_i) (the model's final norm
recomputed on the translated residual, then W_U and b_U: `LoadedModel.logits`); point L, the
final residual, has no translator, so KL is exactly 0 there, as for the logit lens. The lens
(`compute.lens`) is trained on the training split of the run's token source, which never
overlaps the evaluated windows, or imported; `compute.run.compute_run` provides it
(`LoadedModel.using_lens`). With every translator zero this family is the logit lens.
"""

from __future__ import annotations

import torch

from compute.errors import ComputeError
from compute.metrics.base import BatchContext, EngineOptions, FamilyBase
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator

METRICS = ("kl_to_final", "entropy", "top1_agreement", "loss")


class TunedLensFamily(FamilyBase):
    name = "tuned_lens"

    def units_per_batch(self, lm: LoadedModel) -> int:
        return lm.n_layers + 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        lens = ctx.lm.tuned_lens
        if lens is None:
            raise ComputeError(
                "the tuned_lens family needs a lens: compute_run trains or loads one "
                "(LoadedModel.using_lens)"
            )
        for point in range(ctx.n_layers + 1):
            if point == ctx.n_layers:
                q = ctx.point_stats(point)  # the clean reference: no translator at point L
            else:
                translated = lens.translate(point, ctx.resid[point])
                q = ctx.compare(translated, f"tuned lens point {point}")
            values = torch.stack([q.kl[0], q.entropy_bits[0], q.agree[0], q.loss[0]])
            acc.add_many([(m, point) for m in METRICS], values)
            ctx.tick(1)
