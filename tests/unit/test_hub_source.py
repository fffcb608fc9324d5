"""A TransformerLens official name, loaded as a user with network would load it — from the
Hugging Face hub's cache, here filled by the test (offline: nothing is downloaded). The
hub path converts the Hugging Face original, holds Strata's forward to that original's own
forward (the parity report) and carries the report into the run's file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from compute.zoo.architectures import CASES_BY_NAME, build_checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub(cache: Path) -> Path:
    """The hub cache's layout for repository `gpt2` (TransformerLens's official name `gpt2`),
    holding a tiny GPT-2 whose config.json has `n_ctx`, as the hub's does."""
    repo = cache / "models--gpt2"
    snapshot = build_checkpoint(CASES_BY_NAME["gpt2"], repo / "snapshots" / COMMIT)
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "n_ctx": config["n_positions"]}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def test_an_official_name_is_loaded_from_the_hub_cache_with_its_parity(tmp_path: Path) -> None:
    cache = fake_hub(tmp_path / "hub")
    out = tmp_path / "run.json"
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "STRATA_DATA_DIR": str(tmp_path / "state")}
    strata = Path(sys.executable).with_name("strata")
    result = subprocess.run(
        [str(strata), "compute", "--model", "gpt2", "--metrics", "norms", "--n-sequences", "2",
         "--seq-len", "12", "--dtype", "bfloat16", "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    run = json.loads(out.read_text())["run"]
    assert run["config"]["model"]["source"] == "transformer_lens"
    parity = run["model"]["parity"]
    assert parity["reference"] == "huggingface"
    assert parity["passed"] is True
    assert parity["max_abs_logprob_diff"] < 1e-4
    assert parity["dtype"] == "bfloat16"
    assert parity["noise_floor_kl"] > 0
