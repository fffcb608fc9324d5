"""similarity.* — cosines of component outputs under adjacent swaps (METRICS.md).

For the swap of blocks (l, l+1), block l+1 runs first, on the clean residual before block l; its
attention and MLP writes there are compared with the clean writes of blocks l+1 (`self`) and l
(`index`). `adjacent` compares the clean writes of blocks l and l+1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from compute.metrics.base import BatchContext, EngineOptions, FamilyOutput, cosine_per_token
from compute.models import LoadedModel
from compute.records import Record
from compute.reduce import MeanAccumulator


class SimilarityFamily:
    name = "similarity"
    needs_patterns = False

    def units_per_batch(self, lm: LoadedModel) -> int:
        return max(lm.n_layers - 1, 0)

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        return 0

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        for layer in range(ctx.n_layers - 1):
            moved = ctx.lm.run_block(layer + 1, ctx.resid[layer])
            pairs = [("attn", moved.attn_out, ctx.attn_out)]
            if moved.mlp_out is not None:
                pairs.append(("mlp", moved.mlp_out, ctx.mlp_out))  # type: ignore[arg-type]
            for component, swapped, clean in pairs:
                values = torch.stack([
                    cosine_per_token(ctx.at_eval(swapped), ctx.at_eval(clean[layer + 1])),
                    cosine_per_token(ctx.at_eval(swapped), ctx.at_eval(clean[layer])),
                    cosine_per_token(ctx.at_eval(clean[layer]), ctx.at_eval(clean[layer + 1])),
                ])
                acc.add_many([(m, component, layer) for m in ("self", "index", "adjacent")],
                             values)
            ctx.tick(1)

    def finish(self, lm: LoadedModel, acc: MeanAccumulator, opts: EngineOptions,
               tick: Callable[[int], None]) -> FamilyOutput:
        records = []
        for key, stat in acc.results().items():
            metric, component, layer = key
            records.append(Record.of(f"similarity.{metric}", stat.value, stat.n, layer=layer,
                                     component=component, stderr=stat.stderr))
        return FamilyOutput(records)
