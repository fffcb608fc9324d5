"""Low-precision models: softmax/KL stay float32, and results stay close to float32 ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from compute.engine import sweep
from compute.metrics.base import EngineOptions
from compute.models import ModelSpec, load_model
from compute.models.bridge import to_dtype

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


@pytest.mark.parametrize("source", ["random", "hf_dir"])
def test_to_dtype_converts_as_transformer_lens_does(source: str, hf_llama_dir: Path) -> None:
    """`compute.models.bridge.to_dtype` (TransformerLens 4's `bridge.to(dtype)` without its
    quadratic no-op loop) against that method itself, on a native model and on a Hugging Face
    checkpoint with rotary buffers: every parameter and buffer of the bridge and of the model it
    wraps the same dtype and value, and the config's dtype the same."""
    if source == "random":
        spec = ModelSpec(source="random", name="d", architecture=ARCH, seed=0)
    else:
        spec = ModelSpec(source="hf_dir", name=str(hf_llama_dir))
    ours, theirs = load_model(spec).model, load_model(spec).model
    to_dtype(ours, torch.bfloat16)
    theirs.to(torch.bfloat16, print_details=False)
    assert ours.cfg.dtype == theirs.cfg.dtype == torch.bfloat16

    def tensors(bridge: Any) -> dict[str, torch.Tensor]:
        named = {**dict(bridge.named_parameters()), **dict(bridge.named_buffers())}
        original = getattr(bridge, "original_model", None)
        if original is not None:
            named |= {f"original.{k}": v for k, v in original.named_parameters()}
            named |= {f"original.{k}": v for k, v in original.named_buffers()}
        return named

    mine, reference = tensors(ours), tensors(theirs)
    assert mine.keys() == reference.keys()
    assert {t.dtype for t in reference.values() if t.is_floating_point()} == {torch.bfloat16}
    for name, tensor in reference.items():
        assert mine[name].dtype == tensor.dtype, name
        assert torch.equal(mine[name], tensor), name
