"""Memory a model needs, estimated from its dimensions before anything is loaded.

`ModelDims` holds the numbers the estimate needs (from a TransformerLens config, a Hugging Face
config.json or a loaded model). From them:

- `weight_bytes`: parameters in the run's dtype (TransformerLens keeps W_E and W_U separate even
  when a checkpoint ties them, so both count);
- `load_peak_bytes`: host memory while loading — the checkpoint's float32 tensors, the processed
  float32 state dict and, on a CPU, the model itself (on a GPU the model lives on the device);
- `sweep_bytes_per_sequence`: the clean-pass cache of one sequence (residual at every point,
  attention and MLP writes, z and patterns when a family needs them, the reference
  distribution) plus the working set of one intervention.

`check_fits` compares these with what the devices have and raises `ModelTooLargeError` with the
figures, instead of letting a load die halfway through; where one device does not hold a model
but the worker's devices together do, it returns the plan that splits it over them
(`compute.placement`, from `placement_needs`).

How the process holds memory it has freed is tuned here too: glibc's allocator hands large frees
back to the system while a model loads (`allocator_for_loading`), keeps few-MB temporaries for
reuse while sweeping (`allocator_for_sweeping`), and trims its heap between batches
(`release_free_memory`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compute.errors import ModelTooLargeError
from compute.placement import (
    DeviceMemory,
    Placement,
    PlacementNeeds,
    one_device,
    plan_placement,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class ModelDims:
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int  # 0 for attention-only models
    d_vocab: int
    n_ctx: int
    gated_mlp: bool = False
    learned_positions: bool = True
    n_kv_heads: int | None = None  # grouped-query attention's key/value heads (None: n_heads)

    @classmethod
    def of(cls, lm: Any) -> ModelDims:
        """From a `LoadedModel` (or anything with a TransformerLens `cfg`)."""
        return cls.from_tl_config(lm.cfg)

    @classmethod
    def from_tl_config(cls, cfg: Any) -> ModelDims:
        def get(key: str, default: Any = None) -> Any:
            value = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
            return default if value is None else value

        d_model, n_heads = int(get("d_model")), int(get("n_heads", 1))
        attn_only = bool(get("attn_only", False))
        return cls(
            n_layers=int(get("n_layers")),
            d_model=d_model,
            n_heads=n_heads,
            d_head=int(get("d_head", d_model // n_heads)),
            d_mlp=0 if attn_only else int(get("d_mlp", 4 * d_model)),
            d_vocab=int(get("d_vocab_out", get("d_vocab"))),
            n_ctx=int(get("n_ctx")),
            gated_mlp=bool(get("gated_mlp", False)),
            learned_positions=get("positional_embedding_type", "standard") == "standard",
            n_kv_heads=get("n_key_value_heads"),
        )

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelDims | None:
        """From a checkpoint's config.json (GPT-2, GPT-NeoX and Llama-style names); None when
        the names are not recognised (the estimate is then skipped, not guessed)."""
        try:
            raw = json.loads((Path(path) / "config.json").read_text())
        except (OSError, ValueError):
            return None

        def pick(*names: str) -> Any:
            return next((raw[n] for n in names if raw.get(n) is not None), None)

        d_model = pick("n_embd", "hidden_size", "d_model")
        n_layers = pick("n_layer", "num_hidden_layers", "n_layers")
        n_heads = pick("n_head", "num_attention_heads", "n_heads")
        vocab = pick("vocab_size")
        if d_model is None or n_layers is None or n_heads is None or vocab is None:
            return None
        d_mlp = int(pick("n_inner", "intermediate_size", "d_ff") or 4 * d_model)
        model_type = raw.get("model_type", "")
        return cls(
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            d_head=pick("head_dim") or d_model // n_heads,
            d_mlp=d_mlp,
            d_vocab=vocab,
            n_ctx=pick("n_positions", "max_position_embeddings", "n_ctx") or 2048,
            gated_mlp=model_type
            in ("llama", "mistral", "gemma", "gemma2", "qwen2", "qwen3", "olmo", "olmo2"),
            learned_positions=model_type in ("gpt2", "gpt_neo", "opt"),
            n_kv_heads=pick("num_key_value_heads"),
        )

    @property
    def n_params(self) -> int:
        """Parameters as TransformerLens holds them (untied W_E and W_U, biases included)."""
        d, hd = self.d_model, self.n_heads * self.d_head
        attn = 4 * d * hd + 3 * hd + d
        mlp = (
            0 if self.d_mlp == 0 else (3 if self.gated_mlp else 2) * d * self.d_mlp + self.d_mlp + d
        )
        norms = (4 if self.d_mlp else 2) * d  # gain and bias of each norm
        embed = (
            2 * self.d_vocab * d + self.d_vocab + (self.n_ctx * d if self.learned_positions else 0)
        )
        return self.n_layers * (attn + mlp + norms) + embed + 2 * d

    def weight_bytes(self, dtype: str = "float32") -> int:
        return self.n_params * DTYPE_BYTES[dtype]

    def fast_path_extra_bytes(self, dtype: str = "float32") -> int:
        """The fused QKV and flattened W_O laid out once per layer by `compute.blocks` (an upper
        bound under grouped-query attention), and a gated MLP's fused W_gate and W_in."""
        gated = 2 * self.d_model * self.d_mlp if self.gated_mlp else 0
        return (
            self.n_layers
            * (4 * self.d_model * self.n_heads * self.d_head + gated)
            * DTYPE_BYTES[dtype]
        )


def load_peak_bytes(dims: ModelDims, dtype: str, device: str) -> int:
    """Host memory at the peak of loading: checkpoint tensors and processed state dict in
    float32, plus the model itself when it lives on the CPU. Since the processing steps free
    their input as they go (`compute.models.bridge.steps_free_their_input`) a float32 load on a
    CPU holds the model, one processed copy and the largest tensor: on the three processed real
    models this is 6% (SmolLM2-135M) to 43% (Qwen2.5-Coder-1.5B) above the whole process's
    measured peak, imports included (docs/performance.md, "Memory from load to last batch")."""
    host = 2 * dims.weight_bytes("float32")
    if not device.startswith("cuda"):
        host += dims.weight_bytes(dtype)
    return host


def sweep_bytes_per_sequence(
    dims: ModelDims,
    seq_len: int,
    dtype_bytes: int,
    *,
    patterns: bool,
    z: bool,
    probs: bool = True,
) -> int:
    """Device memory one sequence adds to a batch of the sweep. `probs`: the reference keeps
    P whole ([T, vocab] float32), not as W_U p ([T, d_model] float64; `compute.reduce`)."""
    t, d, n_layers = seq_len, dims.d_model, dims.n_layers
    cache = (3 * n_layers + 1) * t * d * dtype_bytes  # resid 0..L, attn and MLP writes
    if z:
        cache += n_layers * t * dims.n_heads * dims.d_head * dtype_bytes
    if patterns:
        cache += n_layers * dims.n_heads * t * t * 4
    reference = (t * dims.d_vocab * 4 if probs else t * (d + 1) * 8) + 4 * t * 4
    return cache + reference + variant_bytes_per_sequence(dims, seq_len, dtype_bytes)


def graph_bytes_per_sequence(dims: ModelDims, seq_len: int, dtype_bytes: int) -> int:
    """A forward with gradients (the head screen), per sequence: what every block keeps for the
    backward (about one intervention's working set, and two [heads, T, T] score tensors) and
    the gradient of a residual per block."""
    t = seq_len
    per_block = (
        variant_bytes_per_sequence(dims, seq_len, dtype_bytes)
        + 2 * dims.n_heads * t * t * dtype_bytes
        + t * dims.d_model * dtype_bytes
    )
    return dims.n_layers * per_block


def screen_bytes_per_sequence(
    dims: ModelDims, seq_len: int, dtype_bytes: int, samples: int = 0
) -> int:
    """The head screen (`heads_screen`), per sequence: a forward with gradients
    (`graph_bytes_per_sequence`) and the float32 gradients of the residual after every block —
    the loss's and one per drawn target set (`samples`) — kept until each head's exact block
    output is dotted with them."""
    return graph_bytes_per_sequence(dims, seq_len, dtype_bytes) + (
        (1 + samples) * dims.n_layers * seq_len * dims.d_model * 4
    )


# On a CPU the batch's memory (clean-pass cache, reference distribution, one intervention's
# working set) is bounded by half the weights' bytes but at least 64 MiB: with GPT-2's
# 50,257-token vocabulary the reference distribution alone is 26 MB per 128-token sequence, and
# 1024 tokens of every family put a whole run at 3.1x its weights. Throughput does not suffer:
# GPT-2 small's `intervention` ran at 24.7, 25.5 and 24.5 tokens/s with 4, 6 and 8 sequences.
CPU_BATCH_WEIGHTS_FRACTION = 0.5
CPU_MIN_BATCH_BYTES = 64 * 2**20


def batch_budget_bytes(
    n_params: int, dtype_bytes: int, device: str, memory_budget_mb: int | None
) -> int:
    """What a batch's working memory may take beyond the weights: `memory_budget_mb` if set;
    on a GPU 85% of the device's free memory; on a CPU `CPU_BATCH_WEIGHTS_FRACTION` of the
    weights' bytes, at least `CPU_MIN_BATCH_BYTES`."""
    if memory_budget_mb is not None:
        return memory_budget_mb * 2**20
    if str(device).startswith("cuda"):
        return int(0.85 * device_free_bytes(device))
    return max(CPU_MIN_BATCH_BYTES, int(CPU_BATCH_WEIGHTS_FRACTION * n_params * dtype_bytes))


def variant_bytes_per_sequence(dims: ModelDims, seq_len: int, dtype_bytes: int) -> int:
    """One intervention in flight, per sequence: a block's temporaries (QKV, MLP hidden and its
    activation, a few residuals) and the residual it restarts from. Head ablation runs a group
    of such variants at once (`compute.metrics.heads.head_group_size`)."""
    t, d = seq_len, dims.d_model
    return t * (3 * dims.n_heads * dims.d_head + 2 * max(dims.d_mlp, d) + 6 * d) * dtype_bytes


def host_available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def device_free_bytes(device: str) -> int:
    if str(device).startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return host_available_bytes()


def placement_needs(dims: ModelDims, dtype: str, seq_len: int = 128) -> PlacementNeeds:
    """What the placement plan (`compute.placement`) weighs, from the model's dimensions: the
    weights of the home device's pieces and of one block (the fast path's fused copies
    included, as in `check_fits`), one sequence of the sweep on the home device, and on a
    device of blocks one block's working set with the residuals moved in and out."""
    bytes_ = DTYPE_BYTES[dtype]
    total = dims.weight_bytes(dtype) + dims.fast_path_extra_bytes(dtype)
    d, v = dims.d_model, dims.d_vocab
    home = (2 * v * d + v + (dims.n_ctx * d if dims.learned_positions else 0) + 2 * d) * bytes_
    block = (total - home) // dims.n_layers
    return PlacementNeeds(
        n_layers=dims.n_layers,
        home_weights=total - block * dims.n_layers,
        block_weights=block,
        home_per_sequence=sweep_bytes_per_sequence(dims, seq_len, bytes_, patterns=False, z=False),
        block_per_sequence=block_bytes_per_sequence(dims, seq_len, bytes_, patterns=False, z=False),
    )


def block_bytes_per_sequence(
    dims: ModelDims, seq_len: int, dtype_bytes: int, *, patterns: bool, z: bool
) -> int:
    """What one sequence of a batch takes on a device that holds blocks of a split model but
    not its home: one block's working set (`variant_bytes_per_sequence`), the residual moved
    in and the residual and writes moved out, and the pattern and z a block returns when a
    family keeps them."""
    t, d = seq_len, dims.d_model
    moved = 4 * t * d * dtype_bytes
    extra = (dims.n_heads * t * t * 4 if patterns else 0) + (
        t * dims.n_heads * dims.d_head * dtype_bytes if z else 0
    )
    return variant_bytes_per_sequence(dims, seq_len, dtype_bytes) + moved + extra


def visible_devices(device: str) -> list[DeviceMemory]:
    """The devices a run on `device` may use, with their free bytes: for `cuda` (no index)
    every CUDA device this process sees, the current one first (a worker started with several
    GPUs visible splits a model that one does not hold over them); an indexed device alone (a
    worker per GPU sees one); the host for the CPU."""
    if device == "cuda" and torch.cuda.is_available():
        first = torch.cuda.current_device()
        order = [first, *(i for i in range(torch.cuda.device_count()) if i != first)]
        return [DeviceMemory(f"cuda:{i}", device_free_bytes(f"cuda:{i}")) for i in order]
    return [DeviceMemory(device, device_free_bytes(device))]


def plan_devices(
    dims: ModelDims,
    dtype: str,
    device: str,
    *,
    name: str,
    seq_len: int = 128,
    devices: Sequence[DeviceMemory] | None = None,
) -> Placement:
    """Where the model goes (`compute.placement.plan_placement`): all on `device` where that
    holds its weights and one sequence of the sweep (on a CPU: always, the host being checked
    by `check_fits`), else split over the devices `visible_devices(device)` gives, or over
    `devices` where given (a test places a model over several CPU "devices" so); refused
    (`ModelTooLargeError`) where even all of them together do not hold it."""
    needs = placement_needs(dims, dtype, seq_len)
    figures = (
        f"{name}: {dims.n_params / 1e9:.2f}B parameters, {dims.n_layers} layers, "
        f"d_model {dims.d_model}, vocabulary {dims.d_vocab}"
    )
    if devices is not None:
        return plan_placement(needs, devices, what=figures, dtype=dtype)
    if not str(device).startswith("cuda"):
        return one_device(device, needs, host_available_bytes())
    found = visible_devices(device)
    placement = plan_placement(needs, found, what=figures, dtype=dtype)
    # on one device: the device as the run names it (`cuda`, not `cuda:0`)
    return placement if placement.split else one_device(device, needs, found[0].free_bytes)


def check_fits(
    dims: ModelDims,
    dtype: str,
    device: str,
    *,
    name: str,
    seq_len: int = 128,
    devices: Sequence[DeviceMemory] | None = None,
) -> Placement:
    """Refuse, before loading, a model whose loading will not fit the host, or whose weights
    (plus one sequence of the sweep) even all of its devices together will not hold; else
    where it goes (`plan_devices`)."""
    placement = plan_devices(dims, dtype, device, name=name, seq_len=seq_len, devices=devices)
    host_need = load_peak_bytes(dims, dtype, device)
    host_have = host_available_bytes()
    if host_need > host_have:
        what = (
            f"to process its weights in float32 before moving them to {device}"
            if str(device).startswith("cuda")
            else f"to load in {dtype} (checkpoint and processed weights in float32, then the model)"
        )
        raise ModelTooLargeError(
            f"{name}: {dims.n_params / 1e9:.2f}B parameters, {dims.n_layers} layers, d_model "
            f"{dims.d_model}, vocabulary {dims.d_vocab} needs about {host_need / GIB:.1f} GiB "
            f"of host memory {what}, but {host_have / GIB:.1f} GiB is available."
        )
    return placement


# glibc malloc options (mallopt parameters).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc on Linux (mallopt, malloc_trim), else None. Looked up
    once: `find_library` runs a subprocess, and `release_free_memory` is called per batch."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _mallopt(*settings: tuple[int, int]) -> None:
    """Set glibc malloc parameters; a no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        for param, value in settings:
            libc.mallopt(param, value)


def allocator_for_loading() -> None:
    """Make glibc hand every freed allocation above 256 KiB back to the system at once.

    By default glibc raises its mmap threshold each time a large block is freed (up to 32 MB),
    after which tensors of a few MB come from the heap and their memory is kept, fragmented,
    when they are freed: loading GPT-2 small then left 0.6 GB more resident than the weights,
    and peaked 0.3 GB higher. A fixed threshold keeps the process at weights plus what is live.
    Process-wide; `allocator_for_sweeping` undoes it.
    """
    _mallopt((_M_MMAP_THRESHOLD, 256 * 1024), (_M_TRIM_THRESHOLD, 128 * 1024))


def allocator_for_sweeping() -> None:
    """Keep freed temporaries of up to 32 MiB in the heap for reuse while sweeping.

    The sweep allocates and frees the same few-MB temporaries (logit blocks, MLP activations)
    thousands of times. Handed back to the system at each free (as while loading), every one
    is page-faulted in afresh on its next use: an `intervention` sweep of GPT-2 small took 36 s
    that way, 26 s with glibc's default and 21 s with this setting. Larger tensors (the
    reference distribution, caches) are still mapped and unmapped on their own. Process-wide.
    """
    _mallopt((_M_MMAP_THRESHOLD, 32 * 2**20), (_M_TRIM_THRESHOLD, 64 * 2**20))


def release_free_memory() -> None:
    """Hand the heap's free memory back to the system (glibc `malloc_trim`): called between
    batches, so what one batch freed does not stay resident under the next step (the neurons
    family, the next model). A no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# The peak a run reached, measured: what `compute.run.RunResult.memory` reports beside its times.
# On the host it is the kernel's high-water mark of the process's resident memory (VmHWM), which
# Linux lets a process restart at its current size (writing 5 to /proc/self/clear_refs, since
# 4.0): a worker that ran other jobs before, or holds models in its cache, then reports this
# run's peak, not its lifetime's. Where that is not possible the figure is the process's
# lifetime peak (getrusage), and `host_peak_scope` says so. On a CUDA device it is PyTorch's
# peak of allocated memory (its caching allocator's reserve, and other processes, not included).
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_memory(device: str) -> bool:
    """Start a new peak here: the host's high-water mark where the kernel allows it (returns
    whether it did) and, on CUDA, PyTorch's peak allocation on `device`."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _vm_hwm_kib() is not None


def peak_memory(device: str, *, since_reset: bool) -> dict[str, Any]:
    """The peaks since `reset_peak_memory` (MiB): `host_peak_rss_mib` with its
    `host_peak_scope` ("run" when the reset took, else "process": its lifetime), and
    `device_peak_allocated_mib` on CUDA (null elsewhere)."""
    kib = _vm_hwm_kib() if since_reset else None
    scope = "run" if kib is not None else "process"
    if kib is None:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; bytes on macOS
        kib = peak // 1024 if sys.platform == "darwin" else peak
    cuda = None
    if str(device).startswith("cuda") and torch.cuda.is_available():
        cuda = round(torch.cuda.max_memory_allocated(torch.device(device)) / 2**20)
    return {
        "host_peak_rss_mib": round(kib / 1024),
        "host_peak_scope": scope,
        "device_peak_allocated_mib": cuda,
    }


def _vm_hwm_kib() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
