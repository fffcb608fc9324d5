"""attention.* — locality (`prev_<k>`), sink (`bos`) and row entropy, per layer and per head.

Query positions are the evaluated positions 1..T-2. For `prev_<k>` only queries q > k count (so
that all k previous keys exist); the value at a query is the total weight on keys q-1..q-k.
Per-layer rows average over heads at each query first. Like every mean, a row's value is the mean
of per-sequence means and n counts sequences; every sequence has the same queries q > k, so this
is also the mean over all its queries.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.models import LoadedModel
from compute.reduce import LN2, MeanAccumulator


def previous_token_mass(
    pattern: Float[Tensor, "batch head q k"], k_max: int
) -> Float[Tensor, "batch head q k_max"]:
    """out[..., q, j-1] = total attention of query q on keys q-1..q-j (0 where q < j)."""
    b, h, t, _ = pattern.shape
    diagonals = torch.zeros(b, h, t, k_max, dtype=torch.float32, device=pattern.device)
    for j in range(1, min(k_max, t - 1) + 1):
        diagonals[:, :, j:, j - 1] = pattern.diagonal(offset=-j, dim1=-2, dim2=-1).float()
    return diagonals.cumsum(dim=-1)


def row_entropy_bits(pattern: Float[Tensor, "... k"]) -> Float[Tensor, ...]:
    p = pattern.float()
    return -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1) / LN2


def per_query_values(
    pattern: Float[Tensor, "batch head q k"], ks: list[int]
) -> dict[str, Float[Tensor, "batch head q"]]:
    """Each metric's value at every query: `bos`, `entropy` and `prev_<k>` for k in `ks`."""
    values: dict[str, Tensor] = {
        "bos": pattern[..., 0].float(),
        "entropy": row_entropy_bits(pattern),
    }
    if ks:
        mass = previous_token_mass(pattern, max(ks))
        for k in ks:
            values[f"prev_{k}"] = mass[..., k - 1]
    return values


def evaluated_queries(metric: str, seq_len: int) -> slice:
    """The queries a metric averages over: the evaluated positions 1..T-2, and q > k for
    `prev_<k>` (a contiguous range: a slice, not a boolean mask, which would wait for the
    device to count it)."""
    k = int(metric.split("_")[1]) if metric.startswith("prev_") else 0
    return slice(max(1, k + 1), seq_len - 1)


def chance_levels(
    seq_len: int, prev_ks: tuple[int, ...], window: int | None = None
) -> dict[str, float]:
    """What each attention metric reads for attention spread uniformly over the visible keys
    (0..q, or the last `window` of them for a sliding-window layer): the baseline a measured
    locality or sink is above or below. The metrics' own definitions applied to that pattern:
    prev_k = mean over queries of k / visible, bos = mean of 1 / visible (0 where the window
    has left position 0 behind), entropy = mean log2(visible). At T = 128 uniform causal
    attention has prev_5 = 0.123 and bos = 0.035.

    >>> round(chance_levels(128, (5,))["prev_5"], 3)
    0.123
    """
    t = seq_len
    visible = torch.ones(t, t, dtype=torch.bool).tril_()
    if window is not None:
        visible.triu_(1 - window)
    pattern = visible.double() / visible.sum(-1, keepdim=True)
    ks = [k for k in prev_ks if k <= t - 3]
    values = per_query_values(pattern[None, None], ks)
    levels = {m: float(v[0, 0, evaluated_queries(m, t)].mean()) for m, v in values.items()}
    return levels | {f"prev_{k}_mean": levels[f"prev_{k}"] / k for k in ks}


class AttentionFamily(FamilyBase):
    name = "attention"
    needs_patterns = True
    key_fields = ("metric", "layer", "head")

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        assert ctx.patterns is not None  # the engine captures patterns when a family needs them
        t = ctx.tokens.shape[1]
        # a query q > k among the evaluated 1..t-2 exists only for k <= t-3
        ks = [k for k in opts.prev_ks if k <= t - 3]
        for layer, pattern in enumerate(ctx.patterns):
            if pattern is None:  # not an attention block: no rows
                continue
            heads = pattern.shape[1]
            for metric, values in per_query_values(pattern, ks).items():  # [batch, head, q]
                v = values[..., evaluated_queries(metric, t)]  # [batch, head, q']
                per_head = v.transpose(0, 1).reshape(heads, -1)
                acc.add_many([(metric, layer, h) for h in range(heads)], per_head)
                acc.add((metric, layer, None), v.mean(dim=1).reshape(-1))

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        # prev_<k>_mean = prev_<k> / k (the per-entry mean, as some code reports), sequence by
        # sequence: its stderr is prev_<k>'s / k
        known = acc.keys()  # a copy: derive adds keys
        for key in known:
            if key[0].startswith("prev_"):
                k = int(key[0].removeprefix("prev_"))
                acc.derive((f"{key[0]}_mean", *key[1:]), [(1.0 / k, key)])
        return super().finish(lm, acc, opts, tick)
