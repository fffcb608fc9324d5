"""What this machine's matrix units do with each dtype, measured: whether a low-precision run
is fast here or a trap.

bfloat16 is fast only where the hardware multiplies it natively: CUDA tensor cores, and CPUs
with AMX or AVX512-BF16. Elsewhere PyTorch emulates it, and a bfloat16 matmul runs about two
orders of magnitude below float32: 1.3 GFLOP/s against 115 on this project's AVX2 development
CPU (an AMD EPYC, docs/performance.md), so a run a user asks for in bfloat16 to save time would
take ~90 times as long. The rates are measured, not read off CPU flags: one small matmul per
dtype on one thread (88 and 0.6 GFLOP/s on that CPU), once per process and device.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from compute.models.spec import TORCH_DTYPES

# The probe: an [n, n] x [n, n] matmul on one thread, the fastest of as many calls as `PROBE_S`
# seconds hold (at least `PROBE_ROUNDS`) after `PROBE_S / 2` seconds of warm-up. One thread,
# because on a loaded machine a two-thread matmul waits for both threads at every barrier: at
# load 5 on this 2-core machine a 384^2 float32 matmul ran at 3-10 GFLOP/s on two threads and
# over 50 on one. A native dtype gets hundreds of calls, so one descheduled call does not
# decide; an emulated one (~0.2 s a call) gets a few.
PROBE_N = 384
PROBE_ROUNDS = 3
PROBE_S = 0.2

# A low-precision dtype slower than this fraction of float32's matmul rate is reported as slow:
# where it is native it runs 2-12x faster than float32; emulated, 1-2% of it.
SLOW_FRACTION = 1.0


@functools.cache
def matmul_gflops(device: str, dtype: str) -> float:
    """GFLOP/s of a `PROBE_N`-square matmul in `dtype` on `device`, one CPU thread (the
    fastest call)."""
    dt = TORCH_DTYPES[dtype]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(PROBE_N, PROBE_N, generator=g).to(device=device, dtype=dt)
    b = torch.randn(PROBE_N, PROBE_N, generator=g).to(device=device, dtype=dt)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: the rate per core, which other processes barely move
    try:
        return _probe(a, b, sync)
    finally:
        torch.set_num_threads(threads)


def _probe(a: torch.Tensor, b: torch.Tensor, sync: Callable[[], None]) -> float:
    begin = time.perf_counter()  # warm-up
    while time.perf_counter() - begin < PROBE_S / 2:
        a @ b
        sync()
    best, calls, begin = float("inf"), 0, time.perf_counter()
    while calls < PROBE_ROUNDS or time.perf_counter() - begin < PROBE_S:
        start = time.perf_counter()
        a @ b
        sync()
        best, calls = min(best, time.perf_counter() - start), calls + 1
    return 2 * PROBE_N**3 / max(best, 1e-9) / 1e9


def slow_dtype_message(dtype: str, device: str, rate: float, float32_rate: float) -> str | None:
    """What to tell a user whose run is in `dtype` at `rate` GFLOP/s where float32 runs at
    `float32_rate`: None when the dtype is float32 or not slower than `SLOW_FRACTION` of it."""
    if dtype == "float32" or rate >= SLOW_FRACTION * float32_rate:
        return None
    return (
        f"{dtype} is emulated on this {device}: a {dtype} matmul ran at {rate:.1f} GFLOP/s "
        f"against float32's {float32_rate:.1f} ({float32_rate / max(rate, 1e-9):.0f}x slower), "
        f"so this run will take about that much longer than in float32. Native {dtype} needs "
        "a CUDA GPU or a CPU with AMX / AVX512-BF16; float32 (the default) is exact and faster "
        "here"
    )


def dtype_speed_warning(dtype: str, device: str = "cpu") -> str | None:
    """`slow_dtype_message` for this machine, from the measured rates (float32, or a device
    that is not there: no probe; loading the model says what is missing)."""
    if dtype == "float32" or (device.startswith("cuda") and not torch.cuda.is_available()):
        return None
    return slow_dtype_message(
        dtype, device, matmul_gflops(device, dtype), matmul_gflops(device, "float32")
    )
