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


# --------------------------------------------------------------------------- processing memory
# `compute.models.bridge.steps_free_their_input`: TransformerLens's processing, run so that each
# step frees its input while it clones it. The reference is TransformerLens's own processing of
# the same checkpoint, unpatched; the result must be the same weights, bit for bit.
PROCESSED_CASES = ["gpt2", "gpt-neox-parallel", "llama", "qwen2", "phi", "mixtral"]
MIB = 2**20


def _booted(path: Path) -> tuple[object, object]:
    """A bridge over the checkpoint at `path`, unprocessed, and what processing it takes."""
    from transformers import AutoModelForCausalLM

    from compute.models.bridge import boot_hf
    from compute.models.processing import effective_processing
    from compute.models.sources import checkpoint_architecture, processing_fields
    from compute.models.spec import Processing

    architecture = checkpoint_architecture(path)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    bridge = boot_hf(hf, architecture, path.name)
    return bridge, effective_processing(Processing(), processing_fields(bridge, architecture))


@pytest.mark.parametrize("name", PROCESSED_CASES)
def test_processing_that_frees_as_it_goes_is_transformer_lens_own_bit_for_bit(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from compute.models import bridge
    from compute.zoo.architectures import CASES_BY_NAME, build_checkpoint

    path = build_checkpoint(CASES_BY_NAME[name], tmp_path / name)
    ours, applied = _booted(path)
    theirs, _ = _booted(path)
    assert applied.fold_ln or applied.center_unembed  # something to process
    bridge.apply_processing(ours, applied)
    # the reference: the same call with TransformerLens's steps as it ships them
    monkeypatch.setattr(bridge, "steps_free_their_input", contextlib.nullcontext)
    bridge.apply_processing(theirs, applied)
    mine, reference = ours.state_dict(), theirs.state_dict()  # type: ignore[attr-defined]
    assert mine.keys() == reference.keys()
    changed = [k for k in mine if not torch.equal(mine[k], reference[k])]
    assert not changed, f"differ from TransformerLens's own processing: {changed[:5]}"


def test_processing_holds_one_processed_copy_of_the_weights_at_its_peak() -> None:
    """Measured: the process's peak resident memory while the weights are processed, above what
    was resident before, against the weights' size. TransformerLens's steps, unpatched, each hold
    their whole input beside their whole output: about two copies above the model. Freed as
    they go, one copy and the largest tensor (here 2 MiB of 85 MiB)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from compute.memory import allocator_for_loading, peak_memory, reset_peak_memory
    from compute.models.bridge import apply_processing, boot_hf
    from compute.models.processing import AppliedProcessing

    allocator_for_loading()  # as a load runs: large tensors mapped, handed back when freed
    config = LlamaConfig(vocab_size=1000, hidden_size=512, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024,
                         max_position_embeddings=64, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = LlamaForCausalLM(config).eval()
    weights = sum(p.numel() * p.element_size() for p in hf.parameters())
    bridge = boot_hf(hf, "LlamaForCausalLM", "peak")
    del hf
    applied = AppliedProcessing(fold_ln=True, center_writing_weights=False, center_unembed=True,
                                fold_value_biases=True)
    if not reset_peak_memory("cpu"):
        pytest.skip("this kernel does not reset the peak resident size (clear_refs)")
    before = peak_memory("cpu", since_reset=True)["host_peak_rss_mib"]
    apply_processing(bridge, applied)
    above = (peak_memory("cpu", since_reset=True)["host_peak_rss_mib"] - before) * MIB
    assert above < 1.5 * weights, f"{above / MIB:.0f} MiB above the start for {weights / MIB:.0f}"

