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
