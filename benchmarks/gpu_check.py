"""GPU figures for issue 11, in one short run (about 5 minutes on one H100/H200-class device).

    bash benchmarks/gpu_check.sh            # the gpu tests, then this script
    .venv/bin/python benchmarks/gpu_check.py --out gpu_figures.json

Not run in CI (no GPU there). It records, on the first CUDA device:
  1. bf16_matmul_tflops     dense bfloat16 matmul rate (8192^2), the yardstick;
  2. per geometry (GPT-2 small, Pythia-160M; random weights, bfloat16) and family
     (intervention, heads, logit_lens): the engine's automatic batch, tokens/s, achieved TFLOP/s
     from compute.flops and its share of the matmul rate, peak device memory;
  3. pythia_6_9b: Pythia-6.9B's geometry (32 layers, d_model 4096, d_mlp 16384, vocabulary
     50,432, rotary on a quarter of each head, parallel attention/MLP) built straight on the
     device in bfloat16 with random weights: the estimate of compute.memory next to the measured
     weights and the peak device memory of an `intervention` sweep at the automatic batch.
Every figure is also printed; --out writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from compute.engine import auto_batch_size, sweep  # noqa: E402
from compute.flops import family_flops  # noqa: E402
from compute.memory import ModelDims, check_fits, sweep_bytes_per_sequence  # noqa: E402
from compute.metrics import families_named  # noqa: E402
from compute.metrics.base import EngineOptions  # noqa: E402
from compute.models import AppliedProcessing, LoadedModel, ModelSpec  # noqa: E402

GEOMETRIES: dict[str, dict[str, Any]] = {
    "gpt2-small": dict(n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072,
                       d_vocab=50257, n_ctx=1024, act_fn="gelu_new", normalization_type="LN"),
    "pythia-160m": dict(n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072,
                        d_vocab=50304, n_ctx=2048, act_fn="gelu", normalization_type="LN",
                        positional_embedding_type="rotary", rotary_dim=16,
                        parallel_attn_mlp=True),
    "pythia-6.9b": dict(n_layers=32, d_model=4096, n_heads=32, d_head=128, d_mlp=16384,
                        d_vocab=50432, n_ctx=2048, act_fn="gelu", normalization_type="LN",
                        positional_embedding_type="rotary", rotary_dim=32,
                        parallel_attn_mlp=True),
}


def bf16_matmul(size: int = 8192, reps: int = 20) -> float:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * reps / (time.perf_counter() - start)


def build_on_device(name: str) -> LoadedModel:
    """Random weights in bfloat16 on the device (no processing: random
    weights have nothing to fold, and timing and memory do not depend on it)."""
    from compute.models.bridge import boot_native

    arch = GEOMETRIES[name]
    # TransformerLens's native model, uninitialised on the host, then moved and cast.
    model = boot_native(arch, None, seed=None)
    model.to("cuda", print_details=False)
    model.to(torch.bfloat16, print_details=False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.zero_()
        for block in model.blocks:
            for norm in (block.ln1, getattr(block, "ln2", None)):
                if norm is not None and getattr(norm, "weight", None) is not None:
                    norm.weight.fill_(1.0)
    model.eval()
    spec = ModelSpec(source="random", name=name, architecture=arch, seed=0, dtype="bfloat16")
    applied = AppliedProcessing(False, False, False, False, ("random weights on the device",))
    return LoadedModel(spec=spec, model=model, tokenizer=None, applied=applied, device="cuda")


def measure(lm: LoadedModel, family: str, n_sequences: int, seq_len: int,
            peak: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, lm.d_vocab, (n_sequences, seq_len), generator=g)
    tokens[:, 0] = 0
    opts = EngineOptions(induction_sequences=8)
    batch = auto_batch_size(lm, seq_len, opts, families_named([family]))
    sweep(lm, tokens[: min(2, n_sequences)], [family], opts)  # warm up kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = sweep(lm, tokens, [family], opts)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    flops = sum(family_flops(ModelDims.of(lm), seq_len, [family], parallel=lm.parallel)
                .values()) * n_sequences
    row = {"family": family, "batch": batch, "tokens": result.tokens_evaluated,
           "seconds": wall, "tokens_per_s": result.tokens_evaluated / wall,
           "tflops": flops / wall / 1e12, "share": flops / wall / peak,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-sequences", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    figures: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                               "torch": torch.__version__}
    peak = bf16_matmul()
    figures["bf16_matmul_tflops"] = peak / 1e12
    print(json.dumps(figures), flush=True)
    for name in ("gpt2-small", "pythia-160m"):
        lm = build_on_device(name)
        figures[name] = [measure(lm, f, args.n_sequences, args.seq_len, peak)
                         for f in ("intervention", "logit_lens")]
        figures[name].append(measure(lm, "heads", max(8, args.n_sequences // 8), args.seq_len,
                                     peak))
        del lm
        torch.cuda.empty_cache()
    dims = ModelDims.from_tl_config(GEOMETRIES["pythia-6.9b"])
    check_fits(dims, "bfloat16", "cuda", name="pythia-6.9b")  # raises if it would not fit
    torch.cuda.reset_peak_memory_stats()
    lm = build_on_device("pythia-6.9b")
    big: dict[str, Any] = {
        "estimated_weights_gib": dims.weight_bytes("bfloat16") / 2**30,
        "estimated_fused_attention_gib": dims.fast_path_extra_bytes("bfloat16") / 2**30,
        "estimated_per_sequence_mib": sweep_bytes_per_sequence(
            dims, 512, 2, patterns=False, z=False) / 2**20,
        "measured_weights_gib": torch.cuda.memory_allocated() / 2**30,
    }
    big["intervention_512"] = measure(lm, "intervention", 16, 512, peak)
    figures["pythia_6_9b"] = big
    print(json.dumps(big), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
