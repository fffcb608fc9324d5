"""Streaming reductions: only running sums leave the sweep loop.

`MeanAccumulator` keeps (sum, sum of squares, count) per key on the compute device in float64, so
peak memory does not grow with the number of tokens and there is no host sync per update.
`compare_distributions` turns logits into per-token KL / entropy / agreement / loss against a
reference distribution, in row chunks so the [tokens, vocab] intermediates stay bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from compute.errors import ComputeError

LN2 = math.log(2.0)


@dataclass(frozen=True)
class MeanStat:
    """A token-weighted mean with its standard error (sample std / sqrt(n))."""

    value: float
    stderr: float | None
    n: int


class MeanAccumulator:
    """Running sum, sum of squares and count per key; finalised into `MeanStat`s."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._device = torch.device(device)
        self._slots: dict[Hashable, int] = {}
        self._stats = torch.zeros(0, 3, dtype=torch.float64, device=self._device)

    def _slot_indices(self, keys: Sequence[Hashable]) -> Tensor:
        new = [k for k in keys if k not in self._slots]
        if new:
            for k in new:
                self._slots[k] = len(self._slots)
            grow = torch.zeros(len(new), 3, dtype=torch.float64, device=self._device)
            self._stats = torch.cat([self._stats, grow])
        return torch.tensor([self._slots[k] for k in keys], device=self._device)

    def add(self, key: Hashable, values: Float[Tensor, " n"]) -> None:
        """Add the per-token values of one key."""
        self.add_many([key], values.reshape(1, -1))

    def add_many(self, keys: Sequence[Hashable], values: Float[Tensor, "k n"]) -> None:
        """Add a row of per-token values for each key (one vectorised update)."""
        v = values.detach().to(torch.float64)
        update = torch.stack(
            [v.sum(-1), (v * v).sum(-1), torch.full_like(v[:, 0], v.shape[1])], dim=-1)
        slots = self._slot_indices(keys)  # may grow (rebind) self._stats: resolve it first
        self._stats.index_add_(0, slots, update)

    def keys(self) -> list[Hashable]:
        return list(self._slots)

    def result(self, key: Hashable) -> MeanStat:
        s, ss, n = (float(x) for x in self._stats[self._slots[key]].tolist())
        if not (math.isfinite(s) and math.isfinite(ss)):
            raise ComputeError(f"non-finite values accumulated for {key!r}")
        mean = s / n
        if n < 2:
            return MeanStat(mean, None, int(n))
        var = max((ss - n * mean * mean) / (n - 1), 0.0)
        return MeanStat(mean, math.sqrt(var / n), int(n))

    def results(self) -> dict[Hashable, MeanStat]:
        return {k: self.result(k) for k in self._slots}


@dataclass
class Reference:
    """The clean model's next-token distribution at the evaluated positions."""

    logp: Float[Tensor, "n vocab"]
    argmax: Int[Tensor, " n"]
    entropy_bits: Float[Tensor, " n"]
    loss: Float[Tensor, " n"]
    targets: Int[Tensor, " n"]


@dataclass
class TokenStats:
    """Per-token comparison of a distribution Q with the reference P (rows: groups)."""

    kl: Float[Tensor, "g n"]
    entropy_bits: Float[Tensor, "g n"]
    agree: Float[Tensor, "g n"]
    loss: Float[Tensor, "g n"]
    correct: Float[Tensor, "g n"]


def reference_from_logits(
    logits: Float[Tensor, "n vocab"], targets: Int[Tensor, " n"]
) -> Reference:
    """Build the reference P from clean logits (cast to float32 first)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    _check_finite(logp, "clean model logits")
    entropy = -(logp.exp() * logp).sum(-1) / LN2
    loss = -logp.gather(-1, targets[:, None]).squeeze(-1)
    return Reference(logp, logp.argmax(-1), entropy, loss, targets)


def compare_distributions(
    to_logits: Callable[[Tensor], Tensor],
    resid: Float[Tensor, "g n d_model"],
    ref: Reference,
    *,
    max_rows: int,
    what: str = "intervention",
) -> TokenStats:
    """Compare Q = softmax(to_logits(resid)) with the reference, chunking over rows.

    KL(P||Q) per token is clamped at 0: it is >= 0 in exact arithmetic and only float rounding
    makes it (by ~1e-7) negative when Q is almost P.
    """
    g, n, _ = resid.shape
    out = torch.empty(5, g, n, dtype=torch.float32, device=resid.device)
    for gi in range(g):
        for start in range(0, n, max_rows):
            stop = min(n, start + max_rows)
            logq = torch.log_softmax(to_logits(resid[gi, start:stop]).float(), dim=-1)
            _check_finite(logq, what)
            logp = ref.logp[start:stop]
            out[0, gi, start:stop] = (logp.exp() * (logp - logq)).sum(-1).clamp_min_(0.0)
            out[1, gi, start:stop] = -(logq.exp() * logq).sum(-1) / LN2
            top = logq.argmax(-1)
            out[2, gi, start:stop] = (top == ref.argmax[start:stop]).float()
            tgt = ref.targets[start:stop, None]
            out[3, gi, start:stop] = -logq.gather(-1, tgt).squeeze(-1)
            out[4, gi, start:stop] = (top == tgt.squeeze(-1)).float()
    return TokenStats(out[0], out[1], out[2], out[3], out[4])


def _check_finite(x: Tensor, what: str) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ComputeError(f"non-finite values (NaN or inf) in {what}; refusing to store them")


def eval_mask(seq_len: int, device: torch.device | str = "cpu") -> Bool[Tensor, " pos"]:
    """Evaluated positions 1 .. seq_len-2 (METRICS.md: shared conventions)."""
    mask = torch.zeros(seq_len, dtype=torch.bool, device=device)
    mask[1 : seq_len - 1] = True
    return mask
