#!/usr/bin/env bash
# Issue 11's GPU checks in one go (about 6 minutes on one H100/H200-class device):
#   1. the gpu-marked tests: CUDA float32 equals the CPU, bfloat16 is close to float32
#      (tests/unit/test_gpu.py, tests/unit/test_schedule.py);
#   2. benchmarks/gpu_check.py: bf16 matmul rate, tokens/s and TFLOP/s per family at GPT-2
#      small's and Pythia-160M's geometries, Pythia-6.9B's device memory in bfloat16.
# Figures go to ${OUT:-.}/gpu_figures.json and gpu_check.log. See docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
export HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$out/gpu_check.log"
.venv/bin/python -m pytest -q -m gpu tests/unit/test_gpu.py tests/unit/test_schedule.py 2>&1 \
    | tail -5 | tee -a "$out/gpu_check.log"
timeout 420 .venv/bin/python -u benchmarks/gpu_check.py --out "$out/gpu_figures.json" 2>&1 \
    | grep -v "^Changing" | tee -a "$out/gpu_check.log"
