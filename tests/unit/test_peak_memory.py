"""A run's measured peak memory (`compute.memory.peak_memory`) against the obvious way to see it:
psutil's resident size read while the memory is held."""

from __future__ import annotations

import mmap
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest
import torch

from compute.memory import peak_memory, reset_peak_memory

MIB = 2**20
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / MIB


@contextmanager
def resident_block(mib: int) -> Iterator[None]:
    """`mib` MiB made resident (every page written) and handed back to the system on exit.

    Mapped on its own, not taken from malloc: a process whose heap holds a large free region
    (a test process that has dequantized a checkpoint, say) serves even a 384 MiB tensor from
    it, and then keeps the pages resident when the tensor is freed (seen on the AMX Xeon,
    2026-12-07), which is the heap's business, not the peak's."""
    region = mmap.mmap(-1, mib * MIB)
    block = torch.frombuffer(region, dtype=torch.uint8)
    block.fill_(1)
    try:
        yield
    finally:
        del block
        region.close()


def test_the_peak_is_what_was_resident_at_the_top_and_a_reset_starts_it_again() -> None:
    assert reset_peak_memory("cpu")
    with resident_block(384):
        held = rss_mib()  # the reference: resident while the block is held
    after = peak_memory("cpu", since_reset=True)
    assert after["host_peak_scope"] == "run"
    assert after["device_peak_allocated_mib"] is None
    assert held - 2 <= after["host_peak_rss_mib"] <= held + 64
    # freed and restarted: the next peak is today's resident size, not the block's
    assert reset_peak_memory("cpu")
    again = peak_memory("cpu", since_reset=True)["host_peak_rss_mib"]
    assert again < held - 300
    assert abs(again - rss_mib()) < 64


def test_without_a_reset_it_is_the_processes_lifetime_peak_and_says_so() -> None:
    with resident_block(256):
        held = rss_mib()
    lifetime = peak_memory("cpu", since_reset=False)
    assert lifetime["host_peak_scope"] == "process"
    assert lifetime["host_peak_rss_mib"] >= held - 2
