"""pruning_drops.* — dropping n consecutive blocks at once, measured (docs/metrics.md).

The intervention both pruning papers evaluate: blocks l .. l+n−1 are skipped together (each
dropped block's output is its input), for every start l = 0..L−n and every width n in
`EngineOptions.drop_widths` (default `DROP_WIDTHS`) up to ⌊L/2⌋, compared with the clean
model by the intervention family's measures (`compute.metrics.interventions.METRICS`, the same
per-token values), named `pruning_drops.<metric>_<n>` with the row's `layer` the first
dropped block l. Each predictor's rank correlation with them: `compute.metrics.pruning_scores`.

Like the single drops, each restarts from the cached clean residual before block l and runs
blocks l+n .. L−1 on it: blocks 0..l−1 are never recomputed. A drop that reaches the last
block (l + n = L) leaves exactly the residual at point l, shared with the logit lens. Width 1 is
the intervention family's `drop`, computed once when both families run (`BatchContext.dropped`).
Cost: docs/performance.md and `compute.flops.pruning_drops_flops`.
"""

from __future__ import annotations

from collections.abc import Callable

from compute.metrics.base import (
    DEFAULT_DROP_WIDTHS,
    BatchContext,
    EngineOptions,
    FamilyBase,
    FamilyOutput,
    accumulated_records,
    accumulated_sequence_means,
)
from compute.metrics.interventions import METRICS, metric_values
from compute.metrics.pruning import predictor_keys, predictor_values
from compute.metrics.pruning_scores import score_records
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator, TokenStats

# Widths measured by default (`EngineOptions.drop_widths`): n = 1 (shared with `intervention`)
# to 4, each about as costly as one kind of the intervention family (docs/metrics.md gives the
# figures); capped at ⌊L/2⌋.
DROP_WIDTHS = DEFAULT_DROP_WIDTHS


def drop_widths(n_layers: int, widths: tuple[int, ...] = DROP_WIDTHS) -> tuple[int, ...]:
    """The widths measured on a model of `n_layers` blocks: `widths` up to ⌊L/2⌋ (1 at least)."""
    cap = max(1, n_layers // 2)
    return tuple(n for n in sorted(set(widths)) if n <= cap)


def drop_starts(n_layers: int, width: int) -> range:
    return range(n_layers - width + 1)


class PruningDropsFamily(FamilyBase):
    name = "pruning_drops"
    key_fields = ("metric", "layer")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return sum(len(drop_starts(lm.n_layers, n)) for n in drop_widths(lm.n_layers))

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        # Progress is counted in the default widths' drops (`units_per_batch` cannot see the
        # options): other widths tick one per drop up to that count, the rest at the end.
        budget = self.units_per_batch(ctx.lm)
        for width in drop_widths(ctx.n_layers, opts.drop_widths):
            for start in drop_starts(ctx.n_layers, width):
                _add(acc, width, start, dropped_blocks(ctx, start, width), ctx)
                if budget > 0:
                    ctx.tick(1)
                    budget -= 1
        ctx.tick(budget)
        # The predictors, to score against the drops in `finish` (shared with `pruning`):
        # internal keys, "_" + the pruning metric (block influence as width 1).
        keys, last_keys = predictor_keys(ctx.n_layers)
        every, last = predictor_values(ctx)
        acc.add_many([(_internal(m), s) for m, s in keys], every)
        acc.add_many([(_internal(m), s) for m, s in last_keys], last)

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        """The drops' records, and each predictor's rank correlation with them
        (`compute.metrics.pruning_scores`); the predictors themselves are the `pruning`
        family's to report."""

        def public(key: tuple[object, ...]) -> bool:
            return not str(key[0]).startswith("_")

        keys, means, _ = acc.sequence_means()
        widths = drop_widths(lm.n_layers, opts.drop_widths)
        scores = score_records(self.name, keys, means, widths, lm.n_layers)
        return FamilyOutput(
            accumulated_records(self.name, acc, self.key_fields, keep=public) + scores,
            sequence_means=accumulated_sequence_means(self.name, acc, self.key_fields, keep=public),
        )


def _internal(metric: str) -> str:
    """The internal key of a `pruning` metric: "_" + its name, block influence as width 1."""
    return "_block_influence_1" if metric == "block_influence" else f"_{metric}"


def dropped_blocks(ctx: BatchContext, start: int, width: int) -> TokenStats:
    """Q with blocks start .. start+width−1 skipped, against the clean P."""
    if width == 1:
        return ctx.dropped(start)
    stop = start + width
    if stop == ctx.n_layers:
        return ctx.point_stats(start)
    return ctx.compare(ctx.run_from(stop, ctx.resid[start]), f"drop of blocks {start}..{stop - 1}")


def _add(acc: MeanAccumulator, width: int, start: int, q: TokenStats, ctx: BatchContext) -> None:
    acc.add_many([(f"{m}_{width}", start) for m in METRICS], metric_values(q, ctx.ref))
