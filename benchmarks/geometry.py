"""Capacity at real model geometries: per family, tokens/s, achieved FLOP/s, share of matmul,
peak RSS — each family a whole `strata compute` process (model load included).

    .venv/bin/python benchmarks/geometry.py                         # the first four geometries
    .venv/bin/python benchmarks/geometry.py --geometry gpt2-small --families intervention,heads
    .venv/bin/python benchmarks/geometry.py --device cuda --dtype bfloat16   # on a GPU
    .venv/bin/python benchmarks/geometry.py --default-run --model smollm2  # what users run
    .venv/bin/python benchmarks/geometry.py --default-run --model gemma3 --dtypes bfloat16

`--default-run` times the default run itself: `strata compute --model M --out F` (every family,
the built-in corpus, 32 x 128 tokens unless --n-sequences / --seq-len say otherwise) as a whole
process, once per dtype of --dtypes (float32,bfloat16), with the matmul yardsticks at the model's
own shapes, float32 and bfloat16, measured in the same benchmark run before and after each
process (`--model smollm2` is SmolLM2-135M-Instruct's GGUF, `scripts/fetch_smollm2.sh`,
`--model gemma3` Gemma 3 270M's, `scripts/fetch_gemma3.sh`; any other value is a model reference
or a geometry above). Each run's seconds by part (load, clean passes, each family) come from its
output's `timings_s`.

Geometries are built locally with random weights (timing does not depend on them) and saved as
Hugging Face checkpoints under build/geometry/, then loaded the way a user's checkpoint is:
  gpt2-small   GPT-2 small: 12 layers, d_model 768, 12 heads, d_mlp 3072, vocabulary 50,257
  pythia-160m  GPT-NeoX: 12 layers, d_model 768, 12 heads, d_mlp 3072, vocabulary 50,304,
               rotary on a quarter of each head, parallel attention and MLP
  gpt2-6l-256  issue 11's model: GPT-2 with 6 layers, d_model 256, 4 heads, d_mlp 1024,
               vocabulary 4,096
  smollm2-135m SmolLM2-135M (Llama): 30 layers, d_model 576, 9 query heads over 3 key/value
               heads, SiLU-gated d_mlp 1536, RMSNorm, rotary, tied embeddings, vocabulary 49,152
  gemma3-270m  Gemma 3 270M: 18 layers (five 512-token sliding-window layers to each global
               one), d_model 640, 4 query heads of 256 over 1 key/value head, GELU-gated d_mlp
               2048, RMSNorm with QK-norm, tied embeddings, vocabulary 262,144
Each family runs in a fresh subprocess through `compute.run.compute_run` (what `strata compute`
calls) on seeded random tokens (.npy), n_sequences x seq_len (BOS included). The child measures
this machine's dense float32 matmul rate in the same process (2048^2, same threads, best of
three rounds) and reports:
  load_s, sweep_s, wall_s      model load, sweep, whole process (imports included)
  tokens_per_s                 evaluated tokens / sweep_s
  gflops, share                FLOPs from compute.flops (docs/performance.md) / sweep_s, and
                               that over the matmul rate; `share_process` uses wall_s instead
  peak_rss_mb, weights_mb      ru_maxrss of the process; parameters x dtype bytes
Results go to stdout as a table and to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

T_PROCESS = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BUILD = ROOT / "build" / "geometry"
GEOMETRIES = ("gpt2-small", "pythia-160m", "gpt2-6l-256", "smollm2-135m", "gemma3-270m")
DEFAULT_GEOMETRIES = GEOMETRIES[:4]  # Gemma 3's vocabulary makes it hours on a CPU: by name
# --model's names for the real models scripts/setup.sh fetches: (variable, file, fetch script)
REAL_MODELS = {
    "smollm2": ("STRATA_SMOLLM2_GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf", "fetch_smollm2.sh"),
    "gemma3": ("STRATA_GEMMA3_GGUF", "gemma-3-270m-q4_k_m.gguf", "fetch_gemma3.sh"),
}
FAMILIES = ("intervention", "logit_lens", "neurons", "similarity", "attention", "norms", "heads")


def build_checkpoint(name: str) -> Path:
    """A Hugging Face checkpoint of the geometry with random weights (built once, cached)."""
    path = BUILD / name
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(0)
    if name == "gpt2-small":
        model = GPT2LMHeadModel(GPT2Config())  # the defaults are GPT-2 small's
    elif name == "gpt2-6l-256":  # issue 11's model: GPT-2's proportions, scaled down
        model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=4096,
                                           bos_token_id=0, eos_token_id=0))
    elif name == "pythia-160m":
        model = GPTNeoXForCausalLM(GPTNeoXConfig(
            vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072, rotary_pct=0.25, use_parallel_residual=True,
            max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=0,
            eos_token_id=0))
    elif name == "smollm2-135m":  # SmolLM2-135M's config, as its GGUF file gives it
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, intermediate_size=1536, hidden_act="silu",
            max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2))
    elif name == "gemma3-270m":  # Gemma 3 270M's config, as its GGUF file gives it
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        pattern = ["sliding_attention"] * 5 + ["full_attention"]
        model = Gemma3ForCausalLM(Gemma3TextConfig(
            vocab_size=262144, hidden_size=640, num_hidden_layers=18, num_attention_heads=4,
            num_key_value_heads=1, head_dim=256, intermediate_size=2048,
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256,
            sliding_window=512, layer_types=pattern * 3, max_position_embeddings=32768,
            rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
            pad_token_id=0, rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}))
    else:
        raise SystemExit(f"unknown geometry {name!r}; choose from {', '.join(GEOMETRIES)}")
    model.save_pretrained(path)
    return path


def token_file(n_sequences: int, seq_len: int, vocab: int) -> Path:
    import numpy as np

    path = BUILD / f"tokens-{n_sequences}x{seq_len}-v{vocab}.npy"
    if not path.is_file():
        rng = np.random.default_rng(0)
        tokens = rng.integers(1, vocab, size=(n_sequences, seq_len), dtype=np.int64)
        tokens[:, 0] = 0
        BUILD.mkdir(parents=True, exist_ok=True)
        np.save(path, tokens)
    return path


def matmul_flops(device: str, dtype: str, size: int | None = None, reps: int = 5,
                 rounds: int = 3) -> float:
    """This machine's dense matmul rate: the best of `rounds` rounds of `reps` products (the
    rate varies by +-15% between moments on a shared host; the best is the fair yardstick).
    `size` by default: 2048 on a CPU, 8192 (with 20 products a round) on a GPU."""
    import torch

    dt = getattr(torch, dtype)
    if size is None:
        size, reps = (8192, 20) if device.startswith("cuda") else (2048, reps)
    a = torch.randn(size, size, device=device, dtype=dt)
    b = torch.randn(size, size, device=device, dtype=dt)
    a @ b
    best = 0.0
    for _ in range(rounds):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = max(best, 2 * size**3 * reps / (time.perf_counter() - start))
    matmul_flops.last_flops = 2 * size**3 * (reps * rounds + 1)  # type: ignore[attr-defined]
    return best


def counted_flops(lm: Any, families: Sequence[str], n_sequences: int, seq_len: int) -> float:
    """FLOPs of a run by `compute.flops`: every family's passes over the tokens, plus the
    induction probe (with heads) and the neuron classification (with neurons)."""
    from compute.flops import family_flops, induction_flops, neurons_flops
    from compute.memory import ModelDims

    dims = ModelDims.of(lm)
    flops = sum(family_flops(dims, seq_len, list(families), parallel=lm.parallel).values())
    flops *= n_sequences
    if "heads" in families:
        flops += induction_flops(dims)
    if "neurons" in families:
        flops += neurons_flops(dims, lm.d_vocab_real)
    return flops


def child(args: argparse.Namespace) -> None:
    """One family, one whole compute run; prints one JSON line."""
    import torch

    from compute.metrics.base import EngineOptions
    from compute.models import load_model, resolve_model_spec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    cpu0 = time.process_time()
    peak = matmul_flops(args.device, args.dtype)
    # On a shared machine wall time includes waiting for a core; CPU time does not. The matmul
    # rate per CPU-second, measured the same way, is the fair yardstick for the sweep's.
    peak_cpu = matmul_flops.last_flops / (time.process_time() - cpu0)  # type: ignore[attr-defined]
    spec = resolve_model_spec(args.child, dtype=args.dtype)
    start = time.perf_counter()
    lm = load_model(spec, args.device)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    tokens = TokenSpec(source="npy", path=args.tokens, n_sequences=0, seq_len=0)
    options = EngineOptions(batch_size=args.batch_size)
    config = RunConfig(model=spec, tokens=tokens, families=(args.family,), options=options)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = compute_run(config, device=args.device, lm=lm)
    sweep_s = time.perf_counter() - start
    sweep_cpu_s = time.process_time() - cpu_start
    flops = counted_flops(lm, [args.family], args.n_sequences, args.seq_len)
    wall_s = time.perf_counter() - T_PROCESS
    out = {
        "family": args.family, "device": args.device, "dtype": args.dtype,
        "threads": torch.get_num_threads(), "n_params": lm.n_params,
        "weights_mb": lm.n_params * lm.dtype_bytes / 2**20,
        "tokens": result.tokens_evaluated, "load_s": load_s, "sweep_s": sweep_s,
        "wall_s": wall_s, "tokens_per_s": result.tokens_evaluated / sweep_s,
        "gflops": flops / sweep_s / 1e9, "matmul_gflops": peak / 1e9,
        "share": flops / sweep_s / peak, "share_process": flops / wall_s / peak,
        "sweep_cpu_s": sweep_cpu_s, "matmul_gflops_per_cpu_s": peak_cpu / 1e9,
        "share_cpu_time": flops / sweep_cpu_s / peak_cpu,
        "flops_per_token": flops / result.tokens_evaluated,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if args.device.startswith("cuda"):
        out["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def yardsticks(dims: dict[str, int], rows: int = 1024) -> dict[str, dict[str, float]]:
    """float32 and bfloat16 matmul GFLOP/s at a model's shapes (best of 3), this process."""
    import torch

    d, hd, kv_hd, mlp = dims["d_model"], dims["hd"], dims["kv_hd"], dims["d_mlp"]
    shapes = {
        "qkv": ((rows, d), (d, hd + 2 * kv_hd)),
        "attn_out": ((rows, hd), (hd, d)),
        "mlp_in": ((rows, d), (d, mlp * (2 if dims["gated"] else 1))),
        "mlp_out": ((rows, mlp), (mlp, d)),
        "unembed_block": ((512, d), (d, 1024)),
        "unembed_rows": ((rows, d), (d, dims["d_vocab"])),
        "square_2048": ((2048, 2048), (2048, 2048)),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (a_shape, b_shape) in shapes.items():
        out[name] = {}
        for dt in (torch.float32, torch.bfloat16):
            a, b = torch.randn(*a_shape).to(dt), torch.randn(*b_shape).to(dt)
            a @ b
            reps = max(2, int(2e10 / (2 * a_shape[0] * a_shape[1] * b_shape[1])))
            best = 0.0
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(reps):
                    a @ b
                best = max(best, 2 * a_shape[0] * a_shape[1] * b_shape[1] * reps
                           / (time.perf_counter() - start))
            out[name][str(dt).removeprefix("torch.")] = best / 1e9
    return out


def model_dims(ref: str) -> dict[str, int]:
    """The shapes the yardsticks use, from the checkpoint's config (no model is loaded)."""
    from compute.memory import ModelDims

    path = Path(ref)
    if path.suffix == ".gguf":  # its dequantized checkpoint (made by the first run)
        from compute import gguf

        found = sorted(gguf.cache_dir().glob("*/config.json"))
        if not found:
            raise SystemExit(f"no dequantized checkpoint of {ref} under {gguf.cache_dir()}")
        path = found[0].parent
    m = ModelDims.from_hf_config(path)
    return {"d_model": m.d_model, "hd": m.n_heads * m.d_head,
            "kv_hd": (m.n_kv_heads or m.n_heads) * m.d_head, "d_mlp": m.d_mlp,
            "gated": int(m.gated_mlp), "d_vocab": m.d_vocab}


def run_timings(out: Path) -> dict[str, float]:
    """Where a `strata compute` run's time went, from its output's metadata (`timings_s`:
    the load, the clean passes, each family)."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(out).metadata or {}
    return dict(json.loads(meta.get(b"strata", b"{}")).get("timings_s", {}))


def default_run(args: argparse.Namespace) -> None:
    """The default run of one model as users run it, per dtype, whole process each, with the
    matmul yardsticks at its shapes measured around each process."""
    ref = args.model
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if ref in REAL_MODELS:
        variable, name, script = REAL_MODELS[ref]
        gguf_file = Path(env.get(variable) or Path.home() / ".cache" / "strata" / "models" / name)
        if not gguf_file.is_file():
            raise SystemExit(f"{gguf_file} is missing: run scripts/{script}")
        ref = str(gguf_file)
        data_dir = gguf_file.parent / "strata-data"  # the tests': dequantized once a machine
    else:
        data_dir = BUILD / "default-run-data"
        if ref in GEOMETRIES:
            ref = str(build_checkpoint(ref))
    env["STRATA_DATA_DIR"] = str(data_dir)
    from compute import gguf

    gguf.set_cache_dir(data_dir / "gguf")
    results: list[dict[str, object]] = []
    strata = str(Path(sys.executable).parent / "strata")
    for dtype in args.dtypes.split(","):
        out = BUILD / f"default-run-{dtype}.parquet"
        cmd = [strata, "compute", "--model", ref, "--out", str(out), "--dtype", dtype, "--quiet",
               "--n-sequences", str(args.n_sequences), "--seq-len", str(args.seq_len)]
        if args.families != ",".join(FAMILIES):
            cmd += ["--metrics", args.families]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            print(f"{dtype}: strata compute failed ({done.returncode})\n{done.stderr[-3000:]}",
                  file=sys.stderr)
            continue
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        marks = yardsticks(model_dims(ref))
        row = {"model": args.model, "dtype": dtype, "n_sequences": args.n_sequences,
               "seq_len": args.seq_len, "families": args.families, "wall_s": wall,
               "timings_s": run_timings(out), "peak_rss_mb_children": rss,
               "yardsticks_after": marks, "load_avg": os.getloadavg()[0]}
        results.append(row)
        print(f"{args.model} default run ({args.n_sequences} x {args.seq_len}) {dtype}: "
              f"{wall:8.1f} s whole process (load average {row['load_avg']:.1f}); "
              "yardsticks after it, GFLOP/s fp32/bf16: " + ", ".join(
                  f"{k} {v['float32']:.0f}/{v['bfloat16']:.0f}" for k, v in marks.items()),
              flush=True)
        print("  seconds by part of the run: " + ", ".join(
            f"{k} {v:.1f}" for k, v in row["timings_s"].items()), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
    if len(results) == 2:
        a, b = results
        print(f"whole process {a['dtype']} / {b['dtype']}: "
              f"{float(a['wall_s']) / float(b['wall_s']):.2f}x")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--geometry", default=",".join(DEFAULT_GEOMETRIES))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--n-sequences", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the engine's")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    parser.add_argument("--default-run", action="store_true",
                        help="time `strata compute`'s default run of --model per dtype")
    parser.add_argument("--model", default="smollm2", help="with --default-run")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="with --default-run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--family", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.default_run:
        if args.n_sequences == 8 and "--n-sequences" not in sys.argv:
            args.n_sequences = 32  # the default run's
        default_run(args)
        return
    results = []
    for geometry in args.geometry.split(","):
        path = build_checkpoint(geometry)
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        tokens = token_file(args.n_sequences, args.seq_len, vocab)
        for family in args.families.split(","):
            cmd = [sys.executable, __file__, "--child", str(path), "--family", family,
                   "--tokens", str(tokens), "--n-sequences", str(args.n_sequences),
                   "--seq-len", str(args.seq_len), "--device", args.device, "--dtype", args.dtype]
            if args.batch_size:
                cmd += ["--batch-size", str(args.batch_size)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{geometry} {family}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            row = {"geometry": geometry, **json.loads(done.stdout.strip().splitlines()[-1])}
            results.append(row)
            print(f"{geometry:12s} {family:13s} {row['tokens_per_s']:9.1f} tok/s "
                  f"{row['gflops']:7.1f} GFLOP/s = {100 * row['share']:3.0f}% of matmul "
                  f"({row['matmul_gflops']:.0f}; whole process {100 * row['share_process']:3.0f}%;"
                  f" by CPU time {100 * row['share_cpu_time']:3.0f}%)"
                  f"  load {row['load_s']:5.1f} s sweep {row['sweep_s']:7.1f} s  "
                  f"peak RSS {row['peak_rss_mb']:6.0f} MB = "
                  f"{row['peak_rss_mb'] / row['weights_mb']:.2f}x weights", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
