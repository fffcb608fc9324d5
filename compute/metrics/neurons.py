"""neurons.* — prediction / suppression / partition neurons from output weights (docs/metrics.md).

For each MLP neuron, the cosine between its output weight row (centered over d_model) and the
unembedding column of every real vocabulary token (W_U with the final-norm gain folded in,
centered over d_model and over the vocabulary; padding columns beyond the tokenizer excluded).
Moments over the vocabulary are population moments; kurtosis is non-excess (Gaussian = 3).

Two sets of classes are counted. The study's fixed cut-offs (`classify`) mean different things at
different widths: random directions in d_model dimensions give a cosine variance of about
1/d_model, so `partition` fires on nearly every neuron below d_model ~ 200. The width-calibrated
classes (`classify_calibrated`, the default for the dashboard and the stage rule) test each
neuron against the null distribution of the same moments of `NULL_DIRECTIONS` seeded random
directions of the model's d_model against its own unembedding (`null_thresholds`), so that random
weights give about 0 at any width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from compute.metrics.base import (
    EngineOptions,
    FamilyBase,
    FamilyOutput,
    NeuronTokens,
    logit_chunks,
)
from compute.models import LoadedModel
from compute.records import Record
from compute.reduce import LogitChunks, MeanAccumulator

KURTOSIS_THRESHOLD = 10.0
PARTITION_VARIANCE = 0.005
MOMENTS = ("vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt")
# The null of the width-calibrated classes: NULL_DIRECTIONS standard normal rows of d_model
# drawn by a torch.Generator seeded with NULL_SEED (on the CPU, float32), each processed as an
# output weight row, and the NULL_QUANTILE quantile (linear interpolation) of their moments.
NULL_DIRECTIONS = 4096
NULL_SEED = 0
NULL_QUANTILE = 0.999
FIXED_CLASSES = ("prediction", "suppression", "partition")
CALIBRATED_CLASSES = ("prediction_cal", "suppression_cal", "partition_cal")


def unembedding_directions(lm: LoadedModel) -> Float[Tensor, "d_model vocab"]:
    """Unit-norm, doubly centered unembedding columns of the real vocabulary (float32)."""
    w_u = lm.w_u()[:, : lm.d_vocab_real].float()
    w_u = w_u - w_u.mean(dim=0, keepdim=True)
    w_u = w_u - w_u.mean(dim=1, keepdim=True)
    return w_u / w_u.norm(dim=0, keepdim=True).clamp_min(1e-12)


def unit_rows(w_out: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
    """Each output weight row centered over d_model and scaled to unit norm (float32)."""
    w = w_out.float()
    w = w - w.mean(dim=-1, keepdim=True)
    return w / w.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def neuron_cosines(w_out: Float[Tensor, "n d_model"], u: Float[Tensor, "d_model vocab"]) -> Tensor:
    """Cosine of each (centered) output weight row with each unembedding direction."""
    return unit_rows(w_out) @ u


def neuron_moments(
    w_out: Float[Tensor, "n d_model"],
    u: Float[Tensor, "d_model vocab"],
    *,
    chunks: LogitChunks | None = None,
) -> Float[Tensor, "4 n"]:
    """Mean, variance, skew and non-excess kurtosis over the vocabulary of each neuron's
    cosines, without ever holding all of them: [rows, cols] blocks of cosines are made by one
    matmul each and reduced while in the cache (on a CPU a whole [rows, vocab] block streams
    through memory several times and took twice as long as its matmul).

    Deviations are taken from the mean computed up front (the mean over the vocabulary of
    w.u_v is w.mean(u_v): one matrix-vector product); per-block sums of their powers are
    float32, running sums float64, and the raw central-moment identities correct for what the
    float32 rounding of that mean left over. Zero variance gives skew 0 and kurtosis 0.
    """
    n_rows, vocab = w_out.shape[0], u.shape[1]
    chunks = chunks or LogitChunks(rows=n_rows, cols=vocab)
    f64 = torch.float64
    out = torch.empty(4, n_rows, dtype=f64, device=u.device)
    u_mean = sum(u[:, c : c + 4096].to(f64).sum(dim=1) for c in range(0, vocab, 4096)) / vocab
    for r0 in range(0, n_rows, chunks.rows):
        w = unit_rows(w_out[r0 : r0 + chunks.rows])
        mean = w.double() @ u_mean
        sums = torch.zeros(4, w.shape[0], dtype=f64, device=u.device)
        for c0 in range(0, vocab, chunks.cols):
            dev = torch.addmm(-mean.float()[:, None], w, u[:, c0 : c0 + chunks.cols])
            power = dev * dev
            sums[0] += dev.sum(dim=-1).to(f64)
            sums[1] += power.sum(dim=-1).to(f64)
            sums[2] += torch.linalg.vecdot(power, dev).to(f64)
            sums[3] += torch.linalg.vecdot(power, power).to(f64)
        shift, s2, s3, s4 = sums / vocab
        var = (s2 - shift**2).clamp_min(0.0)
        m3 = s3 - 3 * shift * s2 + 2 * shift**3
        m4 = s4 - 4 * shift * s3 + 6 * shift**2 * s2 - 3 * shift**4
        safe = var.clamp_min(1e-30)
        constant = var <= 0
        out[:, r0 : r0 + w.shape[0]] = torch.stack(
            [
                mean.float().double() + shift,
                var,
                torch.where(constant, 0.0, m3 / safe**1.5),
                torch.where(constant, 0.0, m4 / safe**2),
            ]
        )
    return out


def classify(moments: Float[Tensor, "4 n"]) -> dict[str, Tensor]:
    """Boolean masks of the three classes (partition is a flag that may coexist)."""
    _, var, skew, kurt = moments
    heavy = kurt > KURTOSIS_THRESHOLD
    return {
        "prediction": heavy & (skew > 0),
        "suppression": heavy & (skew < 0),
        "partition": var > PARTITION_VARIANCE,
    }


@dataclass(frozen=True)
class NullThresholds:
    """The null's NULL_QUANTILE quantiles: of vocab_kurt, of |vocab_skew| and of vocab_var."""

    kurt: float
    skew: float
    var: float
    n: int  # random directions the quantiles are over


def random_directions(
    d_model: int, n: int = NULL_DIRECTIONS, seed: int = NULL_SEED
) -> Float[Tensor, "n d_model"]:
    """`n` seeded standard normal rows of `d_model` (CPU, float32): the null's raw directions
    (`neuron_moments` centers them over d_model and scales them to unit norm, as it does w_out).

    >>> random_directions(8, n=2).shape
    torch.Size([2, 8])
    """
    return torch.randn(n, d_model, generator=torch.Generator().manual_seed(seed))


def null_moments(
    u: Float[Tensor, "d_model vocab"],
    *,
    n: int = NULL_DIRECTIONS,
    seed: int = NULL_SEED,
    chunks: LogitChunks | None = None,
) -> Float[Tensor, "4 n"]:
    """The vocabulary moments of `n` random directions against `u` (the same blocked code as the
    neurons' own moments)."""
    return neuron_moments(random_directions(u.shape[0], n, seed).to(u.device), u, chunks=chunks)


def null_thresholds(moments: Float[Tensor, "4 n"]) -> NullThresholds:
    """The NULL_QUANTILE quantiles (torch.quantile, linear interpolation) of a null's moments."""
    _, var, skew, kurt = moments.double().cpu()

    def q(x: Tensor) -> float:
        return float(torch.quantile(x, NULL_QUANTILE))

    return NullThresholds(kurt=q(kurt), skew=q(skew.abs()), var=q(var), n=moments.shape[1])


def classify_calibrated(moments: Float[Tensor, "4 n"], null: NullThresholds) -> dict[str, Tensor]:
    """Boolean masks of the width-calibrated classes (docs/metrics.md, neurons.*):
    prediction_cal: kurt > null kurt and skew > null |skew|; suppression_cal: kurt > null kurt
    and skew < -null |skew|; partition_cal: var > null var (a flag, may coexist)."""
    _, var, skew, kurt = moments
    heavy = kurt > null.kurt
    return {
        "prediction_cal": heavy & (skew > null.skew),
        "suppression_cal": heavy & (skew < -null.skew),
        "partition_cal": var > null.var,
    }


class NeuronsFamily(FamilyBase):
    name = "neurons"

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        return len(lm.mlp_layers)

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        if not lm.has_mlp:
            return FamilyOutput([])
        out = FamilyOutput([])
        vocab = lm.d_vocab_real
        with torch.inference_mode():
            u = unembedding_directions(lm)
            chunks = logit_chunks(lm, opts)
            null = null_thresholds(null_moments(u, chunks=chunks))
            self._null_records(out, null)
            for layer in lm.mlp_layers:
                w_out = lm.w_out(layer)
                moments = neuron_moments(w_out, u, chunks=chunks).cpu()
                self._layer_records(out, layer, moments, vocab, int(w_out.shape[0]), null)
                self._top_tokens(out, lm, layer, moments, w_out, u, opts)
                tick(1)
        return out

    @staticmethod
    def _null_records(out: FamilyOutput, null: NullThresholds) -> None:
        """One row each, `layer` null (the null depends on W_U and d_model, not on the layer)."""
        for name, value in (("kurt", null.kurt), ("skew", null.skew), ("var", null.var)):
            out.records.append(Record.of(f"neurons.null_{name}_q999", value, null.n))

    @staticmethod
    def _layer_records(
        out: FamilyOutput, layer: int, moments: Tensor, vocab: int, d_mlp: int, null: NullThresholds
    ) -> None:
        values = moments.tolist()
        for name, column in zip(MOMENTS, values, strict=True):
            out.records.extend(
                Record.of(f"neurons.{name}", v, vocab, layer=layer, neuron=i)
                for i, v in enumerate(column)
            )
        for cls, mask in {**classify(moments), **classify_calibrated(moments, null)}.items():
            count = int(mask.sum())
            out.records.append(Record.of(f"neurons.n_{cls}", count, d_mlp, layer=layer))
            out.records.append(Record.of(f"neurons.frac_{cls}", count / d_mlp, d_mlp, layer=layer))

    @staticmethod
    def _top_tokens(
        out: FamilyOutput,
        lm: LoadedModel,
        layer: int,
        moments: Tensor,
        w_out: Tensor,
        u: Tensor,
        opts: EngineOptions,
    ) -> None:
        if opts.top_neurons == 0:
            return
        kurt = moments[3]
        for cls, mask in classify(moments).items():
            candidates = mask.nonzero().squeeze(-1)
            if candidates.numel() == 0:
                continue
            order = kurt[candidates] if cls != "partition" else moments[1][candidates]
            chosen = candidates[order.argsort(descending=True)[: opts.top_neurons]].tolist()
            cos = neuron_cosines(w_out[chosen], u)
            k = min(opts.top_tokens, cos.shape[1])
            for direction, largest in (("promoted", True), ("suppressed", False)):
                vals, ids = cos.topk(k, dim=-1, largest=largest)
                for row, neuron in enumerate(chosen):
                    strings = lm.token_strings(ids[row].tolist())
                    out.neuron_tokens.extend(
                        NeuronTokens(layer, neuron, cls, direction, rank, int(tid), s, float(v))
                        for rank, (tid, s, v) in enumerate(
                            zip(ids[row].tolist(), strings, vals[row].tolist(), strict=True)
                        )
                    )
