"""Strata's clean forward against the Hugging Face model's own forward, per architecture.

The model layer (`compute.models.LoadedModel`: embed, run_block, logits) loads a checkpoint
into a TransformerLens 4 bridge with its weight processing, then runs either the fast blocks of
`compute.blocks` or the bridge's blocks (the model's own modules, hooked). Both must compute
the distribution the original Hugging Face model computes: next-token log-probabilities agree
within 1e-4 on every position. Architectures: GPT-2 (LayerNorm, learned positions), GPT-NeoX
(rotary on part of each head, parallel attention and MLP), Llama (RMSNorm, rotary,
grouped-query attention, SiLU-gated MLP, tied embeddings) and GPT-Neo (alternating global and
local attention, window 4: sequences longer than the window tell a model that ignores the
window apart). The real SmolLM2-135M weights are checked the same way in
`tests/integration/test_smollm2.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from compute.models import LoadedModel, load_model, resolve_model_spec

TOL = 1e-4
pytestmark = pytest.mark.usefixtures("single_torch_thread")


def strata_log_probs(lm: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        resid = lm.embed(tokens)
        for layer in range(lm.n_layers):
            resid = lm.run_block(layer, resid).resid
        return lm.logits(resid).double().log_softmax(-1)


def hf_log_probs(path: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(tokens).logits.double().log_softmax(-1)


def _tokens(lm: LoadedModel, seq_len: int = 24) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, lm.d_vocab_real, (2, seq_len), generator=gen)
    tokens[:, 0] = lm.bos_token_id
    return tokens


@pytest.fixture(scope="module", params=["gpt2", "neox", "llama", "neo"])
def checkpoint(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, request.getfixturevalue(f"hf_{request.param}_dir")


@pytest.mark.parametrize("path", ["fast", "bridge"])
def test_clean_forward_matches_hugging_face(checkpoint: tuple[str, Path], path: str) -> None:
    kind, directory = checkpoint
    lm = load_model(resolve_model_spec(str(directory)))
    if kind in ("gpt2", "neox", "llama"):
        assert lm.fast_path, f"{kind}: expected the fast blocks to cover this architecture"
    if kind == "neo":  # local attention layers: the bridge's blocks only
        assert not lm.fast_path
    if path == "bridge":
        lm._ctx["fast_path"] = False
    tokens = _tokens(lm)
    ours, theirs = strata_log_probs(lm, tokens), hf_log_probs(directory, tokens)
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs().max().item()
    assert diff < TOL, f"{kind} ({path} blocks): max |log p difference| {diff:.2e}"


def test_local_attention_window_is_applied(hf_neo_dir: Path) -> None:
    """A local layer must not see keys beyond its window: the pattern the families read (the
    model's own, through the bridge's hook) gives them no weight, and keys within it some."""
    lm = load_model(resolve_model_spec(str(hf_neo_dir)))
    config = lm.model.original_model.config
    local = [i for i, kind in enumerate(config.attention_layers) if kind == "local"]
    assert local, "the GPT-Neo fixture must have a local attention layer"
    window = int(config.window_size)
    resid = torch.randn(2, 24, lm.d_model, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        run = lm.run_block(local[0], resid, capture_pattern=True)
    assert run.pattern is not None
    q, k = torch.meshgrid(torch.arange(24), torch.arange(24), indexing="ij")
    outside = (q - k >= window) | (k > q)
    assert run.pattern[..., outside].abs().max().item() == 0.0
    assert run.pattern[..., ~outside].min().item() > 0.0


def test_gqa_heads_share_key_value_heads(hf_llama_dir: Path) -> None:
    """Under grouped-query attention each key/value head serves a group of consecutive query
    heads; per-head ablation still zeroes one query head's z, and the fast path agrees."""
    lm = load_model(resolve_model_spec(str(hf_llama_dir)))
    assert lm.cfg.n_key_value_heads == 2
    assert lm.n_heads == 4
    resid = torch.randn(3, 10, lm.d_model, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, lm.n_heads)
    mask[1, 1] = 0.0
    mask[2, 2:] = 0.0
    results: list[Any] = []
    with torch.inference_mode():
        for fast in (True, False):
            lm._ctx["fast_path"] = fast
            results.append(lm.run_block(1, resid, head_mask=mask, capture_z=True))
    fast_run, slow_run = results
    assert torch.allclose(fast_run.resid, slow_run.resid, atol=1e-5)
    assert fast_run.z is not None
    assert fast_run.z[1, :, 1].abs().max().item() == 0.0
