"""Training a tuned lens: the model frozen, one affine translator per point, fitted to minimise
KL(final || lens) summed over points, on the training split of the run's token source.

The recipe is the tuned-lens package's (Belrose et al. 2023, `tuned_lens/scripts/train_loop.py`
and `ingredients.py`): translators start at zero (the identity map, h + 0), SGD with Nesterov
momentum 0.9 at lr 1.0 x (1 - momentum) (PyTorch's momentum scales the step by 1 / (1 - beta);
the package undoes that), weight decay 1e-3, no warm-up for SGD and a linear decay to 0 over the
steps, the gradient clipped to norm 1 over all translators, each point's KL a mean over tokens
and the points summed (backward one point at a time: the translators are independent, so this
is the summed loss's gradient without holding every point's logits at once). The target is the
final distribution at the same position. The package steps 250 times on 2^18 tokens on GPUs;
the default here steps 250 times on 8 sequences (8 x (seq_len - 2) evaluated tokens: 1,008 at
seq_len 128) drawn, seeded, from 256 training sequences (32,256 evaluated tokens, each seen
about 8 times). Left out: the package's projection of each translator after every step
(`normalize_`, which centres them for LayerNorm models; it is a no-op on the loss).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from compute.engine import Progress, ProgressFn
from compute.errors import ComputeError
from compute.lens.config import LensTraining
from compute.memory import allocator_for_sweeping
from compute.models import LoadedModel


def lr_factor(step: int, config: LensTraining) -> float:
    """The schedule: linear warm-up over `warmup_steps`, then linear decay to 0 at `steps`."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    return max(0.0, (config.steps - step) / max(1, config.steps - config.warmup_steps))


def batch_order(n_sequences: int, config: LensTraining) -> list[Tensor]:
    """Which training sequences each step uses: seeded permutations of the split, one after the
    other (an epoch), cut into batches of `sequences_per_step`."""
    generator = torch.Generator().manual_seed(config.seed)
    per = min(config.sequences_per_step, n_sequences)
    stream: list[int] = []
    while len(stream) < config.steps * per:
        stream += torch.randperm(n_sequences, generator=generator).tolist()
    return [torch.tensor(stream[s * per : (s + 1) * per]) for s in range(config.steps)]


def residuals(lm: LoadedModel, tokens: Int[Tensor, "b pos"]) -> list[Tensor]:
    """The clean residual stream at points 0..L (the model frozen, no graph)."""
    with torch.no_grad():
        resid = [lm.embed(tokens)]
        for layer in range(lm.n_layers):
            resid.append(lm.run_block(layer, resid[-1]).resid)
    return resid


def final_terms(final_logp: Tensor) -> tuple[Tensor, Tensor]:
    """What every point's KL to the final distribution shares: p = exp(log p) [n, vocab] and
    sum_v p log p per row [n] (made once a step, not once a point)."""
    p = final_logp.exp()
    return p, (p * final_logp).sum(-1)


def point_kl(
    lm: LoadedModel,
    weight: Tensor,
    bias: Tensor,
    point: int,
    h: Tensor,
    final_logp: Tensor,
    terms: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Mean over tokens of KL(final || lens at `point`) = sum p log p - sum p log q,
    differentiable in the translator. `h`: [n, d_model] residuals at the point; `final_logp`:
    [n, vocab] float32 log-probs; `terms`: its `final_terms`, if already made."""
    p, p_logp = terms if terms is not None else final_terms(final_logp)
    x = h.float()
    translated = x + torch.addmm(bias[point], x, weight[point].T)
    logq = torch.log_softmax(lm.logits(translated.to(h.dtype)).float(), dim=-1)
    return (p_logp - (p * logq).sum(-1)).mean()


def train_translators(
    lm: LoadedModel,
    tokens: Int[Tensor, "n seq_len"],
    config: LensTraining,
    progress: ProgressFn | None = None,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Fit translators for points 0..L-1 on `tokens` (the training split). Returns the weights
    [L, d, d], biases [L, d] and a report of the budget used (steps, tokens) and the loss."""
    n_layers, d = lm.n_layers, lm.d_model
    device = lm.device
    weight = torch.zeros(n_layers, d, d, device=device, requires_grad=True)
    bias = torch.zeros(n_layers, d, device=device, requires_grad=True)
    optimizer = torch.optim.SGD(
        [weight, bias],
        lr=config.lr * (1 - config.momentum),
        momentum=config.momentum,
        nesterov=config.momentum > 0,
        weight_decay=config.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))
    batches = batch_order(tokens.shape[0], config)
    allocator_for_sweeping()  # each step frees and makes again the same [rows, vocab] blocks
    per_token = tokens.shape[1] - 2  # evaluated positions 1..T-2, as every metric
    losses: list[float] = []
    start = time.perf_counter()
    seen = 0
    for step, rows in enumerate(batches):
        chunk = tokens[rows].to(device)
        resid = residuals(lm, chunk)
        with torch.no_grad():
            final = resid[n_layers][:, 1:-1].reshape(-1, d)
            final_logp = torch.log_softmax(lm.logits(final).float(), dim=-1)
            terms = final_terms(final_logp)
        total = 0.0
        for point in range(n_layers):
            h = resid[point][:, 1:-1].reshape(-1, d)
            loss = point_kl(lm, weight, bias, point, h, final_logp, terms)
            loss.backward()
            total += float(loss.detach())
        if not torch.isfinite(torch.tensor(total)):
            raise ComputeError(f"tuned lens training diverged at step {step}: loss {total}")
        torch.nn.utils.clip_grad_norm_([weight, bias], config.clip_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        schedule.step()
        losses.append(total)
        seen += chunk.shape[0] * per_token
        if progress is not None:
            elapsed = time.perf_counter() - start
            progress(Progress(step + 1, config.steps, seen, seen / max(elapsed, 1e-9), elapsed))
    wall = time.perf_counter() - start
    tail = losses[-min(10, len(losses)) :]
    report = {
        "steps": config.steps,
        "tokens_per_step": min(config.sequences_per_step, tokens.shape[0]) * per_token,
        "tokens_seen": seen,
        "train_sequences": int(tokens.shape[0]),
        "train_tokens": int(tokens.shape[0]) * per_token,
        "seq_len": int(tokens.shape[1]),
        "loss_first_step": losses[0],
        "loss_last_steps": sum(tail) / len(tail),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(seen / max(wall, 1e-9), 1),
        "device": str(device),
        "dtype": lm.spec.dtype,
    }
    return weight.detach(), bias.detach(), report
