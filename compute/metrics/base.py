"""What a metric family is, and the per-batch context the engine hands it.

A family is registered once (`compute.metrics.FAMILIES`) and looked up by name by the CLI, the
workers and the API. Token families consume a `BatchContext` — the clean pass of one batch,
computed once and shared by every family — and weight-only or self-driven families do their work
in `finish`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import pyarrow as pa
import torch
from jaxtyping import Float, Int
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import Tensor

from compute.errors import ComputeError
from compute.lens.config import LensTraining
from compute.models import BlockRun, LoadedModel
from compute.records import Record
from compute.reduce import (
    REFERENCE_BLOCK_BYTES,
    LogitChunks,
    MeanAccumulator,
    Reference,
    TokenStats,
    compare_distributions,
    keeps_probs,
)

T = TypeVar("T")
# pruning_drops' widths by default: 1 (shared with intervention's drop) to 4, each about one
# intervention kind's cost (docs/metrics.md)
DEFAULT_DROP_WIDTHS = (1, 2, 3, 4)
# heads_screen's settings by default (docs/metrics.md, "heads_screen"; chosen on the measurements
# of docs/performance.md, "The head screen against exact ablation")
DEFAULT_SCREEN_STEPS = 1
DEFAULT_SCREEN_SAMPLES = 8
DEFAULT_SCREEN_TOP_K = 10
DEFAULT_SCREEN_CALIBRATION = 0


class EngineOptions(BaseModel):
    """Knobs of the sweep. Those that change numbers are part of the run configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    batch_size: int | None = Field(None, ge=1, description="sequences per batch; None = auto")
    tokens_per_batch: int | None = Field(
        None,
        ge=1,
        description="auto batch on a CPU: about this many tokens per batch "
        "(None = the measured default, compute.engine.CPU_TOKENS_PER_BATCH)",
    )
    memory_budget_mb: int | None = Field(
        None,
        ge=64,
        description="automatic batch: bound on the sweep's memory beyond the "
        "weights, MiB (None = on a GPU 85% of the device's free memory, on a CPU half the "
        "weights' bytes, at least 64 MiB)",
    )
    logits_budget_mb: int = Field(256, ge=8, description="bound on [tokens, vocab] intermediates")
    chunk_mb: int | None = Field(
        None,
        ge=1,
        description="MiB of logits made and reduced at once (rows x vocabulary columns); auto",
    )
    fuse_reductions: bool | None = Field(
        None,
        description="reduce each logit block of a comparison in one compiled kernel "
        "(torch.compile); None = on a CPU when the run's work passes "
        "compute.engine.FUSE_MIN_FLOPS (compilation costs ~15-30 s once per process)",
    )
    prev_ks: tuple[int, ...] = (1, 2, 4, 5, 8, 16)
    induction_n: int = Field(64, ge=2)
    induction_sequences: int = Field(32, ge=1)
    induction_seed: int = 0
    top_neurons: int = Field(20, ge=0, description="top neurons per class per layer with tokens")
    top_tokens: int = Field(10, ge=1)
    # part of a run's identity only when the run has the tuned_lens family (RunConfig)
    tuned_lens: LensTraining = LensTraining()
    # part of a run's identity only when the run has the pruning_drops family (RunConfig)
    drop_widths: tuple[int, ...] = Field(
        DEFAULT_DROP_WIDTHS,
        min_length=1,
        description="pruning_drops: the numbers of consecutive blocks dropped at once (widths "
        "above half the model's blocks are skipped)",
    )

    # part of a run's identity only when the run has the heads_screen family (RunConfig)
    screen_steps: int = Field(
        DEFAULT_SCREEN_STEPS,
        ge=1,
        le=64,
        description="heads_screen: points of the integrated gradient along the path on which "
        "every head's output is scaled from clean to zero (1 = the gradient at the clean model)",
    )
    screen_samples: int = Field(
        DEFAULT_SCREEN_SAMPLES,
        ge=0,
        le=256,
        description="heads_screen: target draws from the model's own distribution that "
        "estimate the curvature (Gauss-Newton) term; 0 = the first-order term alone",
    )
    screen_top_k: int = Field(
        DEFAULT_SCREEN_TOP_K,
        ge=0,
        description="heads_screen: the screen's top k heads, then ablated exactly",
    )
    screen_calibration: int = Field(
        DEFAULT_SCREEN_CALIBRATION,
        ge=0,
        le=64,
        description="heads_screen: the run's first c sequences on which every head is ablated "
        "exactly, to correct each head's estimate by its error there; 0 = the estimate alone",
    )

    @field_validator("drop_widths")
    @classmethod
    def _widths(cls, widths: tuple[int, ...]) -> tuple[int, ...]:
        if any(n < 1 for n in widths):
            raise ValueError(f"drop widths are numbers of blocks, at least 1: {widths}")
        return tuple(sorted(set(widths)))


# Options that change speed and memory but not the numbers (beyond float rounding): they are
# not part of a run's identity (`RunConfig.canonical_json`).
PERFORMANCE_OPTIONS = (
    "batch_size",
    "tokens_per_batch",
    "memory_budget_mb",
    "logits_budget_mb",
    "chunk_mb",
    "fuse_reductions",
)


@dataclass
class NeuronTokens:
    """Top promoted / suppressed tokens of one neuron (a side table of the neurons family)."""

    layer: int
    neuron: int
    neuron_class: str
    direction: str
    rank: int
    token_id: int
    token: str
    cosine: float


# Logits on a CPU are made and reduced in [rows, cols] blocks of CPU_LOGIT_BLOCK_MB: the block
# stays in the cache between the unembedding matmul and its reductions. Measured on GPT-2 small's
# unembedding (d_model 768, vocabulary 50,257, 1008 rows): whole [rows, vocab] rows ran at
# 105-124 GFLOP/s, 1-4 MB blocks of 256-512 rows at 160-186 (matmul of 2048^2: ~270); at
# d_model 256 and 2048 the same blocks were also the fastest (docs/performance.md).
CPU_LOGIT_COLS = 1024
CPU_LOGIT_BLOCK_MB = 2


def logit_chunks(lm: LoadedModel, opts: EngineOptions) -> LogitChunks:
    """How many rows, and vocabulary columns of them, of logits are made and reduced at once.

    On a CPU: blocks of `chunk_mb` (default `CPU_LOGIT_BLOCK_MB`) MiB, `CPU_LOGIT_COLS` columns
    wide (512 rows by default). On an accelerator whole rows (no column loop to launch), as many
    as `chunk_mb` MiB or a quarter of the logits budget holds: memory bandwidth there is ample.
    """
    vocab = lm.d_vocab
    # Where the reference keeps W_U p it holds one row block's whole logits between its passes.
    most = REFERENCE_BLOCK_BYTES // (4 * vocab) if not keeps_probs(lm) else None
    if lm.device == "cpu":
        cols = min(vocab, CPU_LOGIT_COLS)
        block = (opts.chunk_mb or CPU_LOGIT_BLOCK_MB) * 2**20 // 4
        return LogitChunks(rows=max(1, min(block // cols, most or block)), cols=cols)
    block = (opts.chunk_mb or opts.logits_budget_mb // 4) * 2**20 // 4
    return LogitChunks(rows=max(1, min(block // vocab, most or block)), cols=vocab)


# The per-sequence means behind every per-layer mean (rows with head null): what a bootstrap over
# sequences resamples (docs/metrics.md: uncertainty). `sequence` is the index of the sequence in
# the run's tokens (0 .. n_sequences-1).
SEQUENCE_MEANS_SCHEMA = pa.schema(
    [
        pa.field("metric", pa.string(), nullable=False),
        pa.field("layer", pa.int32()),
        pa.field("component", pa.string()),
        pa.field("head", pa.int32()),
        pa.field("sequence", pa.int32(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)


@dataclass
class FamilyOutput:
    records: list[Record]
    neuron_tokens: list[NeuronTokens] = field(default_factory=list)
    sequence_means: pa.Table | None = None


@dataclass
class BatchContext:
    """The clean pass of one batch, shared by every family."""

    lm: LoadedModel
    tokens: Int[Tensor, "batch pos"]
    resid: list[Float[Tensor, "batch pos d_model"]]  # points 0..L (0 = embeddings)
    # per block; None where the block has no such sublayer (`LoadedModel.layers`)
    attn_out: list[Float[Tensor, "batch pos d_model"] | None]
    mlp_out: list[Float[Tensor, "batch pos d_model"] | None]
    # per block; None off the attention blocks
    patterns: list[Float[Tensor, "batch head q k"] | None] | None
    ref: Reference
    chunks: LogitChunks
    tick: Callable[[int], None]
    z: list[Float[Tensor, "batch pos head d_head"] | None] | None = None
    families: frozenset[str] = frozenset()
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return self.lm.n_layers

    def point_stats(self, point: int) -> TokenStats:
        """Q from the residual at point i (0..L) against P, computed once per batch.

        Point L is the clean model itself: its statistics come from the reference P (KL 0,
        agreement 1) without another unembedding. Points below L are shared by the logit lens
        and by `drop` of the last block (which leaves exactly the residual at point L-1).
        """
        key = ("point", point)
        if key not in self._memo:
            if point == self.n_layers:
                ref = self.ref
                self._memo[key] = TokenStats(
                    torch.zeros_like(ref.loss)[None],
                    ref.entropy_bits[None],
                    torch.ones_like(ref.loss)[None],
                    ref.loss[None],
                    (ref.argmax == ref.targets).float()[None],
                )
            else:
                self._memo[key] = self.compare(self.resid[point], f"residual point {point}")
        return self._memo[key]  # type: ignore[return-value]

    def moved(self, layer: int) -> BlockRun:
        """Block l+1 run on the clean residual before block l: the first half of the swap of
        (l, l+1), which both `intervention` (swap) and `similarity` need. Computed once when
        both families run, and released after its second use."""
        users = len(self.families & {"intervention", "similarity"})
        key = ("moved", layer)
        if users < 2:
            return self.lm.run_block(layer + 1, self.resid[layer])
        if key in self._memo:
            return self._memo.pop(key)  # type: ignore[return-value]
        run = self.lm.run_block(layer + 1, self.resid[layer])
        self._memo[key] = run
        return run

    def shared(self, key: tuple[object, ...], make: Callable[[], T]) -> T:
        """`make()`, computed once per batch for every family that asks by the same key."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]  # type: ignore[return-value]

    def dropped(self, layer: int) -> TokenStats:
        """Q with block l skipped: blocks l+1.. on the cached residual before l (at the last
        block, logit-lens point L-1). Both `intervention` (drop) and `pruning_drops` (width 1)
        need it: computed once when both run, and released after its second use."""
        key = ("dropped", layer)
        if key in self._memo:
            return self._memo.pop(key)  # type: ignore[return-value]
        stats = (
            self.point_stats(layer)
            if layer == self.n_layers - 1
            else self.compare(self.run_from(layer + 1, self.resid[layer]), f"drop at layer {layer}")
        )
        if {"intervention", "pruning_drops"} <= self.families:
            self._memo[key] = stats
        return stats

    def at_eval(self, x: Float[Tensor, "batch pos ..."]) -> Float[Tensor, "n ..."]:
        """Flatten [batch, pos, ...] to the evaluated positions 1..T-2, batch-major."""
        return x[:, 1:-1].reshape(-1, *x.shape[2:])

    def run_from(self, start: int, resid: Float[Tensor, "b pos d_model"]) -> Tensor:
        """Run blocks start..L-1 unmodified on a residual (a restart from the cache)."""
        for layer in range(start, self.n_layers):
            resid = self.lm.run_block(layer, resid).resid
        return resid

    def compare(self, final_resid: Float[Tensor, "gb pos d_model"], what: str) -> TokenStats:
        """Compare the model output from a final residual with the clean reference.

        The residual may stack g variants of the batch along dim 0 ([g*batch, pos, d]); the
        result then has one row per variant.
        """
        b = self.tokens.shape[0]
        g = final_resid.shape[0] // b
        x = final_resid[:, 1:-1].reshape(g, -1, final_resid.shape[-1])
        return compare_distributions(self.lm, x, self.ref, chunks=self.chunks, what=what)


def cosine_per_token(a: Tensor, b: Tensor) -> Tensor:
    """Cosine over d_model of two [..., d_model] tensors, in float32."""
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12)


def accumulated_records(
    family: str,
    acc: MeanAccumulator,
    key_fields: tuple[str, ...],
    keep: Callable[[tuple[object, ...]], bool] | None = None,
) -> list[Record]:
    """One record per accumulated key (those `keep` accepts, if given). `key_fields` names the
    key's parts: "metric" (the name within the family) and any of "layer", "component",
    "head"."""
    records = []
    for key, stat in acc.results().items():
        if keep is not None and not keep(key):
            continue
        fields = dict(zip(key_fields, key, strict=True))
        metric = fields.pop("metric")
        records.append(
            Record.of(f"{family}.{metric}", stat.value, stat.n, stderr=stat.stderr, **fields)
        )
    return records


def accumulated_sequence_means(
    family: str,
    acc: MeanAccumulator,
    key_fields: tuple[str, ...],
    keep: Callable[[tuple[object, ...]], bool] | None = None,
) -> pa.Table:
    """The per-sequence means of every per-layer key (no head, or head None; and `keep`
    accepts it, if given): one row per (key, sequence that has values for it), in
    `SEQUENCE_MEANS_SCHEMA`."""
    keys, means, has = acc.sequence_means()
    parts = [dict(zip(key_fields, key, strict=True)) for key in keys]
    chosen = [
        i for i, p in enumerate(parts) if p.get("head") is None and (keep is None or keep(keys[i]))
    ]
    seq, col = np.nonzero(has[:, chosen].T)[::-1]  # key-major: a key's sequences together
    slot = np.asarray(chosen, dtype=np.int64)[col] if chosen else np.zeros(0, np.int64)
    values = means[seq, slot]
    if not np.isfinite(values).all():
        bad = keys[int(slot[np.argmax(~np.isfinite(values))])]
        raise ComputeError(f"non-finite values accumulated for {bad!r}")

    def column(name: str) -> list[object]:
        per_key = [f"{family}.{p['metric']}" if name == "metric" else p.get(name) for p in parts]
        return [per_key[i] for i in slot.tolist()]

    return pa.table(
        {
            "metric": pa.array(column("metric"), pa.string()),
            "layer": pa.array(column("layer"), pa.int32()),
            "component": pa.array(column("component"), pa.string()),
            "head": pa.array(column("head"), pa.int32()),
            "sequence": pa.array(seq.astype(np.int32)),
            "value": pa.array(values, pa.float64()),
        },
        schema=SEQUENCE_MEANS_SCHEMA,
    )


class FamilyBase:
    """Defaults for a family: no work per batch, records (and the per-sequence means of
    per-layer rows) straight from the accumulator."""

    name: str
    needs_patterns = False
    needs_z = False
    key_fields: tuple[str, ...] = ("metric", "layer")

    def units_per_batch(self, lm: LoadedModel) -> int:
        return 0

    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int:
        return 0

    def accumulator(self, device: torch.device | str, n_sequences: int) -> MeanAccumulator:
        """The family's state for one run: its running means (a family that keeps more
        between `on_batch` and `finish` returns a subclass holding it)."""
        return MeanAccumulator(device, n_sequences)

    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None:
        return None

    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput:
        return FamilyOutput(
            accumulated_records(self.name, acc, self.key_fields),
            sequence_means=accumulated_sequence_means(self.name, acc, self.key_fields),
        )


class Family(Protocol):
    """A metric family: `units_per_batch` for progress, `on_batch`, then `finish`."""

    name: str
    needs_patterns: bool
    needs_z: bool

    def units_per_batch(self, lm: LoadedModel) -> int: ...
    def units_at_finish(self, lm: LoadedModel, opts: EngineOptions) -> int: ...
    def accumulator(self, device: torch.device | str, n_sequences: int) -> MeanAccumulator: ...
    def on_batch(self, ctx: BatchContext, acc: MeanAccumulator, opts: EngineOptions) -> None: ...
    def finish(
        self,
        lm: LoadedModel,
        acc: MeanAccumulator,
        opts: EngineOptions,
        tick: Callable[[int], None],
    ) -> FamilyOutput: ...
