"""Low-precision models: softmax/KL stay float32, and results stay close to float32 ones."""

from __future__ import annotations

import pytest
import torch

from compute.engine import sweep
from compute.metrics.base import EngineOptions
from compute.models import ModelSpec, load_model

ARCH = dict(n_layers=3, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=512, n_ctx=64,
            act_fn="gelu_new", normalization_type="LN", initializer_range=0.2)


def kl_by_intervention(dtype: str) -> dict[tuple, float]:  # type: ignore[type-arg]
    lm = load_model(ModelSpec(source="random", name="d", architecture=ARCH, seed=0,
                              dtype=dtype))  # type: ignore[arg-type]
    assert next(lm.model.parameters()).dtype == getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 512, (4, 24), generator=g)
    tokens[:, 0] = 0
    records = sweep(lm, tokens, ["intervention", "logit_lens"], EngineOptions()).records
    return {(r.metric, r.layer, r.component): r.value for r in records}


def test_bfloat16_model_gives_finite_close_results() -> None:
    full, low = kl_by_intervention("float32"), kl_by_intervention("bfloat16")
    assert full.keys() == low.keys()
    compared = 0
    for key, value in full.items():
        if key[0] in ("intervention.kl", "logit_lens.kl_to_final") and value > 0.05:
            assert low[key] == pytest.approx(value, rel=0.15), key
            compared += 1
    assert compared >= 5
    assert low[("logit_lens.kl_to_final", 3, None)] == 0.0  # exact even in bfloat16
