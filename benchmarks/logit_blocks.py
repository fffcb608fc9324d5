"""The CPU logit block: GFLOP/s of one whole comparison (unembedding, logsumexp, KL, entropy,
agreement, loss) of 1008 rows, by block shape [rows, cols].

    .venv/bin/python benchmarks/logit_blocks.py                  # GPT-2 small's unembedding
    .venv/bin/python benchmarks/logit_blocks.py --d-model 256 --vocab 16384

Random weights (timing does not depend on them); best of --reps runs per shape; the last
column, cols = vocabulary, is whole rows. `compute.engine.logit_chunks` picks the CPU default
from these figures (docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compute.reduce import LogitChunks, compare_distributions, reference_distribution


class RandomUnembedding:
    def __init__(self, d_model: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(d_model, vocab, generator=gen) / d_model**0.5
        self.b = torch.randn(vocab, generator=gen) * 0.1
        self.d_vocab = vocab

    def normed(self, resid: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(resid, resid.shape[-1:])

    def logit_columns(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return torch.addmm(self.b[start:stop], x, self.w[:, start:stop])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--n-rows", type=int, default=1008)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    u = RandomUnembedding(args.d_model, args.vocab)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, args.n_rows, args.d_model, generator=gen)
    targets = torch.randint(0, args.vocab, (args.n_rows,), generator=gen)
    ref = reference_distribution(u, torch.randn(args.n_rows, args.d_model, generator=gen),
                                 targets, chunks=LogitChunks(512, 1024))
    flops = 2 * args.n_rows * args.d_model * args.vocab
    print(f"d_model {args.d_model}, vocabulary {args.vocab}, {args.n_rows} rows, "
          f"{torch.get_num_threads()} threads: GFLOP/s by cols (columns per block)")
    for rows in (128, 256, 512, 1008):
        cells = []
        for cols in (512, 1024, 2048, 4096, 8192, args.vocab):
            if cols > args.vocab:
                continue
            chunks = LogitChunks(rows, cols)
            compare_distributions(u, x, ref, chunks=chunks)
            best = float("inf")
            for _ in range(args.reps):
                start = time.perf_counter()
                compare_distributions(u, x, ref, chunks=chunks)
                best = min(best, time.perf_counter() - start)
            cells.append(f"{cols}: {flops / best / 1e9:5.0f}")
        print(f"rows {rows:5d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
