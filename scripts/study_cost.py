"""The four-model study's cost before its runs (issue 49: estimate, then run): dense FLOPs by
family (`compute.flops`) of each planned run, and the time they would take at this machine's
measured float32 matmul rate (a floor: the engine reaches a fraction of it).

    .venv/bin/python scripts/study_cost.py > results/four-models/cost-estimate.json
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from compute.flops import family_flops, neurons_flops  # noqa: E402
from compute.memory import ModelDims  # noqa: E402

# Each checkpoint's config.json (dequantized GGUF): blocks, d_model, heads, d_head, d_mlp, vocab.
DIMS = {
    "SmolLM2-135M-Instruct": ModelDims(30, 576, 9, 64, 1536, 49152, 8192, True, False, 3),
    "Gemma 3 270M": ModelDims(18, 640, 4, 256, 2048, 262144, 32768, True, False, 1),
    "Qwen2.5-Coder-0.5B-Instruct": ModelDims(24, 896, 14, 64, 4864, 151936, 32768, True, False, 2),
    "Qwen2.5-Coder-1.5B-Instruct": ModelDims(
        28, 1536, 12, 128, 8960, 151936, 32768, True, False, 2
    ),
}
DEFAULT = ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms", "heads"]
PLANNED = {  # the runs submitted (sequences, families): every default family but exact heads
    "Qwen2.5-Coder-0.5B-Instruct": 32,
    "Qwen2.5-Coder-1.5B-Instruct": 8,
    "Gemma 3 270M": 32,
}
STUDY = [f for f in DEFAULT if f != "heads"] + ["heads_atp"]


def tflop(dims: ModelDims, n: int, families: list[str]) -> dict[str, float]:
    per = family_flops(dims, 128, families)
    out = {k: v * n / 1e12 for k, v in per.items()}
    if "neurons" in families:
        out["neurons"] = neurons_flops(dims) / 1e12  # weights only, once per run
    out["total"] = sum(out.values())
    return out


def matmul_rate() -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    return 2 * 2048**3 * 10 / (time.perf_counter() - start)


def main() -> None:
    rate = matmul_rate()
    out: dict[str, object] = {
        "machine": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "float32_matmul_gflops": round(rate / 1e9, 1),
        "models": {},
    }
    for name, dims in DIMS.items():
        default = tflop(dims, 32, DEFAULT)
        entry = {
            "default_run_tflop": {k: round(v, 2) for k, v in default.items()},
            "default_run_hours_at_matmul_rate": round(default["total"] * 1e12 / rate / 3600, 2),
        }
        if name in PLANNED:
            n = PLANNED[name]
            planned = tflop(dims, n, STUDY)
            entry["planned"] = {
                "n_sequences": n,
                "families": STUDY,
                "tflop": {k: round(v, 2) for k, v in planned.items()},
                "hours_at_matmul_rate": round(planned["total"] * 1e12 / rate / 3600, 2),
            }
        out["models"][name] = entry  # type: ignore[index]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
