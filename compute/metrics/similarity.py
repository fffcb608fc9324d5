"""similarity.* — cosines of component outputs under adjacent swaps (docs/metrics.md).

For the swap of blocks (l, l+1), block l+1 runs first, on the clean residual before block l; its
attention and MLP writes there are compared with the clean writes of blocks l+1 (`self`) and l
(`index`). `adjacent` compares the clean writes of blocks l and l+1.
"""

from __future__ import annotations

import torch

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, cosine_per_token
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator


class SimilarityFamily(FamilyBase):
    name = "similarity"
    key_fields = ("metric", "component", "layer")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return max(lm.n_layers - 1, 0)

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        for layer in range(ctx.n_layers - 1):
            moved = ctx.moved(layer)  # shared with the swap intervention
            pairs = [("attn", moved.attn_out, ctx.attn_out), ("mlp", moved.mlp_out, ctx.mlp_out)]
            for component, swapped, clean in pairs:
                here, there = clean[layer], clean[layer + 1]
                if swapped is None or here is None or there is None:
                    continue  # one of the two blocks lacks the component (a hybrid's)
                values = torch.stack(
                    [
                        cosine_per_token(ctx.at_eval(swapped), ctx.at_eval(there)),
                        cosine_per_token(ctx.at_eval(swapped), ctx.at_eval(here)),
                        cosine_per_token(ctx.at_eval(here), ctx.at_eval(there)),
                    ]
                )
                acc.add_many([(m, component, layer) for m in ("self", "index", "adjacent")], values)
            ctx.tick(1)
