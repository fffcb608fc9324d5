"""heads_screen.* — every head screened, then the screen's top k heads ablated exactly.

`heads.ablation_loss_delta` zeroes one head's z and reruns everything after it (H x L
downstream passes, each with its unembedding); `heads_atp` linearises the whole model around
the clean pass at the head's z. This screen keeps exact what is cheap to compute exactly,
takes what follows to second order, and then measures the heads it ranks highest:

1. **The block, exactly.** For block l and head h, the residual after the block with h's z
   zeroed, r_h = `heads.ablated_block_output` (the function the exact family uses): the head's
   term removed from the attention write, then whatever the block does after it — the MLP
   that reads the changed residual and, on models with a norm after attention (Gemma 2/3,
   OLMo 2/3), that norm, which rescales the remaining heads' writes when one is zeroed. On the
   fused blocks this is one MLP per head; on blocks whose write is not linear in z, one block.

2. **What follows, to second order.** With F_l the summed next-token loss over the evaluated
   positions as a function of the residual after block l and d = r_h - r, the loss delta is
   the integral of dF_l/dr . d along the head's own line from r to r_h (integrated gradients).
   Taking the integrand linear in the position on the line gives

       F_l(r_h) - F_l(r)  ~  g . d  +  1/2 d' H d

   g = dF_l/dr at the clean model (one backward for every block at once), H approximated by
   the Gauss-Newton matrix J' (diag p - p p') J (J the logits' Jacobian, p the model's
   distribution), whose form along d is estimated from `screen_samples` = m sets of targets y
   drawn at every position from p: d' G d = E_y[(d . d(sum log p(y))/dr)^2], the positions'
   cross terms having mean zero. One backward per draw serves every head; the draws are
   seeded per sequence (`SCREEN_SEED` + its index in the run). Divided by the sequence's T-2
   evaluated positions, the estimate is of the sequence's mean loss delta, as the exact number
   is.

   Why second order: a trained model sits near a minimum of its loss along the directions its
   heads write, so the first-order term of an important head is often near zero while the
   loss rises quadratically along its line. Measured on Gemma 3 270M (one sequence, the
   integrand at 8 points of the line of heads 7.1, 5.1, 7.0, 3.0): the first-order terms
   0.093, 0.005, 0.000, 0.029 nats against exact deltas 0.546, 0.152, 0.212, 0.150, the
   integrand growing about linearly along the line; g . d + 1/2 d' G d (G exact, by finite
   differences) for head 7.1: 0.535. Per-head integrated gradients with S points would cost S
   downstream passes per head — S times the exact ablation it estimates.

   `screen_steps` (default 1) instead averages g over S points of the path on which every
   head of every block has its z scaled by 1 - alpha, alpha = 0, 1/S, .., (S-1)/S (EAP-IG's
   path, Hanna et al. 2024, for all components at once), S forwards with gradients shared by
   all heads. Measured, it ranked worse (docs/performance.md, "The head screen against exact
   ablation": Spearman 0.75 at S = 1 to 0.35 at S = 8 on SmolLM2-135M), and on Gemma 3 it
   changes nothing: a norm after attention undoes a common scale of a block's heads. It is
   kept as a setting, off by default.

3. **Calibrated by exact ablation on a few sequences.** Every head is ablated exactly on the
   run's first c = `screen_calibration` sequences, and each head's estimate is corrected by its
   mean error there: value = mean over the N sequences of the estimate + mean over the c of
   (exact - estimate), a difference estimator (two-phase sampling; the estimate serves as a
   control variate for the exact number). It is unbiased for the head's mean exact loss delta
   over the run whatever the estimate's bias, where the second-order estimate is biased by
   construction: its Gauss-Newton term is never negative, so it overestimates heads whose
   block output changes much while the loss barely does. Costs c sequences of exact `heads`.
   Off by default (c = 0): at the registered default c = 2 it lowered Spearman against exact
   `heads` on SmolLM2-135M (0.797 to 0.731) and Gemma 3 270M (0.840 to 0.833): the screen's
   error is large on a few heads and small on most, and two sequences' estimate of it adds more
   noise to most heads than it removes (docs/performance.md).

4. **The top k, exactly.** After every batch is screened, the k heads with the largest
   (calibrated) estimate (`screen_top_k`) are ablated exactly by `heads.head_ablations` — the
   implementation of `heads.ablation_*`, called, not copied — on every batch again (its clean
   pass recomputed from the tokens the screen kept): `heads_screen.ablation_loss_delta` and
   `heads_screen.ablation_kl` are those heads' exact numbers, so the heads a user acts on are
   measured, not estimated.

AtP*'s fixes (Kramár et al. 2024), where they apply: the QK fix computes exactly the part of a
patch that passes through a softmax it would otherwise linearise; zeroing z changes no pattern
of its own block, and step 1 is the same idea for the nonlinear parts this intervention does
pass through locally (the norm after attention, the block's MLP). GradDrop (one backward per
block with that block's gradient path dropped, against cancellation between paths) costs L
backward passes and is not implemented: the calibration and the exact top k are the screen's
safeguards instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from compute.memory import ModelDims, screen_bytes_per_sequence
from compute.metrics.base import BatchContext, EngineOptions, FamilyBase, FamilyOutput
from compute.metrics.heads import ablated_block_output, add_head_ablations, head_groups
from compute.metrics.heads_atp import graph_sequences, loss_gradient
from compute.models import LoadedModel
from compute.records import Record
from compute.reduce import MeanAccumulator


class ScreenAccumulator(MeanAccumulator):
    """The screen's state for one run: its running means, and the batches it saw (first
    sequence, tokens), on which the calibration and the exact top k run in `finish`, once the
    screen's estimates over every batch are known."""

    def __init__(self, device: torch.device | str = "cpu", n_sequences: int = 0) -> None:
        super().__init__(device, n_sequences)
        self.seen: list[tuple[int, Tensor]] = []


@dataclass
class Calibrated:
    """Per head (layer, head): the calibrated estimate of its mean loss delta and its standard
    error (None where it cannot be estimated: fewer than two calibration sequences)."""

    value: dict[tuple[int, int], float]
    stderr: dict[tuple[int, int], float | None]


# The draws of the curvature term are seeded per sequence: SCREEN_SEED + its index in the run.
SCREEN_SEED = 0


def path_points(steps: int) -> list[float]:
    """alpha_1..alpha_S = 0, 1/S, .., (S-1)/S: each head's z is scaled by 1 - alpha."""
    return [i / steps for i in range(steps)]


@dataclass
class Gradients:
    """Per attention block l, gradients with respect to the residual after block l, float32:
    `mean`, of the summed next-token loss F averaged over the path points, [b, pos, d]; and
    `sampled`, of the summed log-likelihood of targets drawn from the clean model's own
    distribution, one per draw, [m, b, pos, d] (none when m = 0)."""

    mean: list[Tensor]
    sampled: list[Tensor]


def residual_gradients(
    lm: LoadedModel,
    tokens: Tensor,
    embedded: Tensor,
    alphas: list[float],
    opts: EngineOptions,
    *,
    samples: int = 0,
    first_sequence: int = 0,
) -> Gradients:
    """`Gradients` of the batch (sequence indices from `first_sequence`, which seed the draws),
    as many sequences at a time as the batch's memory budget holds at
    `compute.memory.screen_bytes_per_sequence`."""
    per_sequence = screen_bytes_per_sequence(
        ModelDims.of(lm), tokens.shape[1], lm.dtype_bytes, samples
    )
    part = graph_sequences(lm, tokens.shape[1], opts, per_sequence)
    done = [
        _gradients_part(
            lm,
            tokens[first : first + part],
            embedded[first : first + part],
            alphas,
            opts,
            samples,
            first_sequence + first,
        )
        for first in range(0, tokens.shape[0], part)
    ]
    return Gradients(
        [torch.cat([d.mean[i] for d in done], 0) for i in range(len(done[0].mean))],
        [torch.cat([d.sampled[i] for d in done], 1) for i in range(len(done[0].sampled))],
    )


def target_draws(lm: LoadedModel, n_positions: int, samples: int, first: int, n: int) -> Tensor:
    """Uniform numbers that draw `samples` targets at each evaluated position of sequences
    first .. first+n-1: [n * n_positions, samples], each sequence's from its own generator
    (seeded by `SCREEN_SEED` and its index in the run), so that the draws do not depend on
    how the run is cut into batches."""
    draws = [
        torch.rand(n_positions, samples, generator=torch.Generator().manual_seed(SCREEN_SEED + i))
        for i in range(first, first + n)
    ]
    return torch.cat(draws, 0).to(lm.device)


def sampled_gradients(
    lm: LoadedModel, final: Tensor, uniforms: Tensor, rows: int
) -> Float[Tensor, "m n d_model"]:
    """d(sum over positions of log p(y))/d(final residual) for each column of draws: y drawn
    at every position from the clean model's own distribution p by inverse transform of
    `uniforms` [n, m]. The logits are made once per row block. Where they are x W_U + b_U
    (`LoadedModel.logits_are_linear`) the derivative with respect to the normed residual is
    W_U[:, y] - W_U p: one product with W_U for every draw together, each draw a column
    lookup and a backward through the final norm; otherwise each draw is a backward through
    the unembedding (and its soft-cap)."""
    m = uniforms.shape[1]
    out = torch.empty(m, *final.shape, dtype=torch.float32, device=final.device)
    linear = lm.logits_are_linear
    for start in range(0, final.shape[0], rows):
        block = slice(start, start + rows)
        x = final[block].detach().requires_grad_()
        normed = lm.normed(x)
        source = normed.detach() if linear else normed
        logp = lm.logit_columns(source, 0, lm.d_vocab).float().log_softmax(-1)
        with torch.no_grad():
            p = logp.double().exp()
            cdf = p.cumsum(-1)
            y = torch.searchsorted(cdf, uniforms[block].double() * cdf[:, -1:])
            y = y.clamp(max=lm.d_vocab - 1)
            if linear:
                w_u = lm.w_u()
                expected = lm.pulled_back(p.to(w_u.dtype), 0, lm.d_vocab)[0]  # W_U p
            del p, cdf
        for j in range(m):
            last = j == m - 1
            if linear:
                along = w_u[:, y[:, j]].T - expected  # d log p(y) / d normed
                (grad,) = torch.autograd.grad(normed, x, along, retain_graph=not last)
            else:
                chosen = logp.gather(1, y[:, j : j + 1]).sum()
                (grad,) = torch.autograd.grad(chosen, x, retain_graph=not last)
            out[j, block] = grad.float()
    return out


def _gradients_part(
    lm: LoadedModel,
    tokens: Tensor,
    embedded: Tensor,
    alphas: list[float],
    opts: EngineOptions,
    samples: int,
    first: int,
) -> Gradients:
    rows = max(1, opts.logits_budget_mb * 2**20 // (3 * 4 * lm.d_vocab))
    attention = lm.attention_layers
    b, t = tokens.shape
    sums: list[Tensor] = []
    sampled: list[Tensor] = []
    for alpha in alphas:
        with torch.inference_mode(False), torch.enable_grad():
            resid = embedded.clone().requires_grad_()  # a normal tensor: the graph's input
            points = []
            for layer in range(lm.n_layers):
                mask = None
                if alpha and layer in attention:
                    heads = lm.layers[layer].heads
                    assert heads is not None
                    mask = torch.full((b, heads.n_heads), 1.0 - alpha, device=resid.device)
                resid = lm.run_block(layer, resid, head_mask=mask).resid
                if layer in attention:
                    points.append(resid)
            final = resid[:, 1:-1].reshape(-1, lm.d_model)
            if alpha == 0 and samples:  # the curvature term, at the clean model
                uniforms = target_draws(lm, t - 2, samples, first, b)
                per_draw = sampled_gradients(lm, final, uniforms, rows)
                draws = [
                    torch.autograd.grad(final, points, grad_outputs=g, retain_graph=True)
                    for g in per_draw
                ]
                sampled = [
                    torch.stack([d[i].detach().float() for d in draws]) for i in range(len(points))
                ]
                del draws, per_draw
            # a normal tensor: cross-entropy saves its targets for the backward
            targets = tokens[:, 2:].reshape(-1).clone()
            grad_final = loss_gradient(lm, final, targets, rows)
            grads = torch.autograd.grad(final, points, grad_outputs=grad_final)
        if not sums:
            sums = [g.detach().float() for g in grads]
        else:
            for total, g in zip(sums, grads, strict=True):
                total += g.detach().float()
    return Gradients([total / len(alphas) for total in sums], sampled)


def screen_loss_delta(
    ctx: BatchContext, opts: EngineOptions, first_sequence: int = 0
) -> list[Float[Tensor, "head batch"]]:
    """Per attention block, head and sequence of the batch: the screen's estimate of the mean
    loss delta (nats) when the head's z is zeroed (module docstring). `first_sequence`: the
    batch's first sequence's index in the run (it seeds the draws)."""
    if not ctx.lm.attention_layers:
        return []  # no heads (a state-space model): nothing to screen
    alphas = path_points(opts.screen_steps)
    grads = residual_gradients(
        ctx.lm,
        ctx.tokens,
        ctx.resid[0],
        alphas,
        opts,
        samples=opts.screen_samples,
        first_sequence=first_sequence,
    )
    return estimates_from_gradients(ctx, grads, opts)


def estimates_from_gradients(
    ctx: BatchContext, grads: Gradients, opts: EngineOptions
) -> list[Float[Tensor, "head batch"]]:
    """Per attention block, head and sequence, over the evaluated positions' count:
    (r_h - r) . mean gradient, plus half the mean over draws of ((r_h - r) . sampled
    gradient)^2 (the Gauss-Newton curvature along r_h - r); r_h the exact residual after the
    block with head h's z zeroed."""
    lm = ctx.lm
    b, t = ctx.tokens.shape
    out = []
    for index, layer in enumerate(lm.attention_layers):
        grad = grads.mean[index]
        sampled = grads.sampled[index] if grads.sampled else None
        heads = lm.layers[layer].heads
        assert heads is not None
        per_group = []
        for group in head_groups(ctx, list(range(heads.n_heads)), opts):
            after = ablated_block_output(ctx, layer, group).unflatten(0, (len(group), b))
            delta = after.float() - ctx.resid[layer + 1].float()[None]
            estimate = (delta * grad[None]).sum(dim=(2, 3))  # [g, b]
            if sampled is not None:
                along = torch.einsum("gbpd,mbpd->gmb", delta, sampled)
                estimate = estimate + 0.5 * along.square().mean(1)
            per_group.append(estimate / (t - 2))
        out.append(torch.cat(per_group, 0))
    return out


def top_heads(
    acc: MeanAccumulator, k: int, calibrated: Calibrated | None = None
) -> list[tuple[int, int]]:
    """The k (layer, head) of largest estimate — the calibrated one where there is one, else
    the screen's mean (ties: the lower layer, head)."""
    if calibrated is not None:
        scored = [(-value, layer, head) for (layer, head), value in calibrated.value.items()]
    else:
        scored = [
            (-stat.value, int(str(key[1])), int(str(key[2])))
            for key, stat in acc.results().items()
            if key[0] == "loss_delta"
        ]
    return [(layer, head) for _, layer, head in sorted(scored)[:k]]


def ablate_exactly(
    lm: LoadedModel,
    acc: MeanAccumulator,
    batches: list[tuple[int, Tensor]],
    by_layer: dict[int, list[int]],
    opts: EngineOptions,
    tick: Callable[[int], None],
) -> None:
    """The exact ablation of `by_layer`'s heads (block -> heads) on each kept batch (first
    sequence, tokens), its clean pass made again, added to `acc`: what the calibration and the
    exact top k measure. A progress unit per head, counted at the last batch."""
    if not by_layer:
        return
    for index, (first, tokens) in enumerate(batches):
        ctx = clean_context(lm, tokens, opts)
        acc.start_batch(first, tokens.shape[0])
        for layer, heads in by_layer.items():
            add_head_ablations(ctx, acc, layer, heads, opts)
            if index == len(batches) - 1:
                tick(len(heads))
        del ctx


def calibration_batches(seen: list[tuple[int, Tensor]], c: int) -> list[tuple[int, Tensor]]:
    """The run's first c sequences (fewer if the run has fewer), as the batches the run cut
    them in (first sequence, tokens): batches sized for the run's memory budget."""
    return [
        (first, tokens[: c - first])
        for first, tokens in sorted(seen, key=lambda x: x[0])
        if first < c
    ]


def calibrate(
    lm: LoadedModel,
    acc: MeanAccumulator,
    seen: list[tuple[int, Tensor]],
    opts: EngineOptions,
    tick: Callable[[int], None],
) -> Calibrated:
    """Every head ablated exactly (`heads.head_ablations`, through `add_head_ablations`) on the
    run's first c = `screen_calibration` sequences, and each head's estimate corrected by its
    mean error there (a difference estimator; module docstring, step 3):

        value_h = mean over all N sequences of s_h  +  mean over the c of (e_h - s_h)

    s the screen's per-sequence estimate, e the exact loss delta. Unbiased for the head's mean
    exact loss delta over the run's sequences when the c are a sample of them (the built-in
    corpus draws its windows at random). Its variance, the c being among the N, is
    Var(s)/N + Var(e - s)/c + 2 Cov(s, e - s)/N: the stderr is its square root, Var(s) over the
    N sequences, the other two over the c (none for c < 2; at least 0)."""
    batches = calibration_batches(seen, opts.screen_calibration)
    c = sum(tokens.shape[0] for _, tokens in batches)
    exact = MeanAccumulator(lm.device, c)
    every_head = {}
    for layer in lm.attention_layers:
        heads = lm.layers[layer].heads
        assert heads is not None
        every_head[layer] = list(range(heads.n_heads))
    ablate_exactly(lm, exact, batches, every_head, opts, tick)
    e_keys, e_means, _ = exact.sequence_means()  # [c, keys]
    s_keys, s_means, s_has = acc.sequence_means()  # [N, keys]
    s_slot = {key: i for i, key in enumerate(s_keys) if key[0] == "loss_delta"}
    value: dict[tuple[int, int], float] = {}
    stderr: dict[tuple[int, int], float | None] = {}
    for j, key in enumerate(e_keys):
        if key[0] != "ablation_loss_delta":
            continue
        layer, head = int(str(key[1])), int(str(key[2]))
        i = s_slot[("loss_delta", layer, head)]
        screen = s_means[s_has[:, i], i]
        error = e_means[:, j] - s_means[:c, i]
        value[(layer, head)] = float(screen.mean() + error.mean())
        if c > 1 and len(screen) > 1:
            both = np.cov(s_means[:c, i], error)  # ddof 1
            variance = (
                screen.var(ddof=1) / len(screen) + both[1, 1] / c + 2 * both[0, 1] / len(screen)
            )
            stderr[(layer, head)] = float(np.sqrt(max(variance, 0.0)))
        else:
            stderr[(layer, head)] = None
    return Calibrated(value, stderr)


class HeadsScreenFamily(FamilyBase):
    name = "heads_screen"
    needs_z = True  # the exact block output subtracts one head's write from the cached one
    key_fields = ("metric", "layer", "head")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 1

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        """A unit per head of the exact top k, and per head of the calibration."""
        kinds = [lm.layers[layer].heads for layer in lm.attention_layers]
        n_heads = sum(k.n_heads for k in kinds if k is not None)
        return min(opts.screen_top_k, n_heads) + (n_heads if opts.screen_calibration else 0)

    def accumulator(self, device: torch.device | str, n_sequences: int) -> ScreenAccumulator:
        return ScreenAccumulator(device, n_sequences)

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        assert isinstance(acc, ScreenAccumulator)  # made by `accumulator`, for this run
        assert acc.batch is not None  # the engine's start_batch for this batch
        estimates = screen_loss_delta(ctx, opts, acc.batch[0])  # per attention block: [H, b]
        for layer, estimate in zip(ctx.lm.attention_layers, estimates, strict=True):
            acc.add_many([("loss_delta", layer, h) for h in range(estimate.shape[0])], estimate)
        if (opts.screen_top_k or opts.screen_calibration) and estimates:
            acc.seen.append((acc.batch[0], ctx.tokens))
        ctx.tick(1)

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        assert isinstance(acc, ScreenAccumulator)
        seen, acc.seen = acc.seen, []
        calibrated = (
            calibrate(lm, acc, seen, opts, tick) if seen and opts.screen_calibration else None
        )
        chosen = top_heads(acc, opts.screen_top_k, calibrated) if seen else []
        by_layer: dict[int, list[int]] = {}
        for layer, head in sorted(chosen):
            by_layer.setdefault(layer, []).append(head)
        ablate_exactly(lm, acc, seen, by_layer, opts, tick)
        out = super().finish(lm, acc, opts, tick)
        if calibrated is None:
            return out
        records = [
            Record.of(
                r.metric,
                calibrated.value[(r.layer, r.head)],
                r.n,
                layer=r.layer,
                head=r.head,
                stderr=calibrated.stderr[(r.layer, r.head)],
            )
            if r.metric == "heads_screen.loss_delta" and r.layer is not None and r.head is not None
            else r
            for r in out.records
        ]
        return dataclasses.replace(out, records=records)


def clean_context(lm: LoadedModel, tokens: Tensor, opts: EngineOptions) -> BatchContext:
    """The batch's clean pass again, with each head's z (the screen kept its tokens, not its
    activations); benchmarks/head_screen.py makes its batches' passes with it too."""
    from compute.engine import clean_pass  # the engine imports the families
    from compute.metrics.base import logit_chunks

    return clean_pass(lm, tokens, False, logit_chunks(lm, opts), lambda _: None, capture_z=True)
