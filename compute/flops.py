"""Dense FLOPs of each family, as a formula of the model's dimensions (docs/performance.md).

Counted: the matrix multiplications the engine asks for (2 FLOPs per multiply-add) — the block
projections, attention scores and mixing, the MLP and the unembedding. Softmax, norms, KL and the
other reductions are memory-bound elementwise work and count as zero. Per sequence of T tokens
(blocks run on all T positions, the unembedding on the T-2 evaluated ones):

    A   = 2T(4 d hd) + 4 T^2 hd        attention of one block (QKV + output, scores + mixing);
                                       grouped-query attention projects K and V to kv_hd only:
                                       2T d (2 hd + 2 kv_hd) + 4 T^2 hd
    M   = 4T d d_mlp (6T d d_mlp gated) MLP of one block
    B   = A + M                        one block
    U   = 2 (T-2) d V                  one unembedding of the evaluated positions
    O_h = 2 T d_head d                 one head's write (its z through its rows of W_O)

    clean pass    L B + U
    intervention  (2L^2 - L - 1) B + L M + (4L - 1) U      [-U when logit_lens runs too: drop of
                  the last block is lens point L-1]
    logit_lens    L U
    similarity    (L-1) B                                  [0 when intervention runs too: it
                  is the first half of each swap, computed once for both]
    heads         H (L M + L(L-1)/2 B + L U) + L H O_h      [+ induction: L B on its own tokens]
    heads_atp     2 (L B + U)                              a forward with gradients (L B + U)
                                                           and its backward to the activations
                                                           (no weight gradients: about the
                                                           forward's matmul FLOPs again)
    heads_screen  S 2 (L B + U) + m (L B + U)              S path points (screen_steps), each a
                  + L H (M + O_h)                          forward with gradients and its
                  + k (M + (L-1)/2 B + U) + L B + U        backward; m draws (screen_samples),
                                                           each a backward; each head's exact block
                                                           output (its MLP; blocks whose write
                                                           is not linear in z rerun the block:
                                                           L H B); the exact top k at a mean
                                                           depth, on a clean pass made again
                                                           (parallel blocks: no M per head)
                  [+ once per run, the calibration: c sequences of heads' per-sequence cost
                  without induction, and a clean pass of them: c (heads + L B + U)]
    attention, norms   0 beyond the clean pass;  neurons: 2 L d_mlp d V (weights only, once)
    pruning       2 (T-1) (L+1)^2 d                        one Gram matrix of the L+1 residual
                                                           points per evaluated and last token
    pruning_drops sum over widths n of                     [n = 1: 0 when intervention runs
                  (L-n)(L-n+1)/2 B + (L-n+1) U             too (its drop); the drop reaching
                                                           the last block is lens point L-n:
                                                           -U when logit_lens runs too; plus
                                                           pruning's Gram when it does not run]

Parallel attention/MLP blocks drop the `L M` of intervention (drop_attn reuses the cached MLP
write) and of heads; attention-only models have M = 0, no drop_mlp, and drop_attn is drop:
their intervention is (L^2 - 1) B + (2L - 1) U.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from compute.memory import ModelDims
from compute.metrics.base import (
    DEFAULT_SCREEN_CALIBRATION,
    DEFAULT_SCREEN_SAMPLES,
    DEFAULT_SCREEN_STEPS,
    DEFAULT_SCREEN_TOP_K,
    EngineOptions,
)


def block_parts(dims: ModelDims, seq_len: int) -> tuple[float, float, float]:
    """(A, M, U) for one sequence of `seq_len` tokens."""
    t, d, hd = seq_len, dims.d_model, dims.n_heads * dims.d_head
    kv_hd = (dims.n_kv_heads or dims.n_heads) * dims.d_head
    attn = 2 * t * d * (2 * hd + 2 * kv_hd) + 4 * t * t * hd
    mlp = 2 * t * d * dims.d_mlp * (3 if dims.gated_mlp else 2)
    unembed = 2 * (t - 2) * d * dims.d_vocab
    return float(attn), float(mlp), float(unembed)


def intervention_flops(
    dims: ModelDims, seq_len: int, *, parallel: bool = False, with_lens: bool = False
) -> float:
    a, m, u = block_parts(dims, seq_len)
    b, n = a + m, dims.n_layers
    tail = n * (n - 1) / 2  # sum over l of the L-1-l blocks after l
    has_mlp = dims.d_mlp > 0
    drop = tail * b + n * u - (u if with_lens else 0.0)
    drop_attn = 0.0 if not has_mlp else tail * b + n * u + (0.0 if parallel else n * m)
    drop_mlp = tail * b + n * u if has_mlp else 0.0
    swap = (n * (n + 1) / 2 - 1) * b + (n - 1) * u
    return drop + drop_attn + drop_mlp + swap


def flop_settings(opts: EngineOptions, n_sequences: int | None = None) -> dict[str, Any]:
    """A run's options that change what `family_flops` and `unit_weights` count; given the
    run's `n_sequences`, the calibration's sequences capped at them (it runs on at most
    those)."""
    calibration = opts.screen_calibration
    return {
        "screen_steps": opts.screen_steps,
        "screen_samples": opts.screen_samples,
        "screen_top_k": opts.screen_top_k,
        "screen_calibration": calibration if n_sequences is None else min(calibration, n_sequences),
        "drop_widths": opts.drop_widths,
    }


def family_flops(
    dims: ModelDims,
    seq_len: int,
    families: Iterable[str],
    *,
    parallel: bool = False,
    screen_steps: int = DEFAULT_SCREEN_STEPS,
    screen_samples: int = DEFAULT_SCREEN_SAMPLES,
    screen_top_k: int = DEFAULT_SCREEN_TOP_K,
    screen_calibration: int = DEFAULT_SCREEN_CALIBRATION,
    drop_widths: Iterable[int] | None = None,
) -> dict[str, float]:
    """FLOPs per sequence of each family beyond the clean pass, plus `clean` (the shared pass).
    The `screen_*` settings and `drop_widths` are the run's options of the same names (the
    defaults when None); `screen_calibration` costs once per run, not per sequence
    (`screen_calibration_flops`), and is not counted here.

    Sharing between families is charged to the first in registry order (intervention before
    logit_lens and similarity), matching what the engine computes.
    """
    names = set(families)
    a, m, u = block_parts(dims, seq_len)
    b, n, h = a + m, dims.n_layers, dims.n_heads
    out = {"clean": n * b + u}
    if "intervention" in names:
        out["intervention"] = intervention_flops(
            dims, seq_len, parallel=parallel, with_lens="logit_lens" in names
        )
    if "logit_lens" in names:
        out["logit_lens"] = n * u
    if "similarity" in names:
        out["similarity"] = 0.0 if "intervention" in names else (n - 1) * b
    if "heads" in names:
        per_head_mlp = 0.0 if parallel else n * m
        out["heads"] = (
            h * (per_head_mlp + n * (n - 1) / 2 * b + n * u)
            + n * h * 2 * seq_len * dims.d_head * dims.d_model
        )
    if "heads_atp" in names:
        out["heads_atp"] = 2 * (n * b + u)
    if "heads_screen" in names:
        out["heads_screen"] = heads_screen_flops(
            dims, seq_len, screen_steps, screen_top_k, samples=screen_samples, parallel=parallel
        )
    if "pruning" in names:
        out["pruning"] = pruning_flops(dims, seq_len)
    if "pruning_drops" in names:
        out["pruning_drops"] = pruning_drops_flops(
            dims,
            seq_len,
            with_intervention="intervention" in names,
            with_lens="logit_lens" in names,
            widths=drop_widths,
        ) + (0.0 if "pruning" in names else pruning_flops(dims, seq_len))
    for name in ("attention", "norms", "neurons"):
        if name in names:
            out[name] = 0.0
    return out


def heads_screen_flops(
    dims: ModelDims,
    seq_len: int,
    steps: int,
    top_k: int,
    *,
    samples: int = DEFAULT_SCREEN_SAMPLES,
    parallel: bool = False,
) -> float:
    """The head screen (`compute.metrics.heads_screen`) per sequence: its path points, its
    draws (a backward through the blocks and the unembedding each), each head's exact block
    output (on fused blocks, whose write is linear in z: the head's write and
    the block's MLP), and its exact top k, each at the mean depth (L-1)/2 of the blocks after
    it, on the batch's clean pass made again."""
    a, m, u = block_parts(dims, seq_len)
    b, n, h = a + m, dims.n_layers, dims.n_heads
    per_head_mlp = 0.0 if parallel else m
    local = n * h * (per_head_mlp + 2 * seq_len * dims.d_head * dims.d_model)
    k = min(top_k, n * h)
    exact = k * (per_head_mlp + (n - 1) / 2 * b + u) + (n * b + u if k else 0.0)
    return (steps * 2 + samples) * (n * b + u) + local + exact


def screen_calibration_flops(
    dims: ModelDims, seq_len: int, calibration: int, *, parallel: bool = False
) -> float:
    """Once per run: every head ablated exactly on the run's first c = `screen_calibration`
    sequences (`compute.metrics.heads_screen.calibrate`), on their clean pass made again."""
    if not calibration:
        return 0.0
    a, m, u = block_parts(dims, seq_len)
    b, n = a + m, dims.n_layers
    heads = family_flops(dims, seq_len, ["heads"], parallel=parallel)["heads"]
    return calibration * (heads + n * b + u)


def pruning_flops(dims: ModelDims, seq_len: int) -> float:
    """The predictors (`compute.metrics.pruning`): a Gram matrix of the L+1 residual points per
    evaluated and last token. `pruning_drops` computes them too (to score them), shared."""
    return 2.0 * (seq_len - 1) * (dims.n_layers + 1) ** 2 * dims.d_model


def pruning_drops_flops(
    dims: ModelDims,
    seq_len: int,
    *,
    with_intervention: bool = False,
    with_lens: bool = False,
    widths: Iterable[int] | None = None,
) -> float:
    """The n-block drops (`compute.metrics.pruning_drops`): for each width n and start l, blocks
    l+n .. L-1 and one unembedding; width 1 is the intervention family's drop when it runs.
    `widths`: the run's `drop_widths` (the default when None), capped at L/2 as the family caps
    them."""
    from compute.metrics.pruning_drops import DROP_WIDTHS, drop_widths

    a, m, u = block_parts(dims, seq_len)
    b, n_layers = a + m, dims.n_layers
    total = 0.0
    for n in drop_widths(n_layers, DROP_WIDTHS if widths is None else tuple(widths)):
        if n == 1 and with_intervention:
            continue
        starts = n_layers - n + 1
        total += (n_layers - n) * starts / 2 * b + starts * u - (u if with_lens else 0.0)
    return total


def neurons_flops(dims: ModelDims, vocab_real: int | None = None) -> float:
    """Once per run, from the weights: every neuron's cosine with every vocabulary direction."""
    return 2.0 * dims.n_layers * dims.d_mlp * dims.d_model * (vocab_real or dims.d_vocab)


def induction_flops(dims: ModelDims, n: int = 64, sequences: int = 32) -> float:
    a, m, _ = block_parts(dims, 2 * n + 1)
    return float(sequences * dims.n_layers * (a + m))


def unit_weights(
    dims: ModelDims,
    seq_len: int,
    batch: int,
    n_batches: int,
    units: dict[str, tuple[int, int]],
    *,
    parallel: bool = False,
    induction: tuple[int, int] = (64, 32),
    screen_steps: int = DEFAULT_SCREEN_STEPS,
    screen_samples: int = DEFAULT_SCREEN_SAMPLES,
    screen_top_k: int = DEFAULT_SCREEN_TOP_K,
    screen_calibration: int = DEFAULT_SCREEN_CALIBRATION,
    drop_widths: Iterable[int] | None = None,
) -> dict[str, tuple[float, float]]:
    """Per family, what one of its progress units weighs: (a unit of a batch, a unit of its
    finish), scaled so that the weighted units of the whole sweep add up to its plain count.

    A family reports progress in units of its own (a layer of head ablations, one drop, a lens
    point), and those cost very different amounts: on Gemma 3 270M a layer of `heads` is four
    downstream passes with their 262,144-column unembeddings, an `intervention` unit one, so an
    ETA that counted units was four times too long while heads ran. Weighted by these FLOPs
    (`family_flops` per batch over its units; neurons and induction from their own formulas) a
    progress fraction is a fraction of the work. `units`: family -> (units per batch, units
    at finish). A unit with no FLOP formula (the tuned lens's) weighs the sweep's mean unit;
    one counted as free (similarity beside intervention, whose swaps it shares) weighs 0. The
    `screen_*` settings and `drop_widths` are the run's (`family_flops`)."""
    per_sequence = family_flops(
        dims,
        seq_len,
        list(units),
        parallel=parallel,
        screen_steps=screen_steps,
        screen_samples=screen_samples,
        screen_top_k=screen_top_k,
        drop_widths=drop_widths,
    )
    cost: dict[str, tuple[float | None, float | None]] = {}
    for name, (per_batch, at_finish) in units.items():
        # None: no formula (the sweep's mean unit); 0.0: counted as free (work shared with
        # another family, as similarity's with intervention's swaps)
        batch_cost = (
            per_sequence[name] * batch / per_batch if per_batch and name in per_sequence else None
        )
        finish_cost: float | None = None
        if at_finish and name == "neurons":
            finish_cost = neurons_flops(dims) / at_finish
        elif at_finish and name == "heads":
            finish_cost = induction_flops(dims, *induction) / at_finish
        elif name == "heads_screen" and per_batch:
            # the screen per batch, its exact top k (a unit a head, over every batch) at finish
            screen = heads_screen_flops(
                dims, seq_len, screen_steps, 0, samples=screen_samples, parallel=parallel
            )
            batch_cost = screen * batch / per_batch
            if at_finish:
                exact = per_sequence[name] - screen
                calibration = screen_calibration_flops(
                    dims, seq_len, screen_calibration, parallel=parallel
                )
                finish_cost = (exact * batch * n_batches + calibration) / at_finish
        cost[name] = (batch_cost, finish_cost)
    counts = {
        name: (per_batch * n_batches, at_finish) for name, (per_batch, at_finish) in units.items()
    }
    total_units = sum(a + b for a, b in counts.values())
    known = [
        (c, n)
        for name in units
        for c, n in zip(cost[name], counts[name], strict=True)
        if c is not None and n
    ]
    if not known or total_units == 0:
        return {name: (1.0, 1.0) for name in units}
    mean = sum(c * n for c, n in known) / sum(n for _, n in known)
    total_cost = sum(
        (c if c is not None else mean) * n
        for name in units
        for c, n in zip(cost[name], counts[name], strict=True)
    )
    scale = total_units / total_cost
    return {
        name: tuple((c if c is not None else mean) * scale for c in cost[name])  # type: ignore[misc]
        for name in units
    }
