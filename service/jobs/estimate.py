"""What a run would cost, told before anyone commits to it: its FLOPs (`compute.flops`), its
peak memory (`compute.memory`), and its time on each worker that could take it, from that
worker's measured rate.

- FLOPs: every family's per-sequence formula times the sequences, plus the work done once per
  run (neuron cosines, the induction probe). A family with no formula (the tuned lens's
  training) is named in `notes`, not guessed.
- Memory: the weights (with the fused copies of the fast path) plus the batch's working set —
  every sequence at once, bounded on a CPU worker by its batch budget
  (`compute.memory.batch_budget_bytes`), as the engine plans it — and the host's peak while
  loading.
- Time: a worker's rate is measured, never assumed: the estimated FLOPs of the last jobs it
  finished over the seconds their runs spent computing (every phase but loading the model and
  training a tuned lens, from the run's recorded timings), in the dtype the run asks for; a run
  is timed at that rate plus the median of those jobs' other seconds (loading, delivery), since
  a small job's load can be much of its wall time. What this cannot know: a worker's jobs on
  tiny models run at a lower FLOP rate than a real model's (96 against 141 GFLOP/s on a 2-core
  AMX Xeon, 2026-12-07), so a first estimate from them alone runs long (docs/api.md). A rate does
  not carry over between dtypes: on a CPU without bfloat16 instructions (AVX2 only) PyTorch
  emulates bfloat16, about 40 times slower than float32 on the matrix products, while AMX runs
  it several times faster. A worker that has finished no job in the run's dtype has no rate for
  it, and the estimate says so instead of inventing one.

The model's numbers are the registered ones (a checkpoint folder's config.json before it was
loaded); where they are unknown the estimate is `null` with the reason.
"""

from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from compute.flops import (
    family_flops,
    flop_settings,
    induction_flops,
    neurons_flops,
    screen_calibration_flops,
)
from compute.memory import (
    DTYPE_BYTES,
    ModelDims,
    batch_budget_bytes,
    load_peak_bytes,
    sweep_bytes_per_sequence,
)
from compute.run import RunConfig
from service.schemas.jobs import Estimate, WorkerTime
from service.store.tables import RegisteredModelRow

# Architectures whose MLP is gated (three matrices): their FLOPs and weights follow from that.
GATED = re.compile(
    r"llama|mistral|mixtral|gemma|qwen|olmo|phi3|granite|cohere|smollm|internlm|stablelm|"
    r"deepseek|exaone|glm|nemotron|apertus|hunyuan|seed_oss",
    re.IGNORECASE,
)
# Jobs a worker's rate is measured over (its newest).
RATE_JOBS = 20
TFLOP = 1e12
# A run this many times larger than a worker's largest measured job is timed by extrapolation,
# and the estimate says so: small models' matrix products run at a lower FLOP rate than a larger
# model's (96 against 141 GFLOP/s, the zoo's tiny models against SmolLM2-135M, measured once on
# a 2-core AMX Xeon), so such a time is more likely too long than too short.
EXTRAPOLATED = 10.0


@dataclass(frozen=True)
class Finished:
    """A job a worker finished: what it computed and how long it took."""

    worker: str
    config: RunConfig
    model: RegisteredModelRow
    wall_s: float
    # the seconds its run recorded for computing (`compute.run.RunResult.timings_s`, every phase
    # but "load" and "lens_training", whose FLOPs are not counted); None where the run recorded
    # no timings (then the whole wall time is taken as computing)
    compute_s: float | None = None


# Phases of a run's timings that are not the counted FLOPs' work.
NOT_COMPUTING = ("load", "lens_training")


def computing_seconds(timings_s: dict[str, float] | None) -> float | None:
    """The seconds a run's recorded timings spent on the work its FLOPs count; None without
    timings."""
    if not timings_s:
        return None
    return sum(float(v) for k, v in timings_s.items() if k not in NOT_COMPUTING)


@dataclass(frozen=True)
class Rate:
    """A worker's measured speed in one dtype."""

    flops_per_s: float  # the jobs' FLOPs over their computing seconds
    jobs: int
    overhead_s: float  # the median over the jobs of their other seconds (loading, delivery)
    largest_flops: float  # the largest of those jobs' FLOPs


def extrapolated(flops: float, largest_measured: float) -> bool:
    """Whether a run of `flops` is far larger than every job its rate was measured on (the
    largest of them `largest_measured`), so that its time is an extrapolation."""
    return flops > EXTRAPOLATED * largest_measured


def dims_of(model: RegisteredModelRow) -> ModelDims | None:
    """The model's dimensions from its registered numbers (a checkpoint folder's config.json
    while they are unknown); None where they are not known before loading."""
    numbers = (model.n_layers, model.d_model, model.n_heads, model.d_mlp, model.d_vocab)
    if all(n is not None for n in numbers):
        n_layers, d_model, n_heads, d_mlp, d_vocab = (int(n) for n in numbers)  # type: ignore[arg-type]
        return ModelDims(
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            d_head=d_model // max(n_heads, 1),
            d_mlp=d_mlp,
            d_vocab=d_vocab,
            n_ctx=int(model.n_ctx or 2048),
            gated_mlp=bool(GATED.search(model.architecture or "")),
            learned_positions=bool(re.search(r"gpt2|gptneo|opt", model.architecture or "", re.I)),
        )
    if model.source == "hf_dir":
        return ModelDims.from_hf_config(Path(str(model.spec.get("name", ""))))
    return None


def run_flops(config: RunConfig, dims: ModelDims, *, parallel: bool = False) -> tuple[float, int]:
    """A run's FLOPs and the sequences they were counted for (a source read whole, n = 0, is
    counted as one sequence: its length is not known here; `run_notes` says so)."""
    seq_len = config.tokens.seq_len or min(128, dims.n_ctx)
    n_sequences = config.tokens.n_sequences or 1
    settings = flop_settings(config.options, n_sequences)
    per_sequence = family_flops(dims, seq_len, config.families, parallel=parallel, **settings)
    total = sum(per_sequence.values()) * n_sequences
    if "neurons" in config.families:
        total += neurons_flops(dims)
    if "heads_screen" in config.families:
        total += screen_calibration_flops(
            dims, seq_len, settings["screen_calibration"], parallel=parallel
        )
    if "heads" in config.families:
        total += induction_flops(
            dims, config.options.induction_n, config.options.induction_sequences
        )
    return total, n_sequences


@functools.cache
def uneven_architectures() -> frozenset[str]:
    """Hugging Face classes of the architecture matrix whose blocks are not all attention plus one
    dense MLP (state-space, linear-attention and convolution mixers, blocks without an MLP,
    experts): the FLOP and memory formulas count every block as both, at the width config.json
    gives, so their estimate is of a transformer of the same shape, not of this model."""
    from compute.zoo.architectures import CASES

    return frozenset(
        case.architecture
        for case in CASES
        if case.blocks is not None or any("experts" in m for m in case.mechanisms)
    )


def model_notes(model: RegisteredModelRow) -> list[str]:
    """What the estimate cannot know of this model's blocks."""
    if model.architecture in uneven_architectures():
        return [
            f"{model.architecture}'s blocks are not all attention plus one dense MLP "
            "(state-space or other mixers, experts, blocks without one): FLOPs and memory are "
            "counted as if every block had both, at the configured widths, so they are a "
            "transformer of the same shape's, not this model's"
        ]
    return []


def run_notes(config: RunConfig) -> list[str]:
    notes = []
    if "tuned_lens" in config.families:
        notes.append("the tuned lens's training is not counted (it has no FLOP formula)")
    if not config.tokens.n_sequences:
        notes.append("the token source is read whole: counted as one sequence")
    return notes


def memory(config: RunConfig, dims: ModelDims, device: str) -> tuple[int, int, int, int]:
    """(peak device bytes, weight bytes, bytes per sequence, host bytes while loading)."""
    dtype = config.model.dtype
    width = DTYPE_BYTES.get(dtype, 4)
    seq_len = config.tokens.seq_len or min(128, dims.n_ctx)
    families = set(config.families)
    per_sequence = sweep_bytes_per_sequence(
        dims,
        seq_len,
        width,
        patterns=bool(families & {"attention", "heads", "heads_atp"}),
        z="heads" in families,
    )
    weights = dims.weight_bytes(dtype) + dims.fast_path_extra_bytes(dtype)
    batch = per_sequence * max(config.tokens.n_sequences, 1)
    if not device.startswith("cuda"):  # the engine's CPU budget bounds the batch
        batch = min(batch, batch_budget_bytes(dims.n_params, width, device, None))
    return weights + batch, weights, per_sequence, load_peak_bytes(dims, dtype, device)


def estimate(
    config: RunConfig,
    model: RegisteredModelRow,
    *,
    device: str,
    workers: Iterable[tuple[str, str]],
    finished: Iterable[Finished],
) -> Estimate:
    """The estimate of running `config` of `model` on `device`, timed on each of `workers`
    ((name, device) that could take it) by the rate its `finished` jobs measured."""
    dims = dims_of(model)
    if dims is None:
        return _summarised(
            Estimate(
                flops=None,
                peak_memory_bytes=None,
                weights_bytes=None,
                bytes_per_sequence=None,
                load_peak_host_bytes=None,
                seconds=None,
                workers=[],
                notes=[
                    "the model's numbers are not known before it is loaded (it was registered by "
                    "name, offline): no estimate"
                ],
            )
        )
    flops, _ = run_flops(config, dims)
    peak, weights, per_sequence, load_peak = memory(config, dims, device)
    dtype = config.model.dtype
    rates = measured_rates(finished)
    times = []
    for name, worker_device in workers:
        rate = rates.get((name, dtype))
        times.append(
            WorkerTime(
                worker=name,
                device=worker_device,
                flops_per_s=None if rate is None else float(f"{rate.flops_per_s:.4g}"),
                seconds=(
                    None if rate is None else round(rate.overhead_s + flops / rate.flops_per_s, 1)
                ),
                jobs_measured=0 if rate is None else rate.jobs,
                note=rate_note(name, dtype, rate, rates, flops),
                overhead_s=None if rate is None else round(rate.overhead_s, 1),
                largest_job_flops=None if rate is None else float(f"{rate.largest_flops:.4g}"),
            )
        )
    timed = [t.seconds for t in times if t.seconds is not None]
    notes = run_notes(config) + model_notes(model)
    if not times:
        notes.append("no worker that could take it is up: no time estimate")
    elif not timed:
        notes.append(f"no worker has a measured rate in {dtype} yet: no time estimate")
    return _summarised(
        Estimate(
            flops=float(f"{flops:.4g}"),
            peak_memory_bytes=peak,
            weights_bytes=weights,
            bytes_per_sequence=per_sequence,
            load_peak_host_bytes=load_peak,
            seconds=min(timed) if timed else None,
            workers=times,
            notes=notes,
        )
    )


def _summarised(found: Estimate) -> Estimate:
    return msgspec.structs.replace(found, summary=describe(found))


def measured_rates(finished: Iterable[Finished]) -> dict[tuple[str, str], Rate]:
    """Per worker and dtype: its finished jobs' FLOPs over their computing seconds, and the
    median of their other seconds."""
    work: dict[tuple[str, str], tuple[list[float], list[float], list[float]]] = {}
    for job in finished:
        dims = dims_of(job.model)
        if dims is None or job.wall_s <= 0:
            continue
        computing = job.wall_s if job.compute_s is None else min(job.compute_s, job.wall_s)
        if computing <= 0:
            continue
        flops, _ = run_flops(job.config, dims)
        done = work.setdefault((job.worker, job.config.model.dtype), ([], [], []))
        done[0].append(flops)
        done[1].append(computing)
        done[2].append(job.wall_s - computing)
    return {
        key: Rate(sum(f) / sum(c), len(f), statistics.median(o), max(f))
        for key, (f, c, o) in work.items()
    }


def rate_note(
    worker: str,
    dtype: str,
    rate: Rate | None,
    rates: dict[tuple[str, str], Rate],
    flops: float | None = None,
) -> str:
    """What a worker's time in an estimate rests on, or why it has none; for a run of `flops`
    far larger than every job measured, that the time is extrapolated."""
    if rate is not None:
        note = (
            f"measured over its last {rate.jobs} finished {dtype} job(s): their FLOPs over the "
            f"seconds they spent computing, plus {rate.overhead_s:.3g} s (their median) for "
            "loading the model and delivering the results"
        )
        if flops is not None and extrapolated(flops, rate.largest_flops):
            note += (
                f"; extrapolated: the largest of those jobs was {_tflop(rate.largest_flops)}, "
                f"this run is {flops / rate.largest_flops:,.0f} times that, and a small model's "
                "matrix products run at a lower FLOP rate than a larger model's, so this time "
                "is more likely too long than too short"
            )
        return note
    others = sorted(d for w, d in rates if w == worker and d != dtype)
    if not others:
        return "no measured rate: this worker has finished no job yet"
    return (
        f"no measured rate in {dtype}: none of this worker's last {RATE_JOBS} finished jobs "
        f"ran in it; its rate in {' and '.join(others)} does not carry over (a CPU without "
        "bfloat16 instructions emulates bfloat16 tens of times slower than float32, one with "
        "AMX runs it several times faster)"
    )


def above_threshold(found: Estimate, max_tflop: float | None) -> bool:
    """Whether an automatic default run of this estimate waits to be asked for: above the
    threshold, or of unknown cost (with a threshold set)."""
    if max_tflop is None:
        return False
    return found.flops is None or found.flops > max_tflop * TFLOP


def describe(found: Estimate) -> str:
    """The estimate in one line: FLOPs, peak memory, time on the fastest measured worker."""
    if found.flops is None:
        return "cost unknown (" + "; ".join(found.notes) + ")"
    parts = [f"{found.flops / TFLOP:.3g} TFLOP"]
    if found.peak_memory_bytes is not None:
        memory = f"peak memory {_bytes(found.peak_memory_bytes)}"
        # Loading holds the checkpoint's and the processed float32 tensors beside the model: on a
        # CPU worker that, not the sweep, is usually the process's peak, so both are named.
        if found.load_peak_host_bytes is not None:
            memory += f" ({_bytes(found.load_peak_host_bytes)} of host memory while loading)"
        parts.append(memory)
    if found.seconds is not None:
        fastest = min((t for t in found.workers if t.seconds is not None), key=_seconds)
        timed = f"{_duration(found.seconds)} on {fastest.worker}"
        if (
            found.flops is not None
            and fastest.largest_job_flops
            and extrapolated(found.flops, fastest.largest_job_flops)
        ):
            ratio = found.flops / fastest.largest_job_flops
            timed += f" (extrapolated from jobs at most 1/{ratio:,.0f} of this one)"
        parts.append(timed)
    else:
        parts.append("time unknown: no worker has a measured rate in this dtype yet")
    return ", ".join(parts)


def _tflop(flops: float) -> str:
    return f"{flops / TFLOP:.3g} TFLOP"


def _seconds(t: WorkerTime) -> float:
    return t.seconds if t.seconds is not None else float("inf")


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    if seconds < 120:
        return f"about {seconds:.0f} s"
    if seconds < 7200:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


def _bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
