"""norms.* — L2 norms of component writes and of the residual, per layer (docs/metrics.md).

Norms are of the processed model, so with centered writing weights the writes are centered over
d_model. `attn_mlp_ratio` is a ratio of means (mean ||attn_out|| / mean ||mlp_out||); it has no
standard error and is stored with stderr null; its n is the number of sequences, like every
mean's.
"""

from __future__ import annotations

from collections.abc import Callable

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.models import LoadedModel
from compute.records import Record
from compute.reduce import MeanAccumulator


class NormsFamily(FamilyBase):
    name = "norms"
    key_fields = ("metric", "component", "layer")

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        for layer in range(ctx.n_layers):
            mixer = ctx.attn_out[layer]  # the token mixer's write, attention or not
            if mixer is not None:
                acc.add(("attn_out", "attn", layer), ctx.at_eval(mixer).float().norm(dim=-1))
            mlp = ctx.mlp_out[layer]
            if mlp is not None:
                acc.add(("mlp_out", "mlp", layer), ctx.at_eval(mlp).float().norm(dim=-1))
            acc.add(("resid", None, layer), ctx.at_eval(ctx.resid[layer + 1]).float().norm(dim=-1))

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        out = super().finish(lm, acc, opts, tick)
        records = out.records
        for layer, kind in enumerate(lm.layers):
            if kind.mixer is not None and kind.mlp is not None:
                attn = acc.result(("attn_out", "attn", layer))
                mlp = acc.result(("mlp_out", "mlp", layer))
                if mlp.value > 0:
                    records.append(
                        Record.of(
                            "norms.attn_mlp_ratio", attn.value / mlp.value, attn.n, layer=layer
                        )
                    )
        return out
