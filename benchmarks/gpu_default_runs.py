"""The default run of SmolLM2-135M's and Gemma 3 270M's geometries on a GPU, in both dtypes
(issue 37, item 4): seconds by part of the run and the share of the device's matmul rate.

    .venv/bin/python benchmarks/gpu_default_runs.py --out gpu_default_runs.json
    .venv/bin/python benchmarks/gpu_default_runs.py --device cpu --models smollm2-135m \\
        --dtypes float32 --n-sequences 2 --seq-len 16       # the same code on a CPU (a check)

Not run in CI (no GPU there). Each (model, dtype) is one fresh process (imports, checkpoint
load, the run), as `strata compute` would be: `compute.run.compute_run` with the default
families and options (automatic batch, the fused reductions) on 32 x 128 tokens. What differs
from a user's `strata compute --model <gguf>`: the weights are random at the model's exact
geometry (benchmarks/geometry.py builds the checkpoint; the GGUF files are larger than what
travels to a lent GPU machine), the tokens are seeded random ids instead of the built-in
corpus, and nothing is stored. Timing does not depend on the weights' values or the ids.

Per run: wall_s (the whole child process), timings_s (load, clean passes, each family, as the
run's metadata gives them), the FLOPs of the run by `compute.flops`, achieved TFLOP/s over the
sweep, and its share of the dense matmul rate of the same dtype measured in the same process
(8192^2 bfloat16, 4096^2 float32: PyTorch's default, no TF32), and the peak device memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T_PROCESS = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = ("smollm2-135m", "gemma3-270m")


def matmul_size(device: str, dtype: str) -> int:
    """The yardstick's square size: 8192 in bfloat16 on a GPU, 4096 in float32 there, 1024 on a
    CPU (a check, not a figure)."""
    if device == "cpu":
        return 1024
    return 8192 if dtype == "bfloat16" else 4096


def child(args: argparse.Namespace) -> None:
    import torch

    from benchmarks.geometry import build_checkpoint, counted_flops, matmul_flops, token_file
    from compute.metrics import DEFAULT_FAMILIES
    from compute.models import load_model, resolve_model_spec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    cuda = args.device.startswith("cuda")
    peak = matmul_flops(args.device, args.dtype, size=matmul_size(args.device, args.dtype))
    path = build_checkpoint(args.child)
    spec = resolve_model_spec(str(path), dtype=args.dtype)
    start = time.perf_counter()
    lm = load_model(spec, args.device)
    if cuda:
        torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    tokens = TokenSpec(source="npy", path=str(token_file(args.n_sequences, args.seq_len,
                                                          lm.d_vocab_real)),
                       n_sequences=0, seq_len=0)
    config = RunConfig(model=spec, tokens=tokens, families=DEFAULT_FAMILIES)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = compute_run(config, device=args.device, lm=lm)
    if cuda:
        torch.cuda.synchronize()
    run_s = time.perf_counter() - start
    flops = counted_flops(lm, DEFAULT_FAMILIES, args.n_sequences, args.seq_len)
    row: dict[str, Any] = {
        "model": args.child, "dtype": args.dtype, "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__, "n_sequences": args.n_sequences, "seq_len": args.seq_len,
        "tokens": result.tokens_evaluated, "load_s": load_s, "run_s": run_s,
        "wall_s": time.perf_counter() - T_PROCESS, "timings_s": result.timings_s,
        "tflop": flops / 1e12, "tflops": flops / run_s / 1e12,  # the model loaded before
        "matmul_tflops": peak / 1e12, "share_of_matmul": flops / run_s / peak,
    }
    if cuda:
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print("RESULT " + json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n-sequences", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        for model in args.models.split(","):
            cmd = [sys.executable, __file__, "--child", model, "--dtype", dtype, "--device",
                   args.device, "--n-sequences", str(args.n_sequences), "--seq-len",
                   str(args.seq_len)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                      cwd=ROOT)
            except subprocess.TimeoutExpired:
                print(f"{model} {dtype}: over {args.timeout} s, stopped", flush=True)
                rows.append({"model": model, "dtype": dtype, "timed_out_s": args.timeout})
                continue
            found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not found:
                print(f"{model} {dtype}: failed ({done.returncode})\n{done.stderr[-2500:]}",
                      flush=True)
                rows.append({"model": model, "dtype": dtype, "failed": done.stderr[-2500:]})
                continue
            row = json.loads(found[-1].removeprefix("RESULT "))
            rows.append(row)
            parts = ", ".join(f"{k} {v:.1f}" for k, v in row["timings_s"].items())
            print(f"{model} {dtype}: {row['wall_s']:.1f} s whole process (load"
                  f" {row['load_s']:.1f} s, run {row['run_s']:.1f} s), {row['tflop']:.1f}"
                  f" TFLOP at {row['tflops']:.1f} TFLOP/s = {100 * row['share_of_matmul']:.1f}%"
                  f" of {row['matmul_tflops']:.0f} TFLOP/s matmul; {parts}", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
