"""pruning.* — the layer-pruning literature's predictors, from the clean pass (docs/metrics.md).

- `block_influence` (ShortGPT, Men et al. 2024, arXiv 2403.03853 §3.1), per block l:
  1 − cos(x_l, x_{l+1}), x_l the residual entering block l, averaged over evaluated positions;
- `angular_distance_<n>` (Gromov et al. 2024, arXiv 2403.17887), per start l and width
  n = 1..⌊L/2⌋: arccos(cos(x_l, x_{l+n})) / π averaged over evaluated positions, and
  `angular_distance_last_<n>` the same on the sequence's last position only (their definition).

Everything comes from the residuals the clean pass already holds: per token, one Gram matrix of
the L+1 unit residual vectors (float64, so that an identity block reads 0 and not the float32
arccos noise of ~1e-4 near cos = 1). The residual is the processed model's (docs/metrics.md says
when that is the raw one and what it is otherwise). The measured drops these scores predict are
the `pruning_drops` family (`compute.metrics.pruning_drops`).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from compute.metrics.base import BatchContext, EngineOptions, FamilyBase
from compute.models import LoadedModel
from compute.reduce import MeanAccumulator

# Bytes of float64 residual vectors one Gram step holds: a batch is cut into runs of whole
# sequences of about this size, so that a wide GPU batch of a deep model does not need
# [tokens, L+1, d_model] float64 at once.
GRAM_BYTES = 256 * 2**20


def angular_widths(n_layers: int) -> range:
    """The widths n of d(l, n): 1 .. ⌊L/2⌋ (Gromov et al. prune at most half the model), at
    least 1."""
    return range(1, max(1, n_layers // 2) + 1)


def pair_cosines(
    resid: list[Float[Tensor, "batch pos d_model"]],
    positions: slice,
    pairs: tuple[Tensor, Tensor],
) -> Float[Tensor, "tokens pairs"]:
    """Cosines of the residual point pairs (a_k, b_k) at the given positions, float64, as
    [batch * positions, pairs] (batch-major).

    One float64 Gram matrix of the raw points per token, each entry then divided by the two
    norms on its diagonal: an identity block (the same vector twice) reads 1 to float64
    rounding, not to float32's (whose arccos would read ~1e-4 instead of ~1e-8). A zero
    vector has cosine 0 with everything (it has no direction)."""
    x = torch.stack([r[:, positions] for r in resid], dim=-2).double()
    gram = (x @ x.transpose(-1, -2)).flatten(0, 1).flatten(1)  # [tokens, P * P]
    a, b = pairs
    p = len(resid)
    dot, na, nb = gram[:, a * p + b], gram[:, a * p + a], gram[:, b * p + b]
    den = (na * nb).sqrt()
    cos = torch.where(den > 0, dot / torch.where(den > 0, den, 1.0), 0.0)
    return cos.clamp(-1.0, 1.0)


def predictor_keys(n_layers: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Accumulator keys (metric, layer) of the per-token predictors (block influence, the
    all-token angular distances) and of the last-token angular distances, in the row order of
    `predictor_values`."""
    tokens = [("block_influence", layer) for layer in range(n_layers)]
    last = []
    for n in angular_widths(n_layers):
        for start in range(n_layers - n + 1):
            tokens.append((f"angular_distance_{n}", start))
            last.append((f"angular_distance_last_{n}", start))
    return tokens, last


def _pairs(n_layers: int, *, influence: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """The point pairs (a, b) of `predictor_keys`' rows: (l, l+1) for block influence (if
    asked), then (l, l+n) for every width and start."""
    pairs = [(layer, layer + 1) for layer in range(n_layers)] if influence else []
    for n in angular_widths(n_layers):
        pairs += [(start, start + n) for start in range(n_layers - n + 1)]
    a, b = zip(*pairs, strict=True)
    return torch.tensor(a, device=device), torch.tensor(b, device=device)


def predictor_values(ctx: BatchContext) -> tuple[Tensor, Tensor]:
    """Per-token values of `predictor_keys`: [keys, batch*(T-2)] at the evaluated positions and
    [keys, batch] at the last position, batch-major. Computed once per batch (the measured-drop
    family scores them too), a run of whole sequences at a time (`GRAM_BYTES`)."""
    return ctx.shared(("pruning_predictors",), lambda: _predictor_values(ctx))


def _predictor_values(ctx: BatchContext) -> tuple[Tensor, Tensor]:
    resid, n_layers = ctx.resid, ctx.n_layers
    b, t, d = resid[0].shape
    step = max(1, GRAM_BYTES // (t * len(resid) * d * 8))
    device = resid[0].device
    every_pairs = _pairs(n_layers, influence=True, device=device)
    last_pairs = _pairs(n_layers, influence=False, device=device)
    every, last = [], []
    for first in range(0, b, step):
        part = [r[first : first + step] for r in resid]
        cos = pair_cosines(part, slice(1, -1), every_pairs)
        rows = torch.cat([1.0 - cos[:, :n_layers], _angle(cos[:, n_layers:])], dim=1)
        every.append(rows.T.float())
        last.append(_angle(pair_cosines(part, slice(-1, None), last_pairs)).T.float())
    return torch.cat(every, dim=1), torch.cat(last, dim=1)


def _angle(cos: Tensor) -> Tensor:
    """arccos(cos) / π (cosines already clamped to [−1, 1])."""
    return torch.arccos(cos) / math.pi


class PruningFamily(FamilyBase):
    name = "pruning"
    key_fields = ("metric", "layer")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 1

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        keys, last_keys = predictor_keys(ctx.n_layers)
        every, last = predictor_values(ctx)
        acc.add_many(keys, every)
        acc.add_many(last_keys, last)
        ctx.tick(1)
