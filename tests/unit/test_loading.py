"""Loading: TransformerLens 4's weight processing, as Strata applies it, leaves each model's
function unchanged and changes its weights (it did something), on the fused blocks and on the
bridge's; and an architecture TransformerLens does not adapt is refused from config.json alone,
before any weight is read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from compute.errors import UnsupportedArchitectureError
from compute.models import Processing, load_model, resolve_model_spec
from tests.unit.test_hf_forward import strata_log_probs

RAW = Processing(fold_ln=False, center_writing_weights=False, center_unembed=False,
                 fold_value_biases=False)


@pytest.mark.parametrize("which", ["gpt2", "neox", "zoo"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "bridge"])
def test_processing_keeps_the_function_and_changes_the_weights(
        which: str, fast: bool, hf_gpt2_dir: Path, hf_neox_dir: Path) -> None:
    ref = {"gpt2": str(hf_gpt2_dir), "neox": str(hf_neox_dir), "zoo": "zoo:tiny-2l-s0"}[which]
    processed = load_model(resolve_model_spec(ref))
    raw = load_model(resolve_model_spec(ref, processing=RAW))
    assert processed.applied.fold_ln
    assert processed.applied.center_writing_weights
    assert not raw.applied.fold_ln
    for lm in (processed, raw):
        lm._ctx["fast_path"] = fast
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, raw.d_vocab_real, (2, 16), generator=gen)
    diff = (strata_log_probs(processed, tokens) - strata_log_probs(raw, tokens)).abs().max().item()
    assert diff < 1e-4
    w_q = processed.model.blocks[0].attn.W_Q, raw.model.blocks[0].attn.W_Q
    assert not torch.equal(*w_q)


def test_an_unadapted_architecture_is_refused_before_anything_heavy(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(UnsupportedArchitectureError, match="has no adapter"):
        load_model(resolve_model_spec(str(tmp_path)))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    with pytest.raises(UnsupportedArchitectureError, match="not a causal language model"):
        load_model(resolve_model_spec(str(tmp_path)))


def test_the_refusal_imports_neither_transformers_nor_transformer_lens(tmp_path: Path) -> None:
    """A refusal is fast: deciding it needs config.json and the adapter registry's source (the
    model package itself imports torch; transformers and TransformerLens take seconds more)."""
    import subprocess

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from compute.models.refusals import refusal_of\n"
            "assert 'has no adapter' in refusal_of('NoSuchForCausalLM', {})\n"
            "assert refusal_of('LlamaForCausalLM', {}) is None\n"
            "print(sorted(m for m in ('transformer_lens', 'transformers')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
