"""Where a sweep's time goes, float32 against bfloat16, in one process (docs/performance.md).

    .venv/bin/python benchmarks/profile_dtype.py --model smollm2 --families intervention
    .venv/bin/python benchmarks/profile_dtype.py --model zoo:tiny-4l-s0 --families heads --profile

The same model is loaded in float32 and in bfloat16; each runs the named families' sweep on the
same seeded tokens (n_sequences x seq_len), alternately, `--rounds` times; the matmul yardsticks
at the model's own shapes (a block's QKV, MLP and output projections and one unembedding block,
1,024 rows) are measured in the same process, each dtype, before every round. With `--profile`
one more sweep of each dtype runs under `torch.profiler` and the top ops by self CPU time are
printed. Wall and CPU seconds are printed per round; on a shared machine compare ratios within
one run, never figures across runs.

`--model smollm2` is SmolLM2-135M-Instruct's GGUF (`scripts/fetch_smollm2.sh`), dequantized into
the tests' cache beside it; any other value is a model reference (`zoo:tiny-4l-s0`, a checkpoint
folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2 = Path.home() / ".cache" / "strata" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_ref(name: str) -> str:
    if name != "smollm2":
        return name
    from compute import gguf

    path = Path(os.environ.get("STRATA_SMOLLM2_GGUF") or SMOLLM2)
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run scripts/fetch_smollm2.sh")
    gguf.set_cache_dir(path.parent / "strata-data" / "gguf")  # the tests' cache
    return str(path)


def rate(a_shape: tuple[int, int], b_shape: tuple[int, int], dtype: object, reps: int = 10,
         rounds: int = 3) -> float:
    """GFLOP/s of a [m, k] x [k, n] matmul, best of `rounds`."""
    import torch

    a = torch.randn(*a_shape).to(dtype)  # type: ignore[arg-type]
    b = torch.randn(*b_shape).to(dtype)  # type: ignore[arg-type]
    a @ b
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = max(best, 2 * a_shape[0] * a_shape[1] * b_shape[1] * reps /
                   (time.perf_counter() - start))
    return best / 1e9


def yardsticks(lm: object, rows: int = 1024) -> dict[str, dict[str, float]]:
    """fp32 and bf16 matmul rates at the model's own shapes."""
    import torch

    cfg = lm.cfg  # type: ignore[attr-defined]
    d, hd = cfg.d_model, cfg.n_heads * cfg.d_head
    kv = (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head
    mlp_cols = cfg.d_mlp * (2 if cfg.gated_mlp else 1)
    shapes = {
        "qkv": ((rows, d), (d, hd + 2 * kv)),
        "attn_out": ((rows, hd), (hd, d)),
        "mlp_in": ((rows, d), (d, mlp_cols)),
        "mlp_out": ((rows, cfg.d_mlp), (cfg.d_mlp, d)),
        "unembed_block": ((512, d), (d, 1024)),
        "unembed": ((rows, d), (d, cfg.d_vocab)),
        "2048^2": ((2048, 2048), (2048, 2048)),
    }
    return {name: {str(dt).removeprefix("torch."): rate(a, b, dt)
                   for dt in (torch.float32, torch.bfloat16)}
            for name, (a, b) in shapes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--families", default="intervention")
    parser.add_argument("--n-sequences", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    parser.add_argument("--parity-tolerance", type=float, default=None,
                        help="override the load's float32 parity tolerance (nats; profiling "
                        "a model that fails it)")
    args = parser.parse_args()
    if args.parity_tolerance is not None:
        from compute.models import parity

        parity.PARITY_TOLERANCE = args.parity_tolerance

    import torch

    from compute.engine import sweep
    from compute.metrics.base import EngineOptions
    from compute.models import load_model, resolve_model_spec

    ref = model_ref(args.model)
    families = args.families.split(",")
    dtypes = args.dtypes.split(",")
    models = {dt: load_model(resolve_model_spec(ref, dtype=dt)) for dt in dtypes}  # type: ignore[arg-type]
    lm0 = models[dtypes[0]]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, lm0.d_vocab_real, (args.n_sequences, args.seq_len), generator=g)
    tokens[:, 0] = lm0.bos_token_id
    opts = EngineOptions()
    results: dict[str, object] = {"model": args.model, "families": families,
                                  "tokens": list(tokens.shape), "rounds": []}
    print(f"{args.model}: {families} on {tuple(tokens.shape)}, threads "
          f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        marks = yardsticks(lm0)
        row: dict[str, object] = {"yardsticks": marks}
        print("  yardsticks GFLOP/s fp32 / bf16: " + ", ".join(
            f"{k} {v['float32']:.0f}/{v['bfloat16']:.0f}" for k, v in marks.items()), flush=True)
        for dt, lm in models.items():
            start, cpu = time.perf_counter(), time.process_time()
            sweep(lm, tokens, families, opts)
            wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
            row[dt] = {"wall_s": wall, "cpu_s": cpu_s}
            print(f"  round {r} {dt:9s} wall {wall:7.2f} s  cpu {cpu_s:7.2f} s", flush=True)
        if len(dtypes) == 2:
            ratio = row[dtypes[0]]["wall_s"] / row[dtypes[1]]["wall_s"]  # type: ignore[index]
            print(f"  round {r} {dtypes[0]} / {dtypes[1]} wall: {ratio:.2f}x", flush=True)
        results["rounds"].append(row)  # type: ignore[attr-defined]
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for dt, lm in models.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                sweep(lm, tokens, families, opts)
            print(f"--- {dt}: top ops by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top,
                                            max_name_column_width=40))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
