"""The CUDA path: same numbers on the GPU (float32) and close ones in bfloat16. Skipped on CPU."""

from __future__ import annotations

import pytest
import torch

from compute.engine import sweep
from compute.metrics.base import EngineOptions
from compute.models import ModelSpec, load_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ARCH = dict(n_layers=3, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=512, n_ctx=64,
            act_fn="gelu_new", normalization_type="LN")
FAMILIES = ["intervention", "logit_lens", "attention", "norms", "heads", "similarity", "neurons"]


def values(device: str, dtype: str) -> dict[tuple, float]:  # type: ignore[type-arg]
    lm = load_model(ModelSpec(source="random", name="g", architecture=ARCH, seed=0,
                              dtype=dtype), device)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 512, (6, 32), generator=g)
    tokens[:, 0] = 0
    opts = EngineOptions(batch_size=4, induction_n=8, induction_sequences=4)
    return {(r.metric, r.layer, r.component, r.head, r.neuron): r.value
            for r in sweep(lm, tokens, FAMILIES, opts).records}


def test_cuda_float32_matches_cpu() -> None:
    cpu, gpu = values("cpu", "float32"), values("cuda", "float32")
    assert cpu.keys() == gpu.keys()
    for key, value in cpu.items():
        assert gpu[key] == pytest.approx(value, abs=1e-4, rel=1e-3), key


def test_cuda_bfloat16_is_close_and_finite() -> None:
    cpu, gpu = values("cpu", "float32"), values("cuda", "bfloat16")
    assert cpu.keys() == gpu.keys()
    kl = [(gpu[k], v) for k, v in cpu.items() if k[0] == "intervention.kl" and v > 0.05]
    assert kl
    for got, want in kl:
        assert got == pytest.approx(want, rel=0.1)
