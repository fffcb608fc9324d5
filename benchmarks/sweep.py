"""Sweep benchmark: the engine against a reference that works like the original study's code.

    .venv/bin/python benchmarks/sweep.py            # full run (a few minutes on 2 CPU cores)
    .venv/bin/python benchmarks/sweep.py --quick    # smaller, for a smoke check
    .venv/bin/python benchmarks/sweep.py --batch-scan   # the default batch against fixed ones

The engine runs at its defaults (no batch size given: the engine chooses it for the device),
because that is what a user gets. `--batch-size N` measures a fixed batch instead.
`--batch-scan` times the default and fixed batch sizes on one workload (issue 11's: 6 layers,
d_model 256, vocabulary 4,096, 96 x 128 tokens, `intervention`), interleaved over rounds so that
load from other processes falls on all of them, and reports the best of the rounds for each.

Measures in one process, on the same GPT-2-shaped model (scaled down) and the same tokens:
  (a) the reference (`tests/reference.py`): batch size 1, the baseline recomputed for every
      intervention, a full hooked forward per intervention, swaps by exchanging weights in a
      copied model;
  (b) the engine (`compute.engine.sweep`).
It prints both times, the speedup, tokens/s, the engine's achieved FLOP/s (FLOPs counted by
`compute.flops`, docs/performance.md) as a fraction of this machine's dense float32 matmul FLOP/s
(measured here, same threads), and the engine's peak RSS at two token budgets 10x apart (each in
a fresh subprocess).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from compute.engine import auto_batch_size, sweep  # noqa: E402
from compute.flops import family_flops  # noqa: E402
from compute.memory import ModelDims  # noqa: E402
from compute.metrics.base import EngineOptions  # noqa: E402
from compute.models import LoadedModel, ModelSpec, load_model  # noqa: E402

FAMILIES = ["intervention", "logit_lens"]


def gpt2_shaped(n_layers: int, d_model: int, d_vocab: int, device: str = "cpu",
                dtype: str = "float32") -> LoadedModel:
    """GPT-2 small's proportions (d_mlp = 4 d_model, d_head = 64), scaled down."""
    arch = dict(n_layers=n_layers, d_model=d_model, n_heads=d_model // 64, d_head=64,
                d_mlp=4 * d_model, d_vocab=d_vocab, n_ctx=1024, act_fn="gelu_new",
                normalization_type="LN")
    return load_model(ModelSpec(source="random", name="bench-gpt2-shaped", architecture=arch,
                                seed=0, dtype=dtype), device)  # type: ignore[arg-type]


def make_tokens(n: int, seq_len: int, d_vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, d_vocab, (n, seq_len), generator=g)
    tokens[:, 0] = 0
    return tokens


def matmul_flops(size: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm up
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * size**3 * reps / (time.perf_counter() - start)


def engine_flops(lm: LoadedModel, seq_len: int, n_sequences: int, families: list[str]) -> float:
    """Dense FLOPs of the sweep, from the formulas of `compute.flops`."""
    return sum(family_flops(ModelDims.of(lm), seq_len, families, parallel=lm.parallel)
               .values()) * n_sequences


def batch_scan(args: argparse.Namespace) -> None:
    """The default batch against fixed batch sizes, best of `--rounds` interleaved rounds."""
    lm = gpt2_shaped(6, 256, 4096)
    tokens = make_tokens(args.scan_sequences, 128, 4096)
    families = ["intervention"]
    flops = engine_flops(lm, 128, args.scan_sequences, families)
    default = auto_batch_size(lm, 128, EngineOptions())
    sizes: list[int | None] = [None, *args.scan_sizes]
    best: dict[int | None, tuple[float, float]] = {}
    sweep(lm, tokens[:1], families, EngineOptions())  # warm up
    for rnd in range(args.rounds):
        for size in sizes:
            cpu, start = time.process_time(), time.perf_counter()
            sweep(lm, tokens, families, EngineOptions(batch_size=size))
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            print(f"round {rnd} batch {size or f'default ({default})':>12}: {wall:7.2f} s wall, "
                  f"{cpu:7.2f} s CPU, {flops / wall / 1e9:6.1f} GFLOP/s", flush=True)
            old = best.get(size, (float("inf"), float("inf")))
            best[size] = (min(old[0], wall), min(old[1], cpu))
    fixed = {k: v for k, v in best.items() if k is not None}
    best_fixed = min(fixed, key=lambda k: fixed[k][0])
    best_fixed_cpu = min(fixed, key=lambda k: fixed[k][1])
    print(f"default batch ({default} sequences): {best[None][0]:.2f} s wall, "
          f"{best[None][1]:.2f} s CPU")
    print(f"best fixed batch by wall time: {best_fixed} ({fixed[best_fixed][0]:.2f} s): default "
          f"is {100 * (best[None][0] / fixed[best_fixed][0] - 1):+.0f}% (target <= +10%)")
    print(f"best fixed batch by CPU time: {best_fixed_cpu} ({fixed[best_fixed_cpu][1]:.2f} s): "
          f"default is {100 * (best[None][1] / fixed[best_fixed_cpu][1] - 1):+.0f}%")


def rss_child(n_sequences: int, args: argparse.Namespace) -> None:
    lm = gpt2_shaped(args.layers, args.d_model, args.vocab)
    tokens = make_tokens(n_sequences, args.seq_len, args.vocab)
    sweep(lm, tokens, FAMILIES, EngineOptions(batch_size=args.batch_size))
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_rss(n_sequences: int, args: argparse.Namespace) -> float:
    cmd = [sys.executable, __file__, "--rss-child", str(n_sequences), "--layers", str(args.layers),
           "--d-model", str(args.d_model), "--vocab", str(args.vocab), "--seq-len",
           str(args.seq_len)]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["peak_rss_mb"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-sequences", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the engine's")
    parser.add_argument("--rss-child", type=int, default=None)
    parser.add_argument("--batch-scan", action="store_true")
    parser.add_argument("--scan-sequences", type=int, default=96)
    parser.add_argument("--scan-sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32, 96])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.batch_scan:
        batch_scan(args)
        return
    if args.quick:
        args.layers, args.n_sequences, args.vocab = 4, 4, 8192
    if args.rss_child is not None:
        rss_child(args.rss_child, args)
        return

    from tests.reference import reference_sweep

    lm = gpt2_shaped(args.layers, args.d_model, args.vocab)
    tokens = make_tokens(args.n_sequences, args.seq_len, args.vocab)
    n_tokens = args.n_sequences * (args.seq_len - 2)
    batch = args.batch_size or f"default ({auto_batch_size(lm, args.seq_len, EngineOptions())})"
    print(f"model: GPT-2-shaped, {args.layers} layers, d_model={args.d_model}, "
          f"vocab={args.vocab}, {lm.n_params / 1e6:.1f}M params; tokens: {args.n_sequences} x "
          f"{args.seq_len} ({n_tokens} evaluated); families: {', '.join(FAMILIES)}; batch: "
          f"{batch}; "
          f"torch threads: {torch.get_num_threads()}")

    peak = matmul_flops()
    start = time.perf_counter()
    reference = reference_sweep(lm, tokens, FAMILIES, EngineOptions())
    t_ref = time.perf_counter() - start

    start = time.perf_counter()
    result = sweep(lm, tokens, FAMILIES, EngineOptions(batch_size=args.batch_size))
    t_engine = time.perf_counter() - start
    achieved = engine_flops(lm, args.seq_len, args.n_sequences, FAMILIES) / t_engine

    engine_kl = {(r.layer, r.component): r.value for r in result.records
                 if r.metric == "intervention.kl"}
    ref_rows = reference.filter(reference["metric"] == "intervention.kl")
    worst = max(abs(engine_kl[(row["layer"], row["component"])] - row["value"])
                for row in ref_rows.iter_rows(named=True))

    small = max(1, args.n_sequences)
    rss_small, rss_large = peak_rss(small, args), peak_rss(10 * small, args)
    growth = (rss_large - rss_small) / rss_small

    print(f"reference (original-code style): {t_ref:8.2f} s  {n_tokens / t_ref:8.1f} tok/s")
    print(f"engine:                          {t_engine:8.2f} s  {n_tokens / t_engine:8.1f} tok/s")
    print(f"speedup:                         {t_ref / t_engine:8.1f} x   (target >= 5x)")
    print(f"max |engine - reference| intervention.kl: {worst:.2e} nats")
    print(f"matmul peak (float32 2048^2):    {peak / 1e9:8.1f} GFLOP/s")
    print(f"engine achieved:                 {achieved / 1e9:8.1f} GFLOP/s = "
          f"{100 * achieved / peak:.0f}% of matmul (target >= 30%)")
    print(f"peak RSS, {small} seqs: {rss_small:.0f} MB; {10 * small} seqs: {rss_large:.0f} MB; "
          f"growth {100 * growth:+.1f}% (target < 10%)")


if __name__ == "__main__":
    main()
