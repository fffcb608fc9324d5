"""Streaming reductions: only running sums leave the sweep loop.

`MeanAccumulator` keeps, per key and per sequence, the sum of values on the compute device in
float64 (and the count on the host), so peak memory does not grow with the number of tokens,
there is no host sync per update, and every mean comes with a standard error whose unit is the
sequence.
`compare_distributions` turns logits into per-token KL / entropy / agreement / loss against a
reference distribution (`reference_distribution`), making and reducing the logits in [rows,
cols] blocks (`LogitChunks`) so that no [tokens, vocab] intermediate exists and, on a CPU, each
block is reduced while it is in the cache.

Why one module of about 600 lines: the two halves share one contract that would otherwise be
spread over two files and kept in step by hand. `compare_distributions` emits per-token values
in exactly the layout `MeanAccumulator.add_many` sums (keys x batch rows, float64 on the
device, no host sync), and the reference distribution (`Reference`, kept as probabilities or,
for linear logits, pulled back through W_U) is defined by what the streamed statistics read.
Each part is small — the accumulator (~210 lines), the reference (~100), the streamed and fused
reductions (~190), the finite checks and masks (~30) — and each is held to its slow reference
in `tests/unit/test_reduce.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from compute.errors import ComputeError

LN2 = math.log(2.0)
Key = tuple[Any, ...]  # (metric, layer, component-or-head, ...) as a family chooses


@dataclass(frozen=True)
class MeanStat:
    """A mean over sequences: the mean of per-sequence means, with its standard error (sample
    std of the per-sequence means / sqrt(n)); `n` counts sequences, `tokens` the values."""

    value: float
    stderr: float | None
    n: int
    tokens: int = 0


class MeanAccumulator:
    """Per key and per sequence, the running sum of values (float64, on the compute device) and
    their count (on the host); finalised into `MeanStat`s whose unit is the sequence.

    The engine says which sequences a batch holds (`start_batch(first, n)`); a row of values
    added then is batch-major — sequence after sequence, the same number of values each —
    and is summed per sequence on the device. Values whose sequence is given per value
    (`add_many(..., sequence_ids=)`) may have any count per sequence. A sequence may receive
    values in several calls (batches): its sums and counts add up. Memory is [sequences, keys]
    float64, whatever the number of tokens; nothing waits for the device until `results`.
    """

    def __init__(self, device: torch.device | str = "cpu", n_sequences: int = 0) -> None:
        self._device = torch.device(device)
        self._slots: dict[Key, int] = {}
        self._sums = torch.zeros(n_sequences, 0, dtype=torch.float64, device=self._device)
        self._counts = np.zeros((n_sequences, 0), dtype=np.int64)
        # Index tensors per key list, made once: a host-to-device copy per update would make
        # every update wait for the device.
        self._indices: dict[tuple[Key, ...], tuple[Tensor, np.ndarray, bool]] = {}
        self._batch: tuple[int, int] | None = None

    def start_batch(self, first_sequence: int, n_sequences: int) -> None:
        """The next rows of values are of sequences first .. first+n-1, batch-major."""
        if first_sequence < 0 or n_sequences < 1:
            raise ValueError(f"bad batch of sequences: first {first_sequence}, n {n_sequences}")
        self._batch = (first_sequence, n_sequences)
        self._grow_sequences(first_sequence + n_sequences)

    @property
    def batch(self) -> tuple[int, int] | None:
        """(first sequence, sequences) of the batch being added, as `start_batch` said."""
        return self._batch

    def _grow_sequences(self, total: int) -> None:
        have = self._sums.shape[0]
        if total > have:
            self._sums = torch.cat(
                [
                    self._sums,
                    torch.zeros(
                        total - have, self._sums.shape[1], dtype=torch.float64, device=self._device
                    ),
                ]
            )
            self._counts = np.concatenate(
                [self._counts, np.zeros((total - have, self._counts.shape[1]), np.int64)]
            )

    def _slot_indices(self, keys: Sequence[Key]) -> tuple[Tensor, np.ndarray, bool]:
        """Device and host slot indices of `keys`, and whether they are all distinct."""
        known = self._indices.get(tuple(keys))
        if known is not None:
            return known
        new = [k for k in dict.fromkeys(keys) if k not in self._slots]
        if new:
            for k in new:
                self._slots[k] = len(self._slots)
            have = self._sums.shape[1]
            if len(self._slots) > have:  # grow the columns by doubling: few copies in all
                more = max(len(self._slots), 2 * have, 16) - have
                rows = self._sums.shape[0]
                self._sums = torch.cat(
                    [self._sums, torch.zeros(rows, more, dtype=torch.float64, device=self._device)],
                    dim=1,
                )
                self._counts = np.concatenate(
                    [self._counts, np.zeros((rows, more), np.int64)], axis=1
                )
        slots = [self._slots[k] for k in keys]
        index = (
            torch.tensor(slots, device=self._device),
            np.asarray(slots, dtype=np.int64),
            len(set(slots)) == len(slots),
        )
        self._indices[tuple(keys)] = index
        return index

    def add(
        self,
        key: Key,
        values: Float[Tensor, " n"],
        *,
        sequence_ids: Tensor | np.ndarray | Sequence[int] | None = None,
    ) -> None:
        """Add the per-token values of one key."""
        self.add_many([key], values.reshape(1, -1), sequence_ids=sequence_ids)

    def add_many(
        self,
        keys: Sequence[Key],
        values: Float[Tensor, "k n"],
        *,
        sequence_ids: Tensor | np.ndarray | Sequence[int] | None = None,
    ) -> None:
        """Add a row of per-token values for each key (one vectorised update).

        Without `sequence_ids` the row is the current batch's sequences one after another,
        each with n / batch values. With them, `sequence_ids[j]` is the sequence of value j.
        """
        v = values.detach()
        k, n = v.shape
        if sequence_ids is not None:
            self._add_by_ids(keys, v, sequence_ids)
            return
        if self._batch is None:
            raise ComputeError(
                "MeanAccumulator: call start_batch(first, n) before adding "
                "values, or give sequence_ids"
            )
        first, b = self._batch
        if n % b:
            raise ComputeError(
                f"{n} values per key do not split evenly over the batch's {b} "
                f"sequences (keys {keys[0]!r}...)"
            )
        sums = v.reshape(k, b, n // b).sum(-1, dtype=torch.float64)  # [k, b]
        slots, host_slots, distinct = self._slot_indices(keys)  # may grow: resolve first
        self._sums[first : first + b].index_add_(1, slots, sums.T)
        if distinct:
            self._counts[first : first + b, host_slots] += n // b
        else:  # a key repeats within the call: every occurrence counts
            rows = np.arange(first, first + b)[:, None]
            np.add.at(self._counts, (rows, host_slots[None, :]), n // b)

    def _add_by_ids(
        self, keys: Sequence[Key], v: Tensor, sequence_ids: Tensor | np.ndarray | Sequence[int]
    ) -> None:
        ids = np.asarray(
            sequence_ids.cpu() if isinstance(sequence_ids, Tensor) else sequence_ids, dtype=np.int64
        ).reshape(-1)
        n = v.shape[1]
        if ids.shape[0] != n:
            raise ComputeError(f"{ids.shape[0]} sequence ids for {n} values per key")
        if n == 0:
            return
        if ids.min() < 0:
            raise ComputeError("negative sequence id")
        self._grow_sequences(int(ids.max()) + 1)
        slots, host_slots, _ = self._slot_indices(keys)
        width = self._sums.shape[1]
        flat = torch.as_tensor(ids, device=self._device)[None, :] * width + slots[:, None]
        self._sums.view(-1).index_add_(0, flat.reshape(-1), v.to(torch.float64).reshape(-1))
        per_seq = np.bincount(ids, minlength=self._counts.shape[0])
        seen = np.nonzero(per_seq)[0]
        for slot in host_slots:  # a key may repeat: add once per occurrence
            self._counts[seen, slot] += per_seq[seen]

    def derive(self, key: Key, terms: Sequence[tuple[float, Key]]) -> None:
        """A new key whose per-sequence sums are sum(coef * sums of term), the counts those of
        the terms (which must all be equal): the mean of a linear combination of per-token
        values of the same tokens, e.g. swap minus drop, or prev_k / k."""
        if not terms:
            raise ValueError("derive needs at least one term")
        counts = self._counts[:, self._slots[terms[0][1]]]
        for _, term in terms[1:]:
            if not np.array_equal(self._counts[:, self._slots[term]], counts):
                raise ComputeError(
                    f"cannot combine {terms[0][1]!r} and {term!r}: their "
                    "values are not of the same tokens"
                )
        total = sum(coef * self._sums[:, self._slots[term]] for coef, term in terms)
        _, host_slots, _ = self._slot_indices([key])
        self._sums[:, int(host_slots[0])] = total
        self._counts[:, int(host_slots[0])] = counts

    def keys(self) -> list[Key]:
        return list(self._slots)

    def sequence_means(self) -> tuple[list[Key], np.ndarray, np.ndarray]:
        """(keys, means [sequences, keys] float64, mask [sequences, keys] of sequences that
        have values for the key). One device-to-host copy."""
        width = len(self._slots)
        sums = self._sums[:, :width].cpu().numpy()
        counts = self._counts[:, :width]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return list(self._slots), means, counts > 0

    def results(self) -> dict[Key, MeanStat]:
        """Every key's `MeanStat`, computed for all keys at once (vectorised over keys: a sweep
        has thousands of them)."""
        keys, means, has = self.sequence_means()
        return self._stats(keys, means, has, self._counts[:, : len(keys)])

    def result(self, key: Key) -> MeanStat:
        slot = self._slots[key]
        sums = self._sums[:, slot : slot + 1].cpu().numpy()
        counts = self._counts[:, slot : slot + 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return self._stats([key], means, counts > 0, counts)[key]

    @staticmethod
    def _stats(
        keys: list[Key], means: np.ndarray, has: np.ndarray, counts: np.ndarray
    ) -> dict[Key, MeanStat]:
        """Per column: the mean of the per-sequence means, their sample std (ddof 1) / sqrt(n);
        n = sequences with values."""
        n = has.sum(axis=0)
        filled = np.where(has, means, 0.0)
        if not np.isfinite(filled).all():
            bad = int(np.flatnonzero(~np.isfinite(filled).all(axis=0))[0])
            raise ComputeError(f"non-finite values accumulated for {keys[bad]!r}")
        if (n == 0).any():
            raise ComputeError(f"no values accumulated for {keys[int(np.argmax(n == 0))]!r}")
        value = filled.sum(axis=0) / n
        squares = (np.where(has, means - value, 0.0) ** 2).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            stderr = np.sqrt(squares / (n - 1) / n)
        tokens = counts.sum(axis=0)
        return {
            key: MeanStat(
                float(value[i]), float(stderr[i]) if n[i] >= 2 else None, int(n[i]), int(tokens[i])
            )
            for i, key in enumerate(keys)
        }


@dataclass
class Reference:
    """The clean model's next-token distribution P at the evaluated positions.

    What a comparison needs of P is p.z for the other model's logits z. Where logits are a
    linear map of the normed residual x (z = x W_U + b_U, float32 weights, no soft-cap) that is
    p.z = x . (W_U p) + p . b_U, so P is kept as `pull` = W_U p ([n, d_model], float64) and
    `pull_bias` = p . b_U, never as [n, vocab]: a comparison reads d_model numbers per row
    instead of the vocabulary's. Otherwise (soft-capped logits; bfloat16 or float16 weights,
    whose logits are rounded to that dtype, so the identity would not hold for them to float32
    rounding) P is kept whole as `probs`, float32.

    `entropy_nats` is float64 and computed exactly as a comparison computes lse - p.z, so that
    comparing the clean logits with themselves gives KL 0 to the bit."""

    probs: Float[Tensor, "n vocab"] | None
    argmax: Int[Tensor, " n"]
    entropy_nats: Float[Tensor, " n"]
    loss: Float[Tensor, " n"]
    targets: Int[Tensor, " n"]
    pull: Float[Tensor, "n d_model"] | None = None
    pull_bias: Float[Tensor, " n"] | None = None

    def expected_logit(self, rows: slice, x: Float[Tensor, "r d_model"], pz: Tensor) -> Tensor:
        """p.z for the logits of normed residuals `x` at `rows`: from `pull` where P is kept
        that way, else `pz` as streamed against `probs`."""
        if self.pull is None or self.pull_bias is None:
            return pz
        return _pulled_back_pz(x, self.pull[rows], self.pull_bias[rows])

    @property
    def entropy_bits(self) -> Float[Tensor, " n"]:
        return self.entropy_nats / LN2


def _pulled_back_pz(x: Tensor, pull: Tensor, pull_bias: Tensor) -> Tensor:
    """p.z = x . (W_U p) + b_U . p, in float64."""
    return torch.linalg.vecdot(x.to(torch.float64), pull) + pull_bias


@dataclass
class TokenStats:
    """Per-token comparison of a distribution Q with the reference P (rows: groups)."""

    kl: Float[Tensor, "g n"]
    entropy_bits: Float[Tensor, "g n"]
    agree: Float[Tensor, "g n"]
    loss: Float[Tensor, "g n"]
    correct: Float[Tensor, "g n"]


@dataclass(frozen=True)
class LogitChunks:
    """How logits are made and reduced: `rows` positions at a time, and within those `cols`
    vocabulary columns at a time (cols >= vocabulary: whole rows at once)."""

    rows: int
    cols: int
    # Reduce each block of a comparison in one compiled kernel (`fused_block_terms`) instead of
    # eager passes; the reference pass stays eager. Chosen by the engine for long CPU runs.
    fused: bool = False


class Unembedding(Protocol):
    """What a comparison needs of a model: its final norm, and the logits of a normed residual
    for a range of vocabulary columns (W_U[:, start:stop], b_U[start:stop], any soft-cap).

    One whose logits are linear in x to float32 rounding (`logits_are_linear`) also gives, for
    weights p over a column range, (W_U[:, start:stop] p, b_U[start:stop] . p)
    (`pulled_back`): then the reference keeps W_U p instead of P."""

    @property
    def d_vocab(self) -> int: ...
    def normed(self, resid: Tensor) -> Tensor: ...
    def logit_columns(self, x: Tensor, start: int, stop: int) -> Tensor: ...


class LinearUnembedding(Unembedding, Protocol):
    @property
    def logits_are_linear(self) -> bool: ...
    def pulled_back(self, p: Tensor, start: int, stop: int) -> tuple[Tensor, Tensor]: ...


# The reference's logits are kept for one block of rows between its two passes (when P is kept
# as W_U p): at most this many bytes, whatever the vocabulary (Gemma 3's 262,144 columns make a
# 512-row block 512 MiB). `compute.metrics.base.logit_chunks` caps its rows by it, so that the
# reference and every comparison make their logits in the same row blocks (the same matmuls:
# unchanged logits compare to KL 0 to the bit).
REFERENCE_BLOCK_BYTES = 256 * 2**20


def keeps_probs(unembed: Unembedding) -> bool:
    """Whether the reference keeps P whole ([n, vocab] float32) rather than as W_U p."""
    return not bool(getattr(unembed, "logits_are_linear", False))


def reference_distribution(
    unembed: Unembedding,
    resid: Float[Tensor, "n d_model"],
    targets: Int[Tensor, " n"],
    *,
    chunks: LogitChunks,
) -> Reference:
    """The reference P = softmax(z) of the clean final residual, made block by block with the
    same calls and sums as every comparison: kept whole as one [n, vocab] float32 tensor, or as
    W_U p and b_U . p where the logits are linear (`Reference`, `keeps_probs`).

    Per block of rows, the first pass over the column blocks gives logsumexp, argmax and the
    target's logit and keeps the logits (in P's own storage when P is kept whole); the second
    turns each column block into p = exp(z - lse) and either writes it in place and sums p.z in
    float64, or adds its (W_U p, b_U . p) to float64 running sums. So H(P) = lse - p.z is
    exactly what a comparison of these logits with P computes, and an intervention that
    changes nothing gets KL 0 to the bit.
    """
    n, d = resid.shape
    if n == 0:
        raise ComputeError("no evaluated positions to build the reference distribution from")
    vocab, f64, device = unembed.d_vocab, torch.float64, resid.device
    whole = keeps_probs(unembed)
    linear: LinearUnembedding = unembed  # type: ignore[assignment]  # used only when not whole
    rows_at_once = chunks.rows  # the comparisons' own row blocks: the same matmuls, bit for bit
    probs = torch.empty(n, vocab, dtype=torch.float32, device=device) if whole else None
    pull = None if whole else torch.zeros(n, d, dtype=f64, device=device)
    pull_bias = None if whole else torch.zeros(n, dtype=f64, device=device)
    argmax = torch.empty(n, dtype=torch.long, device=device)
    loss = torch.empty(n, dtype=torch.float32, device=device)
    entropy = torch.empty(n, dtype=f64, device=device)
    for start in range(0, n, rows_at_once):
        rows = slice(start, min(n, start + rows_at_once))
        x = unembed.normed(resid[rows])
        logits = (
            probs[rows]
            if probs is not None
            else torch.empty(x.shape[0], vocab, dtype=torch.float32, device=device)
        )
        lse, _, _, argmax[rows], z_target = _streamed_logit_stats(
            unembed, x, None, targets[rows], chunks.cols, keep=logits
        )
        _check_finite(lse, "clean model logits")
        loss[rows] = lse - z_target
        pz = torch.zeros_like(lse)
        for c0 in range(0, vocab, chunks.cols):
            c1 = min(vocab, c0 + chunks.cols)
            block = logits[:, c0:c1]
            p = torch.exp(block - lse[:, None].float())
            if pull is None or pull_bias is None:
                pz += torch.linalg.vecdot(p, block).to(f64)
                block.copy_(p)
            else:
                w_p, b_p = linear.pulled_back(p, c0, c1)
                pull[rows] += w_p.to(f64)
                pull_bias[rows] += b_p.to(f64)
        if pull is not None and pull_bias is not None:
            pz = _pulled_back_pz(x, pull[rows], pull_bias[rows])
        entropy[rows] = lse - pz
    return Reference(probs, argmax, entropy, loss, targets, pull, pull_bias)


def compare_distributions(
    unembed: Unembedding,
    resid: Float[Tensor, "g n d_model"],
    ref: Reference,
    *,
    chunks: LogitChunks,
    what: str = "intervention",
) -> TokenStats:
    """Compare Q = softmax(z), z = logits of resid, with the reference P.

    With lse = logsumexp(z) and sum(p) = 1, the per-token quantities reduce to dot products:
      KL(P||Q) = -H(P) - p.z + lse      H(Q) = lse - q.z      loss = lse - z[target]
    which needs no log Q; p.z is x . (W_U p) + b_U . p where the reference keeps W_U p
    (`Reference`), else streamed against P's columns. Each of them is also a running sum over
    vocabulary columns (online logsumexp: with m the running max, s = sum exp(z - m) and
    t = sum exp(z - m) z are rescaled by exp(m_old - m_new) when the max grows; q.z = t / s),
    so the logits are made and reduced
    `chunks.cols` columns at a time: on a CPU a [rows, cols] block stays in the cache between
    the unembedding matmul and the reductions instead of a [rows, vocab] one streaming through
    memory a dozen times. KL is clamped at 0: it is >= 0 exactly, and only float rounding
    (~1e-7) makes it negative.
    """
    g, n, _ = resid.shape
    out = torch.empty(5, g, n, dtype=torch.float32, device=resid.device)
    for gi in range(g):
        for start in range(0, n, chunks.rows):
            stop = min(n, start + chunks.rows)
            rows = slice(start, stop)
            x = unembed.normed(resid[gi, rows])
            lse, pz, qz, top, z_target = _streamed_logit_stats(
                unembed,
                x,
                ref.probs[rows] if ref.probs is not None else None,
                ref.targets[rows],
                chunks.cols,
                fused=chunks.fused,
            )
            pz = ref.expected_logit(rows, x, pz)
            out[0, gi, rows] = (lse - pz - ref.entropy_nats[rows]).clamp_min_(0.0)
            out[1, gi, rows] = (lse - qz) / LN2
            out[2, gi, rows] = (top == ref.argmax[rows]).float()
            out[3, gi, rows] = lse - z_target
            out[4, gi, rows] = (top == ref.targets[rows]).float()
    _check_finite(out, what)
    return TokenStats(out[0], out[1], out[2], out[3], out[4])


def _streamed_logit_stats(
    unembed: Unembedding,
    x: Float[Tensor, "n d_model"],
    probs: Float[Tensor, "n vocab"] | None,
    targets: Int[Tensor, " n"],
    cols: int,
    *,
    keep: Float[Tensor, "n vocab"] | None = None,
    fused: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Per row: logsumexp(z), p.z (meaningless without `probs`), q.z, argmax z (first of ties)
    and z[target], from the logits made `cols` vocabulary columns at a time (float32 logits
    whatever the model's dtype; the running sums in float64). `keep`, if given, receives the
    logits. `fused` reduces each block of a comparison in one compiled kernel
    (`fused_block_terms`: the same float32 per-block sums, in another order)."""
    vocab = unembed.d_vocab
    m = s = t = pz = top = z_target = torch.empty(0)
    f64 = torch.float64
    kernel = fused_kernel() if fused and keep is None else None
    for c0 in range(0, vocab, cols):
        c1 = min(vocab, c0 + cols)
        local = (targets - c0).clamp_(0, c1 - c0 - 1)
        if kernel is not None:
            first = m if c0 else torch.full((x.shape[0],), -math.inf, device=x.device)
            block_p = probs[:, c0:c1] if probs is not None else None
            terms = kernel(unembed.logit_columns(x, c0, c1), first, block_p, local)
            chunk_max, chunk_arg, z_at, new_m = terms[:4]
            chunk_s, chunk_t = terms[4].to(f64), terms[5].to(f64)
            chunk_pz = terms[6].to(f64) if probs is not None else chunk_s
        else:
            z = unembed.logit_columns(x, c0, c1).float()
            if keep is not None:
                keep[:, c0:c1] = z
            # amax and a two-level argmax instead of max(dim=-1): on a CPU the reduction that
            # also returns indices ran 5-16x slower than amax over the same block.
            chunk_max = z.amax(dim=-1)
            chunk_arg = first_argmax(z)
            z_at = z.gather(-1, local[:, None]).squeeze(-1)
            new_m = chunk_max if c0 == 0 else torch.maximum(m, chunk_max)
            e = torch.sub(z, new_m[:, None]).exp_()  # one temporary, exponentiated in place
            # Per-block sums in float32, running sums across blocks in float64: no rounding
            # grows with the number of blocks.
            chunk_s = e.sum(dim=-1).to(f64)
            chunk_t = torch.linalg.vecdot(e, z).to(f64)
            chunk_pz = (
                torch.linalg.vecdot(probs[:, c0:c1], z).to(f64) if probs is not None else chunk_s
            )
        if c0 == 0:
            s, t, pz, top, z_target = chunk_s, chunk_t, chunk_pz, chunk_arg, z_at
        else:
            scale = torch.exp((m - new_m).to(f64))
            s = s * scale + chunk_s
            t = t * scale + chunk_t
            pz = pz + chunk_pz
            later = chunk_max > m  # m: the max so far; strictly, so the first maximum wins
            top = torch.where(later, chunk_arg + c0, top)
            z_target = torch.where(targets >= c0, z_at, z_target)
        m = new_m
    return m + s.log(), pz, t / s, top, z_target  # float64 until stored: KL cancels


def fused_block_terms(
    z: Float[Tensor, "n cols"],
    m_prev: Float[Tensor, " n"],
    probs: Float[Tensor, "n cols"] | None,
    local_targets: Int[Tensor, " n"],
) -> tuple[Tensor, ...]:
    """One block of a comparison, written to be compiled into one kernel: the block's max, its
    first argmax, the target's logit (at `local_targets`, clamped into the block), the new
    running max m = max(m_prev, block max), and the float32 sums of e = exp(z - m), of e z and
    of p z (without `probs`, the reference kept as W_U p: six terms). The same quantities as
    the eager loop of `_streamed_logit_stats`, from the logits in float32 whatever the model's
    dtype."""
    z = z.float()
    chunk_max = z.amax(dim=-1)
    chunk_arg = z.argmax(dim=-1)
    z_at = z.gather(-1, local_targets[:, None]).squeeze(-1)
    new_m = torch.maximum(m_prev, chunk_max)
    e = torch.exp(z - new_m[:, None])
    terms = (chunk_max, chunk_arg, z_at, new_m, e.sum(dim=-1), (e * z).sum(dim=-1))
    return terms if probs is None else (*terms, (probs * z).sum(dim=-1))


_KERNEL: dict[str, Any] = {}


def fused_kernel() -> Any:
    """`fused_block_terms` compiled by torch.compile (dynamic shapes: one compilation serves
    every block shape of a dtype; Inductor's on-disk cache serves the next process). Where
    compiling fails (no C++ compiler, an unsupported platform) the first call says so once and
    every call runs the eager function: the same quantities either way."""
    if "fn" in _KERNEL:
        return _KERNEL["fn"]
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # no compile-worker pool inside a worker's pool child
    compiled = torch.compile(fused_block_terms, dynamic=True, fullgraph=True)

    def first_call(*args: Tensor) -> tuple[Tensor, ...]:
        try:
            out = compiled(*args)
            _KERNEL["fn"] = compiled
        except Exception as exc:
            import warnings

            warnings.warn(f"fused logit reductions unavailable, eager instead: {exc}", stacklevel=2)
            _KERNEL["fn"] = fused_block_terms
            out = fused_block_terms(*args)
        return out

    _KERNEL["fn"] = first_call
    return first_call


# Width of the sub-blocks of `first_argmax`: a row of 1024 logits is 32 sub-blocks of 32.
ARGMAX_SUBBLOCK = 32


def first_argmax(z: Float[Tensor, "n cols"]) -> Int[Tensor, " n"]:
    """Per row, the index of the first maximum (what `torch.argmax` returns), in two levels:
    the vectorised amax of each sub-block of `ARGMAX_SUBBLOCK` columns, the first sub-block
    holding the row's maximum, then the first maximum within it. The same index as
    `z.argmax(-1)` (ties included: the first sub-block holding the maximum holds its first
    occurrence; NaN counts as the maximum, as in argmax), at a fraction of its cost over a
    [512, 1024] block on a CPU. Elsewhere (whole rows on an accelerator) it is argmax."""
    n, c = z.shape
    w = ARGMAX_SUBBLOCK
    if c % w or c < 2 * w or not z.is_contiguous() or z.device.type != "cpu":
        return z.argmax(dim=-1)
    parts = z.view(n, c // w, w)
    best = parts.amax(dim=-1).argmax(dim=-1)  # [n]: the first sub-block holding the max
    within = parts.gather(1, best[:, None, None].expand(n, 1, w)).squeeze(1).argmax(dim=-1)
    return best * w + within


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
