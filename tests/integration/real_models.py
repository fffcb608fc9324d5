"""The shipped real models' GGUF files, as their tests find them: one lookup for all.

Each is fetched by its script (`scripts/fetch_smollm2.sh`, `scripts/fetch_gemma3.sh`, run by
setup; `scripts/fetch_qwen.sh 0.5b|1.5b`, run on request) into the models cache; an environment
variable names another copy. Missing, a test skips with the command that fetches it, and fails
under CI, which runs setup first, for the files setup fetches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compute import gguf as strata_gguf


def gguf_path(file: str, env: str) -> Path | None:
    """`$env` if set, else `file` in the models cache (STRATA_MODELS_CACHE, or the XDG cache's
    strata/models) if it is there."""
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    cache = os.environ.get("STRATA_MODELS_CACHE") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "strata" / "models"
    path = Path(cache) / file
    return path if path.is_file() else None


def require_gguf(file: str, env: str, what: str, script: str, *,
                 fetched_by_setup: bool = True) -> Path:
    """The file, or skip (fail under CI, where setup fetched it) naming the script that fetches
    it."""
    path = gguf_path(file, env)
    if path is None:
        message = f"{what}'s GGUF is not fetched: run {script}"
        if os.environ.get("CI") and fetched_by_setup:
            pytest.fail(message)
        pytest.skip(message)
    return path


# Qwen2.5-Coder Instruct, Q4_K_M, as `scripts/fetch_qwen.sh SIZE` names it in the cache; the
# environment variable names another copy. Not fetched by setup (yet): without the file the tests
# skip, in CI too.
QWEN = {
    "0.5b": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "STRATA_QWEN_0_5B_GGUF"),
    "1.5b": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "STRATA_QWEN_1_5B_GGUF"),
}


def require_qwen(size: str) -> Path:
    """Qwen2.5-Coder-`size`-Instruct's GGUF (`size` "0.5b" or "1.5b"), or skip naming the
    command that fetches it (fail under CI for the 0.5B, which setup fetches; the 1.5B is
    fetched on request only)."""
    file, env = QWEN[size]
    return require_gguf(file, env, f"Qwen2.5-Coder-{size.upper()}-Instruct",
                        f"scripts/fetch_qwen.sh {size}", fetched_by_setup=size == "0.5b")


def data_dir_beside(gguf_file: Path) -> Path:
    """A data directory beside the file, so the dequantized checkpoint is made once a
    machine."""
    path = gguf_file.parent / "strata-data"
    strata_gguf.set_cache_dir(path / "gguf")
    return path
