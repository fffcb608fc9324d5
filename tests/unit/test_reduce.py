"""Blocked reductions against the obvious whole-matrix computations, whatever the block shape:
the streamed logit comparison (`compute.reduce.compare_distributions`, online logsumexp)
against log-softmax of the whole logits, and the blocked neuron moments
(`compute.metrics.neurons.neuron_moments`) against scipy on the whole cosine matrix."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F

from compute.metrics.neurons import neuron_moments
from compute.reduce import (
    LN2,
    LogitChunks,
    Reference,
    compare_distributions,
    first_argmax,
    reference_distribution,
)


class Unembed:
    """A final LayerNorm and an unembedding with a bias, as a model's."""

    def __init__(self, d_model: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.w = torch.randn(d_model, vocab, generator=gen) * 0.8
        self.b = torch.randn(vocab, generator=gen)
        self.d_vocab = vocab

    def normed(self, resid: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(resid, resid.shape[-1:])

    def logit_columns(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return x @ self.w[:, start:stop] + self.b[start:stop]


class Linear(Unembed):
    """The same unembedding, declared linear: the reference keeps W_U p instead of P."""

    logits_are_linear = True

    def pulled_back(self, p: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        return p @ self.w[:, start:stop].T, p @ self.b[start:stop]


UNEMBEDDINGS = {"P-whole": Unembed, "P-as-WU-p": Linear}


class Given:
    """Logits given outright: the 'residual' is the logits themselves."""

    def __init__(self, vocab: int) -> None:
        self.d_vocab = vocab

    def normed(self, resid: torch.Tensor) -> torch.Tensor:
        return resid

    def logit_columns(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return x[:, start:stop]


def reference_of(logits: torch.Tensor, targets: torch.Tensor, chunks: LogitChunks) -> Reference:
    return reference_distribution(Given(logits.shape[-1]), logits, targets, chunks=chunks)


def obvious(u: Unembed, resid: torch.Tensor, ref_logits: torch.Tensor,
            targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The whole float32 logits, then log-softmax in float64, each quantity by its definition."""
    z = u.logit_columns(u.normed(resid), 0, u.d_vocab).double()
    logq = z.log_softmax(-1)
    logp = ref_logits.double().log_softmax(-1)
    p, q = logp.exp(), logq.exp()
    return {"kl": (p * (logp - logq)).sum(-1), "entropy_bits": -(q * logq).sum(-1) / LN2,
            "agree": (z.argmax(-1) == ref_logits.argmax(-1)).double(),
            "loss": -logq.gather(-1, targets.expand(z.shape[:-1])[..., None]).squeeze(-1),
            "correct": (z.argmax(-1) == targets).double()}


@pytest.mark.parametrize("chunks", [LogitChunks(1000, 1000), LogitChunks(7, 1000),
                                    LogitChunks(64, 64), LogitChunks(5, 37), LogitChunks(3, 1),
                                    LogitChunks(9, 128)],
                         ids=["whole", "rows", "blocks", "ragged", "one-column", "sub-blocks"])
def test_streamed_comparison_equals_the_whole_vocabulary_one(chunks: LogitChunks) -> None:
    d_model, vocab, n, g = 12, 301, 23, 3
    u = Unembed(d_model, vocab, seed=0)
    gen = torch.Generator().manual_seed(1)
    ref_logits = torch.randn(n, vocab, generator=gen) * 3
    targets = torch.randint(0, vocab, (n,), generator=gen)
    targets[:4] = torch.tensor([0, vocab - 1, 36, 37])  # at the edges of column blocks
    resid = torch.randn(g, n, d_model, generator=gen) * 2
    resid[1] = resid[0]  # two variants alike: rows of a group are independent
    top0 = (u.normed(resid[0]) @ u.w + u.b).argmax(-1)
    targets[4:12] = top0[4:12]  # some predictions are right
    ref_logits[torch.arange(8, 16), top0[8:16]] += 50  # and some agree with the reference's
    ref = reference_of(ref_logits, targets, chunks)
    want_p = ref_logits.double().softmax(-1)
    assert torch.allclose(ref.probs.double(), want_p, atol=1e-7)
    assert torch.allclose(ref.entropy_nats, -(want_p * want_p.log()).sum(-1), atol=1e-5)
    assert torch.equal(ref.argmax, ref_logits.argmax(-1))
    got = compare_distributions(u, resid, ref, chunks=chunks)
    want = obvious(u, resid, ref_logits, targets)
    for name, expected in want.items():
        assert torch.allclose(getattr(got, name).double(), expected, atol=2e-5, rtol=1e-5), name
    assert got.kl.min() >= 0
    assert got.correct[0].sum() >= 8
    assert got.agree[0].sum() >= 8
    assert torch.equal(got.kl[0], got.kl[1])


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
@pytest.mark.parametrize("chunks", [LogitChunks(1000, 1000), LogitChunks(7, 64),
                                    LogitChunks(5, 37), LogitChunks(3, 1)],
                         ids=["whole", "blocks", "ragged", "one-column"])
def test_reference_kept_as_wu_p_gives_the_whole_vocabulary_numbers(
        chunks: LogitChunks, fused: bool) -> None:
    """P kept as (W_U p, b_U . p) instead of [n, vocab]: p.z = x . W_U p + b_U . p. Against
    the obvious float64 computation from the whole logits of both models, in any blocks, eager
    or reduced by the compiled kernel; and the same numbers as with P kept whole."""
    d_model, vocab, n, g = 12, 301, 23, 3
    u, whole = Linear(d_model, vocab, seed=0), Unembed(d_model, vocab, seed=0)
    gen = torch.Generator().manual_seed(1)
    clean = torch.randn(n, d_model, generator=gen) * 2
    targets = torch.randint(0, vocab, (n,), generator=gen)
    resid = clean[None] + torch.randn(g, n, d_model, generator=gen) * torch.tensor(
        [0.0, 0.3, 3.0])[:, None, None]  # unchanged, a little changed, much changed
    ref = reference_distribution(u, clean, targets, chunks=chunks)
    assert ref.probs is None
    assert ref.pull is not None
    assert ref.pull.shape == (n, d_model)
    want_p = (u.normed(clean) @ u.w + u.b).double().softmax(-1)
    assert torch.allclose(ref.entropy_nats, -(want_p * want_p.log()).sum(-1), atol=1e-5)
    blocks = LogitChunks(chunks.rows, chunks.cols, fused=fused)
    got = compare_distributions(u, resid, ref, chunks=blocks)
    want = obvious(u, resid, u.normed(clean) @ u.w + u.b, targets)
    for name, expected in want.items():
        assert torch.allclose(getattr(got, name).double(), expected, atol=2e-5, rtol=1e-5), name
    kept = compare_distributions(
        whole, resid, reference_distribution(whole, clean, targets, chunks=chunks),
        chunks=blocks)
    assert torch.allclose(got.kl, kept.kl, atol=1e-5)
    assert torch.equal(got.agree, kept.agree)
    assert got.kl[2].mean() > 1.0  # the much-changed variant is far: KL is not trivially 0


def test_argmax_ties_across_blocks_take_the_first_and_targets_read_their_own_block() -> None:
    """Equal maxima in two column blocks: argmax is the first, as `torch.argmax` says."""
    vocab = 10
    u = Unembed(4, vocab, seed=2)
    u.w.zero_()
    u.b.copy_(torch.tensor([0.0, 5, 1, 2, 3, 5, 4, 5, 0, 1]))
    resid = torch.randn(1, 3, 4)
    targets = torch.tensor([1, 5, 9])
    ref = reference_of(u.b.expand(3, vocab).clone(), targets, LogitChunks(2, 3))
    for cols in (1, 2, 3, 4, 10):
        got = compare_distributions(u, resid, ref, chunks=LogitChunks(2, cols))
        assert got.agree.tolist() == [[1.0, 1.0, 1.0]], cols  # argmax 1 on both sides
        assert got.correct.tolist() == [[1.0, 0.0, 0.0]], cols
        expected = -u.b.log_softmax(-1)[targets]
        assert torch.allclose(got.loss[0], expected, atol=1e-6), cols
        assert torch.allclose(got.kl[0], torch.zeros(3), atol=1e-6), cols


@pytest.mark.parametrize("cols", [64, 96, 1024, 100])
def test_two_level_argmax_is_argmax_with_ties_and_nan(cols: int) -> None:
    """`first_argmax` (amax of 32-column sub-blocks, then argmax within the first holding the
    maximum) returns torch.argmax's index: ties take the first, across and within sub-blocks,
    and NaN counts as the maximum. 100 columns (not a multiple of 32) falls back to argmax."""
    gen = torch.Generator().manual_seed(5)
    z = torch.randint(-4, 4, (200, cols), generator=gen).float()  # many ties
    z[0] = 3.0  # every column ties
    z[1, -1] = 9.0  # the maximum in the last column
    z[2, [5, cols - 3]] = float("nan")
    z[3, cols // 2 :] = 7.0  # ties all in later sub-blocks
    assert torch.equal(first_argmax(z), z.argmax(-1))
    ones = torch.zeros(4, cols)
    assert first_argmax(ones).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_block_reductions_equal_the_eager_ones(dtype: torch.dtype) -> None:
    """Comparisons reduced by the compiled kernel (`LogitChunks.fused`) give the eager loop's
    quantities to float32 summation order (KL and loss within 2e-5 nats, entropy 3e-5 bits),
    the same argmax (ties included) and KL >= 0, from float32 or bfloat16 logits, in ragged
    row and column blocks."""
    vocab = 301
    u = Unembed(12, vocab, seed=7)
    u.w, u.b = u.w.to(dtype), u.b.to(dtype)
    gen = torch.Generator().manual_seed(8)
    resid = (torch.randn(3, 23, 12, generator=gen) * 2).to(dtype)
    resid[2, :5] = 0.0  # logits = bias: ties between the equal bias entries below
    u.b[[3, 150, 290]] = 4.0
    targets = torch.randint(0, vocab, (23,), generator=gen)
    for chunks in (LogitChunks(7, 64), LogitChunks(5, 37), LogitChunks(23, vocab)):
        ref = reference_distribution(u, resid[0], targets, chunks=chunks)
        eager = compare_distributions(u, resid, ref, chunks=chunks)
        fused = compare_distributions(
            u, resid, ref, chunks=LogitChunks(chunks.rows, chunks.cols, fused=True))
        assert torch.allclose(fused.kl, eager.kl, atol=2e-5), chunks
        assert torch.allclose(fused.loss, eager.loss, atol=2e-5), chunks
        assert torch.allclose(fused.entropy_bits, eager.entropy_bits, atol=3e-5), chunks
        assert torch.equal(fused.agree, eager.agree), chunks
        assert torch.equal(fused.correct, eager.correct), chunks
        assert fused.kl.min() >= 0


def test_argmax_ties_within_and_across_wide_blocks() -> None:
    """Column blocks wide enough for the two-level argmax: ties across sub-blocks and across
    column blocks still take the first index, in agreement and in accuracy."""
    vocab = 256
    u = Unembed(4, vocab, seed=6)
    u.w.zero_()
    bias = torch.zeros(vocab)
    bias[[40, 70, 200]] = 5.0  # ties: sub-blocks 1 and 2 of block 0, and block 1 (cols 128)
    u.b.copy_(bias)
    resid = torch.randn(1, 2, 4)
    targets = torch.tensor([40, 70])
    ref = reference_of(bias.expand(2, vocab).clone(), targets, LogitChunks(2, 64))
    assert ref.argmax.tolist() == [40, 40]
    for cols in (64, 128, 256):
        got = compare_distributions(u, resid, ref, chunks=LogitChunks(2, cols))
        assert got.agree.tolist() == [[1.0, 1.0]], cols
        assert got.correct.tolist() == [[1.0, 0.0]], cols


@pytest.mark.parametrize("kind", list(UNEMBEDDINGS))
@pytest.mark.parametrize("chunks", [LogitChunks(8, 300), LogitChunks(3, 7)], ids=["rows", "blocks"])
def test_the_clean_logits_compared_with_themselves_give_zero_to_the_bit(
        chunks: LogitChunks, kind: str) -> None:
    """The reference is made by the same calls as a comparison: nothing changed, KL is 0 and
    the loss is the reference's, exactly (the engine's `none` row and identity layers), with P
    kept whole or as W_U p."""
    u = UNEMBEDDINGS[kind](12, 300, seed=3)
    gen = torch.Generator().manual_seed(4)
    resid = torch.randn(20, 12, generator=gen) * 3
    targets = torch.randint(0, 300, (20,), generator=gen)
    ref = reference_distribution(u, resid, targets, chunks=chunks)
    got = compare_distributions(u, resid[None], ref, chunks=chunks)
    assert torch.equal(got.kl[0], torch.zeros(20))
    assert torch.equal(got.loss[0], ref.loss)
    assert torch.allclose(got.entropy_bits[0], ref.entropy_bits.float(), atol=1e-6)
    assert got.agree.all()


@pytest.mark.parametrize("chunks", [None, LogitChunks(7, 50), LogitChunks(64, 1)],
                         ids=["whole", "ragged", "one-column"])
def test_blocked_neuron_moments_equal_scipys_on_the_whole_cosine_matrix(
        chunks: LogitChunks | None) -> None:
    """Neuron moments made block by block against scipy's population moments of the whole
    [neurons, vocab] cosine matrix in float64 (heavy tails, a far-off mean, a zero row)."""
    gen = torch.Generator().manual_seed(5)
    d_model, vocab, n = 64, 333, 20
    u = torch.randn(d_model, vocab, generator=gen)
    u = u / u.norm(dim=0, keepdim=True)
    w = torch.randn(n, d_model, generator=gen)
    w[3] = u[:, 0] * 5 + 0.01 * w[3]  # a neuron aligned with one token: large kurtosis
    w[4] = 0.0  # a dead neuron: constant cosines
    got = neuron_moments(w, u, chunks=chunks)
    w64 = w.double() - w.double().mean(-1, keepdim=True)
    cos = (w64 / w64.norm(dim=-1, keepdim=True).clamp_min(1e-12)) @ u.double()
    c = cos.numpy()
    want = np.stack([c.mean(1), c.var(1), scipy.stats.skew(c, axis=1),
                     scipy.stats.kurtosis(c, axis=1, fisher=False)])
    want[2:, 4] = 0.0  # zero variance: skew and kurtosis 0 by convention
    assert got[3, 3] > 10
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=1e-7)
