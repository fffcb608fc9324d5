"""Host memory while a model loads: the process's peak resident size over the whole load, and
the peak while TransformerLens processes the weights (docs/performance.md, "Memory from load
to last batch").

    M=~/.cache/strata/models
    .venv/bin/python benchmarks/load_memory.py --model $M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    .venv/bin/python benchmarks/load_memory.py --model $M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --unfreed

One load in a fresh process (the GGUF's dequantized checkpoint made beforehand: run it twice, or
point STRATA_DATA_DIR at a data folder that has it), one torch thread. `--unfreed` runs
TransformerLens's processing steps as TransformerLens ships them, each holding its whole input
beside its whole output (`compute.models.bridge.steps_free_their_input` off): the figure before
2026-12-08. Prints one JSON line: the peaks (the kernel's high-water mark, VmHWM, reset before
processing), the weights in float32, `compute.memory.load_peak_bytes` (the estimate a job's cost
reports), and the load's wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a GGUF, a checkpoint folder, zoo:...")
    parser.add_argument("--unfreed", action="store_true",
                        help="TransformerLens's steps as shipped (the figure before the change)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from compute import gguf
    from compute.memory import ModelDims, load_peak_bytes, peak_memory, reset_peak_memory
    from compute.models import bridge, load_model, resolve_model_spec, sources

    data_dir = os.environ.get("STRATA_DATA_DIR")
    if data_dir:
        gguf.set_cache_dir(Path(data_dir) / "gguf")
    if args.unfreed:
        bridge.steps_free_their_input = contextlib.nullcontext  # type: ignore[assignment]
    processing: dict[str, Any] = {}
    apply = sources.apply_processing

    def measured(model: Any, applied: Any) -> None:
        # without a reset (a kernel without clear_refs) the peak is the process's so far
        processing["peak_reset_before_processing"] = reset_peak_memory("cpu")
        before = peak_memory("cpu", since_reset=True)["host_peak_rss_mib"]
        apply(model, applied)
        peak = peak_memory("cpu", since_reset=True)["host_peak_rss_mib"]
        processing.update(before_gib=before / 1024, peak_gib=peak / 1024)

    sources.apply_processing = measured  # type: ignore[assignment]
    wall, cpu = time.perf_counter(), time.process_time()
    lm = load_model(resolve_model_spec(os.path.expanduser(args.model)))
    dims = ModelDims.of(lm)
    row = {
        "model": lm.spec.name,
        "steps": "as TransformerLens ships them" if args.unfreed else "freeing their input",
        "load_wall_s": round(time.perf_counter() - wall, 1),
        "load_cpu_s": round(time.process_time() - cpu, 1),
        "peak_rss_gib_whole_process": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "processing_resident_before_gib": round(processing.get("before_gib", float("nan")), 2),
        "processing_peak_gib": round(processing.get("peak_gib", float("nan")), 2),
        "peak_reset_before_processing": processing.get("peak_reset_before_processing"),
        "weights_float32_gib": round(dims.weight_bytes("float32") / GIB, 2),
        "estimate_load_peak_bytes_gib": round(load_peak_bytes(dims, "float32", "cpu") / GIB, 2),
    }
    if not processing:
        row["processing"] = "none applied to this model"
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
