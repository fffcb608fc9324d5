"""The sweep's accumulator: per-sequence sums (metric version 2) against the token-level running
sums it replaced (sum, sum of squares, count per key), on the updates one GPT-2-small-sized batch
makes.

    .venv/bin/python benchmarks/accumulator.py                   # CPU, 8 x 128-token sequences
    .venv/bin/python benchmarks/accumulator.py --device cuda --batch 64

One "batch" is the updates of the intervention family (7 metrics x 4 kinds x 12 layers, one
add_many of 7 keys each) and of the attention family (per head: 12 heads x 9 metrics x 12
layers, and per layer), on float32 values of `batch x 126` evaluated tokens; `--batches` of them
make one run, then the results are finalised. Best of --reps; the old accumulator is rebuilt here
exactly as compute/reduce.py had it. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compute.reduce import MeanAccumulator


class TokenAccumulator:
    """The metric-version-1 accumulator: (sum, sum of squares, count) per key, token-level."""

    def __init__(self, device: str) -> None:
        self._device = torch.device(device)
        self._slots: dict[Any, int] = {}
        self._stats = torch.zeros(0, 3, dtype=torch.float64, device=self._device)
        self._indices: dict[tuple[Any, ...], torch.Tensor] = {}

    def start_batch(self, first: int, n: int) -> None:
        return None

    def _slot_indices(self, keys: Sequence[Any]) -> torch.Tensor:
        known = self._indices.get(tuple(keys))
        if known is not None:
            return known
        new = [k for k in keys if k not in self._slots]
        if new:
            for k in new:
                self._slots[k] = len(self._slots)
            grow = torch.zeros(len(new), 3, dtype=torch.float64, device=self._device)
            self._stats = torch.cat([self._stats, grow])
        index = torch.tensor([self._slots[k] for k in keys], device=self._device)
        self._indices[tuple(keys)] = index
        return index

    def add_many(self, keys: Sequence[Any], values: torch.Tensor) -> None:
        v = values.detach().to(torch.float64)
        update = torch.stack(
            [v.sum(-1), (v * v).sum(-1), torch.full_like(v[:, 0], v.shape[1])], dim=-1)
        slots = self._slot_indices(keys)
        self._stats.index_add_(0, slots, update)

    def results(self) -> list[float]:
        return self._stats.cpu().tolist()


def one_run(acc: Any, values: list[torch.Tensor], batches: int, batch: int) -> None:
    layers, heads = 12, 12
    for b in range(batches):
        acc.start_batch(b * batch, batch)
        i = 0
        for layer in range(layers):
            for kind in ("drop", "swap", "drop_attn", "drop_mlp"):
                acc.add_many([(m, kind, layer) for m in range(7)], values[i % len(values)][:7])
                i += 1
            for metric in range(9):
                v = values[i % len(values)]
                acc.add_many([(metric, layer, h) for h in range(heads)], v[:heads])
                acc.add_many([(metric, layer, None)], v[:1])
                i += 1
    acc.results()


def timed(make: Any, values: list[torch.Tensor], args: argparse.Namespace) -> float:
    best = float("inf")
    for _ in range(args.reps):
        acc = make()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        one_run(acc, values, args.batches, args.batch)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(0)
    tokens = args.batch * (args.seq_len - 2)
    values = [torch.rand(12, tokens, generator=gen).to(args.device) for _ in range(8)]
    n_seq = args.batch * args.batches
    old = timed(lambda: TokenAccumulator(args.device), values, args)
    new = timed(lambda: MeanAccumulator(args.device, n_seq), values, args)
    updates = args.batches * 12 * (4 + 9 * 2)
    print(f"device {args.device}, {args.batches} batches x {args.batch} sequences x "
          f"{args.seq_len - 2} evaluated tokens, {updates} updates")
    print(f"token-level (sum, sum of squares, count): {old * 1e3:8.1f} ms "
          f"({old / updates * 1e6:.1f} us per update)")
    print(f"per-sequence sums:                        {new * 1e3:8.1f} ms "
          f"({new / updates * 1e6:.1f} us per update), x{new / old:.2f}")


if __name__ == "__main__":
    main()
