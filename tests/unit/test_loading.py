"""Loading: the block-by-block weight processing (which copies each processed tensor straight
into the model) gives exactly the weights of TransformerLens's own whole-dict processing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import compute.models.processing as weight_processing
from compute.models import Processing, load_model, resolve_model_spec


@contextlib.contextmanager
def _whole_dict_processing(_model: object) -> Iterator[None]:
    """The reference: TransformerLens's `process_weights` on the whole state dict, unpatched."""
    yield


def _weights(ref: str, processing: Processing) -> dict[str, torch.Tensor]:
    lm = load_model(resolve_model_spec(ref, processing=processing))
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


@pytest.mark.parametrize("which", ["gpt2", "neox", "zoo"])
@pytest.mark.parametrize("processing", [Processing(), Processing(fold_value_biases=False,
                                                                 center_unembed=False)],
                         ids=["all", "partial"])
def test_block_by_block_processing_equals_the_whole_dict_processing(
        which: str, processing: Processing, hf_gpt2_dir: Path, hf_neox_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref = {"gpt2": str(hf_gpt2_dir), "neox": str(hf_neox_dir), "zoo": "zoo:tiny-2l-s0"}[which]
    ours = _weights(ref, processing)
    monkeypatch.setattr(weight_processing, "_processing_block_by_block", _whole_dict_processing)
    reference = _weights(ref, processing)
    assert ours.keys() == reference.keys()
    different = [k for k in ours if not torch.equal(ours[k], reference[k])]
    assert different == []
    # Processing did something: the folded, centered weights differ from the checkpoint's.
    raw = _weights(ref, Processing(fold_ln=False, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False))
    assert not torch.equal(raw["blocks.0.attn.W_Q"], ours["blocks.0.attn.W_Q"])


def test_a_freed_module_keeps_only_the_tensors_handed_on() -> None:
    """The Hugging Face model's weights are freed once converted, without a garbage collection:
    every parameter and buffer emptied but the very tensors the state dict took over, and a view
    taken of a freed one keeps its values."""
    from compute.models.sources import free_module_tensors

    module = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
    module.register_buffer("mask", torch.ones(4, 4))
    module.loop = [module]  # type: ignore[assignment]  # a reference cycle, as models have
    linear, norm = module[0], module[1]
    taken = linear.weight
    view = norm.bias[2:6]
    values = view.clone()
    free_module_tensors(module, keep=[taken])
    assert linear.weight is taken
    assert linear.weight.shape == (8, 16)
    assert [t.numel() for t in (linear.bias, norm.weight, norm.bias, module.mask)] == [0] * 4
    assert torch.equal(view, values)
