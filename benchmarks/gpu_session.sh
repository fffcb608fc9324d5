#!/usr/bin/env bash
# Everything this round asks of a lent GPU machine, in one call of under 10 minutes (measured on
# one H200, 2026-12-04: the tests 20 s, the 30 refits in 4.7 min, the four default runs 114 s):
#   1. the CUDA path's tests (tests/unit/test_gpu.py: float32 equals the CPU, bfloat16 close);
#   2. the head-stability study's refit families trained on the GPU (issue 38, item 5:
#      scripts/study_head_stability.py train --device cuda), packed into $OUT per family;
#   3. the default run of SmolLM2-135M's and Gemma 3 270M's geometries in bfloat16 and float32
#      (issue 37, item 4: benchmarks/gpu_default_runs.py).
# The machine has PyTorch with CUDA but not this project's other packages: the wheels it lacks
# (pure Python, or built for its Python 3.12) travel in .whl/ with the built-in corpus as this
# project's Python extracts it (.whl/corpus.json; its Python would extract another text).
# Prepare them here with `bash benchmarks/gpu_session.sh --prepare`. Output: $OUT (the log,
# gpu_default_runs.json, the trained families as hs*.tar).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl transformer-lens==3.9.0 pydantic==2.14.4 \
    pydantic_core==2.50.5 annotated-types typing-inspection better-abc==0.0.3 \
    fancy-einsum==0.0.3 beartype==0.23.1 typeguard==4.6.1 datasets==5.2.0 dill multiprocess
  .venv/bin/python scripts/study_head_stability.py export-corpus --out .whl/corpus.json
  exit 0
fi
out="${OUT:-build/gpu-session}"
mkdir -p "$out"
OUT_ABS=$(cd "$out" && pwd)
log="$out/gpu_session.log"
exec > >(tee -a "$log") 2>&1
t0=$SECONDS
stamp() { echo "== $* ($((SECONDS - t0)) s)"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, transformer_lens; print('torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
nproc; lscpu | grep "Model name"

stamp "1. the CUDA path's tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider -W ignore -m gpu tests/unit/test_gpu.py

stamp "2. the study's refit families on the GPU"
timeout 270 python3 scripts/study_head_stability.py train --device cuda --workers 6 \
  --corpus-json .whl/corpus.json --time-limit 180 2>&1 | grep -v -E "Writing model|loss_type|attention_mask|pad_token_id|indexing errors"
(cd build/head-stability && tar cf "$OUT_ABS/hs2l.tar" hs2l-adamw hs2l-adam \
  && for f in hs4l-adamw hs4l-adam hs6l-adamw hs6l-adam; do tar cf "$OUT_ABS/$f.tar" "$f"; done) \
  2>&1 | tail -3
ls -la "$out"

stamp "3. the default runs"
python3 benchmarks/gpu_default_runs.py --timeout 70 --out "$out/gpu_default_runs.json"
stamp "done"
