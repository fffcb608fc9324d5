"""The cost of the width-calibrated neuron classes' null next to the neurons family it serves.

    .venv/bin/python benchmarks/neurons_null.py            # both shapes below, 1 thread
    .venv/bin/python benchmarks/neurons_null.py --threads 2

The null is `NULL_DIRECTIONS` (4096) extra rows of the family's moment computation, once per
model. This times `null_moments` and one layer's `neuron_moments` (random weights: timing does not
depend on them; CPU logit blocks as the engine picks them) at two shapes, and extrapolates the
family's moments to all layers:
  - a 30-layer model with d_model 576, 1536 neurons per layer, a 49,152-token vocabulary
    (SmolLM2-135M's shape);
  - GPT-2 small: 12 layers, d_model 768, 3072 neurons per layer, 50,257 tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compute.metrics.base import CPU_LOGIT_BLOCK_MB, CPU_LOGIT_COLS
from compute.metrics.neurons import NULL_DIRECTIONS, neuron_moments, null_moments
from compute.reduce import LogitChunks

SHAPES = {"576x49152 (30 x 1536 neurons)": (576, 49_152, 1536, 30),
          "768x50257 (GPT-2 small, 12 x 3072)": (768, 50_257, 3072, 12)}


def best_of(reps: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads}, null directions={NULL_DIRECTIONS}, best of {args.reps}")
    for label, (d_model, vocab, d_mlp, n_layers) in SHAPES.items():
        gen = torch.Generator().manual_seed(0)
        u = torch.randn(d_model, vocab, generator=gen)
        u = u / u.norm(dim=0, keepdim=True)
        w_out = torch.randn(d_mlp, d_model, generator=gen)
        cols = min(vocab, CPU_LOGIT_COLS)
        chunks = LogitChunks(rows=max(1, CPU_LOGIT_BLOCK_MB * 2**20 // 4 // cols), cols=cols)
        with torch.inference_mode():
            layer_s = best_of(args.reps, partial(neuron_moments, w_out, u, chunks=chunks))
            null_s = best_of(args.reps, partial(null_moments, u, chunks=chunks))
        family_s = layer_s * n_layers
        print(f"{label}: one layer {layer_s:.2f} s, family moments ~{family_s:.1f} s, "
              f"null {null_s:.2f} s = {100 * null_s / family_s:.1f}% of the family's moments")


if __name__ == "__main__":
    main()
