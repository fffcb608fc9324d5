"""What loading a model costs, and capturing its blocks' inputs at a length: wall and CPU seconds
in one process, one torch thread (docs/performance.md, "Loading").

    M=~/.cache/strata/models
    .venv/bin/python benchmarks/model_load.py --model $M/SmolLM2-135M-Instruct.Q4_1.gguf \
        --dtype bfloat16
    .venv/bin/python benchmarks/model_load.py \
        --model $M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --capture 1024

The model is loaded once in float32 first (the GGUF's dequantized checkpoint made and the
libraries' caches warm, as in a worker that has loaded before), then `--rounds` times at
`--dtype`; each round's load is timed, and with `--capture N` the first capture of every block's
inputs at N tokens (`BlockInputs`, what a run's first batch of that length pays) on the loaded
model. Prints one JSON line per round. Run it under another checkout's code with
`PYTHONPATH=/path/to/checkout` to compare two commits on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a GGUF, a checkpoint folder, zoo:...")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--capture", type=int, default=0, help="tokens; 0: no capture")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import compute
    from compute.models import load_model, resolve_model_spec

    load_model(resolve_model_spec(os.path.expanduser(args.model)))
    for round_ in range(args.rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        lm = load_model(resolve_model_spec(os.path.expanduser(args.model), dtype=args.dtype))
        row: dict[str, object] = {
            "code": str(Path(compute.__file__).parents[1]),
            "model": lm.spec.name,
            "dtype": args.dtype,
            "round": round_,
            "load_wall_s": round(time.perf_counter() - wall, 3),
            "load_cpu_s": round(time.process_time() - cpu, 3),
        }
        if args.capture:
            dtype = next(lm.model.parameters()).dtype
            resid = torch.zeros(1, args.capture, lm.d_model, dtype=dtype)
            wall, cpu = time.perf_counter(), time.process_time()
            lm._block_inputs.of(0, resid)
            row |= {"capture_tokens": args.capture,
                    "capture_wall_s": round(time.perf_counter() - wall, 3),
                    "capture_cpu_s": round(time.process_time() - cpu, 3)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
