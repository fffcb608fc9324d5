"""The parity report: evidence, measured at every load, that the model Strata runs is the model
the user gave it.

When a model comes from a Hugging Face checkpoint (a folder, a GGUF file, a zoo checkpoint, a
TransformerLens name whose original is a Hugging Face model), the Hugging Face model's own
float32 forward is run once on `PARITY_SEQUENCES` x `PARITY_SEQ_LEN` fixed token ids (seeded,
uniform over the tokenizer's real vocabulary, BOS first) while its weights are in memory anyway.
Strata's forward — the model layer's own `embed`, `run_block` and `logits`, on whichever path
its blocks take — is then run on the same ids:

- `max_abs_logprob_diff`: the largest |Δ log-probability| over every position and vocabulary
  entry, Strata float32 against Hugging Face float32 (nats);
- `kl_to_reference`: the mean over positions of KL(Hugging Face || Strata), both float32
  (nats) — the unit every distribution metric is in.

Above either tolerance (`PARITY_TOLERANCE` for the first, `PARITY_KL_TOLERANCE` for the second)
the model is refused (`ParityError`): a run on it would measure another model. The two are set
from measurements: float32 rounding alone gives SmolLM2-135M (30 layers, 49k vocabulary) a max
|Δ| of 6.6e-5 nats on these 2 x 32 ids (1.3e-3 on 2 x 64, all of it in the far tail: a token
at log p = -20) with a KL of 2.5e-11 (7e-10); the
two mismatches this check was built to catch (LayerNorm folded into OLMo-3's post-norm blocks,
value biases folded under GPT-OSS's attention sinks) give KLs of 1.4 and 0.06 on the matrix's
tiny models and max |Δ| of 9.0 and 3.9.
- at a run dtype other than float32 (bfloat16, float16), the noise floor: the mean over
  positions of KL(Strata float32 || Strata at the run dtype), in nats, and the largest
  |Δ log-probability| at the run dtype against Hugging Face's float32. Differences between
  interventions smaller than this floor are rounding, not the model.

The report is stored with the registered model, served with it and carried in every run's
metadata (docs/metrics.md, "Parity").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor

from compute.errors import ParityError


class LoadedModel(Protocol):
    """What parity needs of `compute.models.loaded.LoadedModel` (named here, not imported:
    the loaded model imports this module)."""

    spec: Any
    device: str

    @property
    def n_layers(self) -> int: ...
    @property
    def block_path(self) -> str: ...
    def embed(self, tokens: Tensor) -> Tensor: ...
    def run_block(self, layer: int, resid: Tensor) -> Any: ...
    def logits(self, resid: Tensor) -> Tensor: ...


PARITY_TOLERANCE = 1e-2  # nats: max |Δ log p| of Strata's float32 forward against Hugging Face's
PARITY_KL_TOLERANCE = 1e-6  # nats: mean KL(Hugging Face || Strata), both float32
PARITY_SEQUENCES = 2
PARITY_SEQ_LEN = 32  # positions: the check costs two forwards of 2 x 32 tokens at every load
PARITY_SEED = 20261202


@dataclass(frozen=True)
class ParityReference:
    """The Hugging Face model's float32 log-probabilities on the parity tokens."""

    tokens: Int[Tensor, "seq pos"]
    log_probs: Float[Tensor, "seq pos vocab"]  # float64, on the CPU


@dataclass(frozen=True)
class ParityReport:
    """What was measured; `reference` is None where the model has no Hugging Face original
    (planted controls, random weights), with the reason in `note`."""

    reference: str | None
    dtype: str
    tolerance: float
    tokens: int
    block_paths: tuple[str, ...]
    max_abs_logprob_diff: float | None = None
    kl_to_reference: float | None = None
    kl_tolerance: float = PARITY_KL_TOLERANCE
    noise_floor_kl: float | None = None
    noise_floor_max_abs_logprob_diff: float | None = None
    note: str = ""
    # A model split over devices (`compute.placement`): where its pieces are, and its
    # forward's largest |Δ log p| against the same weights' on the host; None on one device.
    placement: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        if self.max_abs_logprob_diff is None or self.kl_to_reference is None:
            return True  # nothing to compare with (see `reference` and `note`)
        return (
            self.max_abs_logprob_diff <= self.tolerance
            and self.kl_to_reference <= self.kl_tolerance
        )

    def as_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "block_paths": list(self.block_paths), "passed": self.passed}
        if self.placement is None:  # on one device, as every report before splitting
            del out["placement"]
        return out


def parity_tokens(d_vocab_real: int, bos_token_id: int, n_ctx: int) -> Int[Tensor, "seq pos"]:
    """The fixed token ids every parity check runs on."""
    gen = torch.Generator().manual_seed(PARITY_SEED)
    seq_len = min(PARITY_SEQ_LEN, n_ctx)
    tokens = torch.randint(0, d_vocab_real, (PARITY_SEQUENCES, seq_len), generator=gen)
    tokens[:, 0] = bos_token_id
    return tokens


def hugging_face_reference(hf_model: Any, tokens: Tensor) -> ParityReference:
    """Run the Hugging Face model's own float32 forward on `tokens`."""
    with torch.inference_mode():
        logits = hf_model(tokens.to(hf_model.device)).logits
    return ParityReference(tokens, logits.double().log_softmax(-1).cpu())


def strata_log_probs(lm: LoadedModel, tokens: Tensor) -> Float[Tensor, "seq pos vocab"]:
    """Strata's clean forward (the model layer's own operations), as float64 log-probs."""
    with torch.inference_mode():
        resid = lm.embed(tokens.to(lm.device))
        for layer in range(lm.n_layers):
            resid = lm.run_block(layer, resid).resid
        return lm.logits(resid).double().log_softmax(-1).cpu()


def block_paths(lm: LoadedModel) -> tuple[str, ...]:
    return (lm.block_path,) * lm.n_layers


def _max_diff(ours: Tensor, theirs: Tensor) -> float:
    vocab = min(ours.shape[-1], theirs.shape[-1])
    return float((ours[..., :vocab] - theirs[..., :vocab]).abs().max())


def float32_parity(lm: LoadedModel, reference: ParityReference) -> tuple[float, float, Tensor]:
    """Max |Δ log p| and mean KL(reference || `lm`) of `lm` (float32), and `lm`'s log-probs."""
    ours = strata_log_probs(lm, reference.tokens)
    vocab = min(ours.shape[-1], reference.log_probs.shape[-1])
    return (
        _max_diff(ours, reference.log_probs),
        mean_kl(reference.log_probs[..., :vocab], ours[..., :vocab]),
        ours,
    )


def mean_kl(p_log_probs: Tensor, q_log_probs: Tensor) -> float:
    """Mean over positions of KL(p || q), nats (float64 log-probabilities)."""
    kl = (p_log_probs.exp() * (p_log_probs - q_log_probs)).sum(-1)
    return float(kl.mean())


def no_reference(lm: LoadedModel, why: str) -> ParityReport:
    return ParityReport(None, lm.spec.dtype, PARITY_TOLERANCE, 0, block_paths(lm), note=why)


def check(report: ParityReport, name: str, architecture: str) -> None:
    """Refuse a model whose float32 forward is not Hugging Face's."""
    if not report.passed:
        raise ParityError(
            f"{name} ({architecture}): Strata's forward differs from the Hugging Face "
            f"model's by {report.max_abs_logprob_diff:.3g} nats of log-probability at most "
            f"(tolerance {report.tolerance:g}), a mean KL of {report.kl_to_reference:.3g} nats "
            f"(tolerance {report.kl_tolerance:g}), on {report.tokens} tokens, on the "
            f"{report.block_paths[0] if report.block_paths else '?'} blocks: a run would "
            "measure another model, so it is refused. Run `strata models check` for the "
            "report; the supported architectures are listed in docs/architectures.md",
            report.as_dict(),
        )
