"""Streaming reductions: only running sums leave the sweep loop.

`MeanAccumulator` keeps (sum, sum of squares, count) per key on the compute device in float64, so
peak memory does not grow with the number of tokens and there is no host sync per update.
`compare_distributions` turns logits into per-token KL / entropy / agreement / loss against a
reference distribution, in row chunks so the [tokens, vocab] intermediates stay bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from compute.errors import ComputeError

LN2 = math.log(2.0)
Key = tuple[Any, ...]  # (metric, layer, component-or-head, ...) as a family chooses


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
        self._slots: dict[Key, int] = {}
        self._stats = torch.zeros(0, 3, dtype=torch.float64, device=self._device)
        # Index tensors per key list, made once: a host-to-device copy per update would make
        # every update wait for the device.
        self._indices: dict[tuple[Key, ...], Tensor] = {}

    def _slot_indices(self, keys: Sequence[Key]) -> Tensor:
        known = self._indices.get(tuple(keys))
        if known is not None:
            return known
        new = [k for k in keys if k not in self._slots]
        if new:
            for k in new:
                self._slots[k] = len(self._slots)
            grow = torch.zeros(len(new), 3, dtype=torch.float64, device=self._device)
            self._stats = torch.cat([self._stats, grow])
        index = torch.tensor([self._slots[k] for k in keys], device=self._device)
        self._indices[tuple(keys)] = index
        return index

    def add(self, key: Key, values: Float[Tensor, " n"]) -> None:
        """Add the per-token values of one key."""
        self.add_many([key], values.reshape(1, -1))

    def add_many(self, keys: Sequence[Key], values: Float[Tensor, "k n"]) -> None:
        """Add a row of per-token values for each key (one vectorised update)."""
        v = values.detach().to(torch.float64)
        update = torch.stack(
            [v.sum(-1), (v * v).sum(-1), torch.full_like(v[:, 0], v.shape[1])], dim=-1)
        slots = self._slot_indices(keys)  # may grow (rebind) self._stats: resolve it first
        self._stats.index_add_(0, slots, update)

    def keys(self) -> list[Key]:
        return list(self._slots)

    def result(self, key: Key) -> MeanStat:
        s, ss, n = (float(x) for x in self._stats[self._slots[key]].tolist())
        if not (math.isfinite(s) and math.isfinite(ss)):
            raise ComputeError(f"non-finite values accumulated for {key!r}")
        mean = s / n
        if n < 2:
            return MeanStat(mean, None, int(n))
        var = max((ss - n * mean * mean) / (n - 1), 0.0)
        return MeanStat(mean, math.sqrt(var / n), int(n))

    def results(self) -> dict[Key, MeanStat]:
        return {k: self.result(k) for k in self._slots}


@dataclass
class Reference:
    """The clean model's next-token distribution at the evaluated positions."""

    probs: Float[Tensor, "n vocab"]
    argmax: Int[Tensor, " n"]
    entropy_nats: Float[Tensor, " n"]
    loss: Float[Tensor, " n"]
    targets: Int[Tensor, " n"]

    @property
    def entropy_bits(self) -> Float[Tensor, " n"]:
        return self.entropy_nats / LN2


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
    z = logits.float()
    lse, probs = _logsumexp_softmax(z)
    _check_finite(lse, "clean model logits")
    entropy = lse - torch.linalg.vecdot(probs, z)
    loss = lse - z.gather(-1, targets[:, None]).squeeze(-1)
    return Reference(probs, z.argmax(-1), entropy, loss, targets)


def reference_in_chunks(
    to_logits: Callable[[Tensor], Tensor], resid: Float[Tensor, "n d_model"],
    targets: Int[Tensor, " n"], *, max_rows: int,
) -> Reference:
    """`reference_from_logits` of to_logits(resid), written chunk by chunk into one [n, vocab]
    tensor of probabilities, so only one chunk of logits exists at a time."""
    n = resid.shape[0]
    parts: list[Reference] = []
    probs: Tensor | None = None
    for start in range(0, n, max_rows):
        part = reference_from_logits(to_logits(resid[start : start + max_rows]),
                                     targets[start : start + max_rows])
        if probs is None:
            probs = torch.empty(n, part.probs.shape[-1], dtype=torch.float32,
                                device=resid.device)
        probs[start : start + part.probs.shape[0]] = part.probs
        parts.append(Reference(part.probs[:0], part.argmax, part.entropy_nats, part.loss,
                               part.targets))
    if probs is None:
        raise ComputeError("no evaluated positions to build the reference distribution from")
    return Reference(probs, torch.cat([p.argmax for p in parts]),
                     torch.cat([p.entropy_nats for p in parts]),
                     torch.cat([p.loss for p in parts]), targets)


def compare_distributions(
    to_logits: Callable[[Tensor], Tensor],
    resid: Float[Tensor, "g n d_model"],
    ref: Reference,
    *,
    max_rows: int,
    what: str = "intervention",
) -> TokenStats:
    """Compare Q = softmax(z), z = to_logits(resid), with the reference P, in row chunks.

    With lse = logsumexp(z) and sum(p) = 1, the per-token quantities reduce to dot products:
      KL(P||Q) = -H(P) - p.z + lse      H(Q) = lse - q.z      loss = lse - z[target]
    which needs one softmax and two dot products per row instead of materialising log Q.
    KL is clamped at 0: it is >= 0 exactly, and only float rounding (~1e-7) makes it negative.
    """
    g, n, _ = resid.shape
    out = torch.empty(5, g, n, dtype=torch.float32, device=resid.device)
    for gi in range(g):
        for start in range(0, n, max_rows):
            stop = min(n, start + max_rows)
            z = to_logits(resid[gi, start:stop]).float()
            lse, q = _logsumexp_softmax(z)
            out[0, gi, start:stop] = (lse - torch.linalg.vecdot(ref.probs[start:stop], z)
                                      - ref.entropy_nats[start:stop]).clamp_min_(0.0)
            out[1, gi, start:stop] = (lse - torch.linalg.vecdot(q, z)) / LN2
            top = z.argmax(-1)
            out[2, gi, start:stop] = (top == ref.argmax[start:stop]).float()
            tgt = ref.targets[start:stop]
            out[3, gi, start:stop] = lse - z.gather(-1, tgt[:, None]).squeeze(-1)
            out[4, gi, start:stop] = (top == tgt).float()
    _check_finite(out, what)
    return TokenStats(out[0], out[1], out[2], out[3], out[4])


def _logsumexp_softmax(z: Float[Tensor, "n vocab"]) -> tuple[Tensor, Tensor]:
    """logsumexp and softmax of each row from one pass of exp (exp dominates the cost)."""
    top = z.amax(dim=-1, keepdim=True)
    e = torch.exp(z - top)
    total = e.sum(dim=-1, keepdim=True)
    return (top + total.log()).squeeze(-1), e.div_(total)


def _check_finite(x: Tensor, what: str) -> None:
    """Raise on NaN/inf. On an accelerator this check would wait for the device at every
    comparison; there NaN and inf propagate into the float64 sums instead, and
    `MeanAccumulator.result` refuses them (naming the metric) when the sweep ends."""
    if x.device.type != "cpu":
        return
    if not bool(torch.isfinite(x).all()):
        raise ComputeError(f"non-finite values (NaN or inf) in {what}; refusing to store them")


def eval_mask(seq_len: int, device: torch.device | str = "cpu") -> Bool[Tensor, " pos"]:
    """Evaluated positions 1 .. seq_len-2 (docs/metrics.md: shared conventions)."""
    mask = torch.zeros(seq_len, dtype=torch.bool, device=device)
    mask[1 : seq_len - 1] = True
    return mask
