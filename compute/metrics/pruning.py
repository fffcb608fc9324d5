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


def residual_cosines(
    resid: list[Float[Tensor, "batch pos d_model"]], positions: slice
) -> Float[Tensor, "batch npos points points"]:
    """Cosines between every pair of residual points 0..L at the given positions, float64.

    A zero vector has cosine 0 with everything (it has no direction)."""
    x = torch.stack([r[:, positions] for r in resid], dim=-2).double()
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return unit @ unit.transpose(-1, -2)


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


def _rows(cos: Float[Tensor, "m points points"], n_layers: int, *, influence: bool) -> Tensor:
    """[keys, m] float32 from per-token cosine matrices: block influence (if asked), then
    d(l, n) for every width and start, as `predictor_keys` orders them."""
    starts = torch.arange(n_layers, device=cos.device)
    rows = [1.0 - cos[:, starts, starts + 1].clamp(-1.0, 1.0).T] if influence else []
    for n in angular_widths(n_layers):
        s = starts[: n_layers - n + 1]
        rows.append(_angle(cos[:, s, s + n]).T)
    return torch.cat(rows).float()


def predictor_values(ctx: BatchContext) -> tuple[Tensor, Tensor]:
    """Per-token values of `predictor_keys`: [keys, batch*(T-2)] at the evaluated positions and
    [keys, batch] at the last position, batch-major. Computed once per batch (the measured-drop
    family scores them too), a run of whole sequences at a time (`GRAM_BYTES`)."""
    return ctx.shared(("pruning_predictors",), lambda: _predictor_values(ctx))


def _predictor_values(ctx: BatchContext) -> tuple[Tensor, Tensor]:
    resid, n_layers = ctx.resid, ctx.n_layers
    b, t, d = resid[0].shape
    step = max(1, GRAM_BYTES // (t * len(resid) * d * 8))
    every, last = [], []
    for first in range(0, b, step):
        part = [r[first : first + step] for r in resid]
        cos = residual_cosines(part, slice(1, -1)).flatten(0, 1)
        every.append(_rows(cos, n_layers, influence=True))
        cos = residual_cosines(part, slice(-1, None)).flatten(0, 1)
        last.append(_rows(cos, n_layers, influence=False))
    return torch.cat(every, dim=1), torch.cat(last, dim=1)


def _angle(cos: Tensor) -> Tensor:
    """arccos(cos) / π, with float rounding above 1 or below −1 clamped."""
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


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
