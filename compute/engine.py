"""The sweep: one clean pass per batch feeds every family; interventions restart from its cache.

Per batch of sequences the engine runs the model once, keeping the residual stream at every
point, each block's attention and MLP writes and (if a family needs them) attention patterns, and
the clean next-token distribution P at the evaluated positions. Families then intervene by
restarting from the cached residual, and reduce logits to running sums on the device. Nothing
per-token outlives its batch, so peak memory depends on the batch size, not the token count.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import torch
from jaxtyping import Int
from torch import Tensor

from compute.errors import TokenSpecError, UnsupportedArchitectureError
from compute.flops import family_flops, flop_settings, unit_weights
from compute.memory import (
    ModelDims,
    allocator_for_sweeping,
    batch_budget_bytes,
    release_free_memory,
    sweep_bytes_per_sequence,
)
from compute.metrics import families_named
from compute.metrics.base import (
    SEQUENCE_MEANS_SCHEMA,
    BatchContext,
    EngineOptions,
    Family,
    FamilyOutput,
    NeuronTokens,
    logit_chunks,
)
from compute.models import LoadedModel, SplitModel
from compute.records import Record
from compute.reduce import LogitChunks, keeps_probs, reference_distribution


@dataclass(frozen=True)
class Progress:
    """One progress report: units of work done of total, and throughput so far.

    `tokens_per_s` counts evaluated tokens fully swept (every family, every intervention) per
    second: at the end it is tokens evaluated / wall time.
    """

    done: int
    total: int
    tokens_done: int
    tokens_per_s: float
    elapsed_s: float


ProgressFn = Callable[[Progress], None]


@dataclass
class SweepResult:
    records: list[Record]
    neuron_tokens: list[NeuronTokens] = field(default_factory=list)
    tokens_evaluated: int = 0
    wall_s: float = 0.0
    # per-sequence means of every per-layer mean (compute.metrics.base.SEQUENCE_MEANS_SCHEMA)
    sequence_means: pa.Table = field(default_factory=SEQUENCE_MEANS_SCHEMA.empty_table)
    # seconds spent in each family's batches and finish, and in the clean passes ("clean_pass")
    family_s: dict[str, float] = field(default_factory=dict)


# Tokens per batch on a CPU: measured with `benchmarks/sweep.py --batch-scan` (docs/performance.md).
# Above about a thousand tokens the per-batch temporaries ([tokens, d_mlp] activations, the
# reference [tokens, vocab] distribution) outgrow the caches and are page-faulted in afresh on
# every allocation; below a few hundred, matmuls are too thin to run at full rate.
CPU_TOKENS_PER_BATCH = 1024


def auto_batch_size(
    lm: LoadedModel, seq_len: int, opts: EngineOptions, families: list[Family] | None = None
) -> int:
    """Sequences per batch: the setting if given, else chosen for the device.

    CPU: about `CPU_TOKENS_PER_BATCH` tokens (the measured optimum), fewer where the batch's
    memory would pass `memory_budget_mb` (default: half the weights' bytes, at least 64 MiB).
    GPU: as many sequences as the memory budget holds (`memory_budget_mb`, default 85% of the
    device's free memory; a model split over devices also as many as each device of its blocks
    holds, `SplitModel.sequences_beside_blocks`). Memory per sequence is `compute.memory`'s
    estimate; a CPU batch also stays within the logits budget.
    """
    if opts.batch_size is not None:
        return opts.batch_size
    families = families or []
    per_sequence = sweep_bytes_per_sequence(
        ModelDims.of(lm),
        seq_len,
        lm.dtype_bytes,
        patterns=any(f.needs_patterns for f in families),
        z=any(f.needs_z for f in families),
        probs=keeps_probs(lm),
    )
    on_gpu = str(lm.device).startswith("cuda")
    budget = batch_budget_bytes(lm.n_params, lm.dtype_bytes, lm.device, opts.memory_budget_mb)
    by_memory = max(1, budget // per_sequence)
    if isinstance(lm, SplitModel):  # the devices of its blocks hold the batch's block runs
        beside = lm.sequences_beside_blocks(
            seq_len,
            patterns=any(f.needs_patterns for f in families),
            z=any(f.needs_z for f in families),
        )
        by_memory = min(by_memory, beside)
    if on_gpu:
        return by_memory
    tokens = opts.tokens_per_batch or CPU_TOKENS_PER_BATCH
    by_tokens = max(1, round(tokens / seq_len))
    if not keeps_probs(lm):  # P is kept as W_U p: no [tokens, vocab] tensor to bound
        return max(1, min(by_memory, by_tokens))
    by_logits = max(1, opts.logits_budget_mb * 2**20 // (seq_len * lm.d_vocab * 4))
    return max(1, min(by_logits, by_memory, by_tokens))


# Runs of at least this many FLOPs (compute.flops) reduce their logit blocks in one compiled
# kernel on a CPU (`EngineOptions.fuse_reductions`): compiling costs ~15-30 s once per process
# (seconds with Inductor's on-disk cache), and an eager [512, 1024] block's seven passes (cast,
# amax, argmax, subtract, exp, sum, two row dot products) cost as much as its bfloat16 matmul.
FUSE_MIN_FLOPS = 10e12


def fuse_reductions(
    lm: LoadedModel, n_seq: int, seq_len: int, families: list[Family], opts: EngineOptions
) -> bool:
    """Whether comparisons reduce their logit blocks in one compiled kernel: the setting if
    given, else on a CPU for runs of at least `FUSE_MIN_FLOPS`."""
    if opts.fuse_reductions is not None:
        return opts.fuse_reductions
    if lm.device != "cpu":
        return False  # not measured on an accelerator, where whole rows are one block
    names = [f.name for f in families]
    per_sequence = family_flops(
        ModelDims.of(lm), seq_len, names, parallel=lm.parallel, **flop_settings(opts)
    )
    return sum(per_sequence.values()) * n_seq >= FUSE_MIN_FLOPS


def sweep(
    lm: LoadedModel,
    tokens: Int[Tensor, "n_sequences seq_len"],
    family_names: list[str] | tuple[str, ...],
    opts: EngineOptions | None = None,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Compute the named families on `tokens` and return their records."""
    opts = opts or EngineOptions()
    refused = lm.refused_families  # recorded with the model (`describe`), not computed
    families = [f for f in families_named(family_names) if f.name not in refused]
    if not families:
        named = ", ".join(dict.fromkeys(family_names))
        raise UnsupportedArchitectureError(
            f"{lm.architecture}: {named} refused on this architecture: "
            + "; ".join(dict.fromkeys(refused[n] for n in family_names))
        )
    lm.forget_derived_weights()  # weights may have been edited in place since the last sweep
    n_seq, seq_len = tokens.shape
    if seq_len < 3:
        raise TokenSpecError(f"seq_len {seq_len} leaves no evaluated positions; use >= 3")
    if seq_len > lm.n_ctx:
        raise TokenSpecError(f"seq_len {seq_len} exceeds the model's context n_ctx={lm.n_ctx}")
    batch = min(auto_batch_size(lm, seq_len, opts, families), n_seq)
    n_batches = -(-n_seq // batch)
    if opts.batch_size is None:  # as few batches, of sizes as even as can be: no thin tail
        batch = -(-n_seq // n_batches)
    units = {f.name: (f.units_per_batch(lm), f.units_at_finish(lm, opts)) for f in families}
    total = sum(per_batch * n_batches + at_finish for per_batch, at_finish in units.values())
    # Progress is counted in the families' units weighted by their FLOPs (compute.flops), so
    # that a fraction done is a fraction of the work and an ETA holds while costly units run.
    weights = unit_weights(
        ModelDims.of(lm),
        seq_len,
        batch,
        n_batches,
        units,
        parallel=lm.parallel,
        induction=(min(opts.induction_n, (lm.n_ctx - 1) // 2), opts.induction_sequences),
        **flop_settings(opts, n_seq),
    )
    chunks = logit_chunks(lm, opts)
    if fuse_reductions(lm, n_seq, seq_len, families, opts):
        chunks = dataclasses.replace(chunks, fused=True)
    needs_patterns = any(f.needs_patterns for f in families)
    needs_z = any(f.needs_z for f in families)
    names = frozenset(f.name for f in families)
    accs = {f.name: f.accumulator(lm.device, n_seq) for f in families}
    state = {"done": 0.0, "tokens": 0}
    spent = dict.fromkeys(["clean_pass", *(f.name for f in families)], 0.0)
    start = time.perf_counter()

    def tick(work: float) -> None:
        state["done"] += work
        if progress is not None:
            elapsed = time.perf_counter() - start
            done = min(total, round(state["done"]))
            # Throughput of the whole sweep: evaluated tokens times the fraction of work done.
            swept = n_seq * (seq_len - 2) * state["done"] / max(total, 1)
            progress(
                Progress(
                    done,
                    total,
                    int(state["tokens"]),
                    swept / elapsed if elapsed > 0 else 0.0,
                    elapsed,
                )
            )

    def weighted(name: str, at: int) -> Callable[[int], None]:
        weight = weights[name][at]
        return lambda units: tick(units * weight)

    allocator_for_sweeping()
    with torch.inference_mode():
        for first in range(0, n_seq, batch):
            chunk = tokens[first : first + batch]
            if chunk.device.type == "cpu" and str(lm.device).startswith("cuda"):
                chunk = chunk.pin_memory().to(lm.device, non_blocking=True)  # no device wait
            else:
                chunk = chunk.to(lm.device)
            mark = time.perf_counter()
            ctx = clean_pass(
                lm, chunk, needs_patterns, chunks, tick, capture_z=needs_z, families=names
            )
            spent["clean_pass"] += time.perf_counter() - mark
            state["tokens"] += chunk.shape[0] * (seq_len - 2)
            for family in families:
                release_free_memory()  # what the previous step freed, before this one's peak
                mark = time.perf_counter()
                accs[family.name].start_batch(first, chunk.shape[0])
                ctx.tick = weighted(family.name, 0)
                family.on_batch(ctx, accs[family.name], opts)
                spent[family.name] += time.perf_counter() - mark
            tick(0)
            del ctx
            release_free_memory()
        outputs: list[FamilyOutput] = []
        for f in families:
            mark = time.perf_counter()
            outputs.append(f.finish(lm, accs[f.name], opts, weighted(f.name, 1)))
            spent[f.name] += time.perf_counter() - mark
    records = [r for o in outputs for r in o.records]
    neuron_tokens = [t for o in outputs for t in o.neuron_tokens]
    means = [o.sequence_means for o in outputs if o.sequence_means is not None]
    sequence_means = pa.concat_tables(means) if means else SEQUENCE_MEANS_SCHEMA.empty_table()
    return SweepResult(
        records,
        neuron_tokens,
        int(state["tokens"]),
        time.perf_counter() - start,
        sequence_means,
        {name: round(s, 3) for name, s in spent.items()},
    )


def clean_pass(
    lm: LoadedModel,
    tokens: Int[Tensor, "batch pos"],
    capture_patterns: bool,
    chunks: LogitChunks,
    tick: Callable[[int], None],
    *,
    capture_z: bool = False,
    families: frozenset[str] = frozenset(),
) -> BatchContext:
    """Run the unmodified model once, caching what every family needs (per block; None where
    the block has no such thing: a pattern or z off the attention blocks, a write of a
    sublayer it lacks)."""
    resid = [lm.embed(tokens)]
    attn_out, mlp_out, patterns, zs = [], [], [], []
    for layer in range(lm.n_layers):
        run = lm.run_block(layer, resid[-1], capture_pattern=capture_patterns, capture_z=capture_z)
        resid.append(run.resid)
        attn_out.append(run.attn_out)
        mlp_out.append(run.mlp_out)
        patterns.append(run.pattern)
        zs.append(run.z if capture_z else None)
    final = resid[-1][:, 1:-1].reshape(-1, lm.d_model)
    targets = tokens[:, 2:].reshape(-1)
    ref = reference_distribution(lm, final, targets, chunks=chunks)
    return BatchContext(
        lm,
        tokens,
        resid,
        attn_out,
        mlp_out,
        patterns if capture_patterns else None,
        ref,
        chunks,
        tick,
        z=zs if capture_z else None,
        families=families,
    )
