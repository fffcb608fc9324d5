"""The head screen (`heads_atp`) against what it linearises.

The reference test (`test_reference_engine.py`) holds the engine's gradients to TransformerLens's
own autograd. Here the estimate is held to its definition, without autograd: the derivative of
the exact mean loss when head h's z is scaled by (1 - eps), by a central finite difference of two
runs through the model layer (`run_block(head_mask=...)`), on the fast blocks and on the
hooked TransformerLens blocks, for sequential, parallel and grouped-query models."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from compute.engine import clean_pass, sweep
from compute.metrics.base import EngineOptions, logit_chunks
from compute.metrics.heads_atp import atp_loss_delta

pytestmark = pytest.mark.usefixtures("single_torch_thread")
ARCHS: dict[str, dict[str, Any]] = {
    "sequential": {},
    # (parallel attention/MLP: TransformerLens 4's native blocks are sequential; the GPT-NeoX
    # checkpoint of the reference tests holds the parallel arrangement)
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=4),
    "gqa-rms-gated": dict(normalization_type="RMS", positional_embedding_type="rotary",
                          rotary_dim=8, n_key_value_heads=2, gated_mlp=True, act_fn="silu"),
}


def mean_loss(lm: Any, tokens: torch.Tensor, layer: int, head: int, scale: float) -> torch.Tensor:
    """Per sequence, the mean next-token loss over positions 1..T-2 with head `head` of block
    `layer` scaled by `scale`, in float64 from the model's logits."""
    x = lm.embed(tokens)
    for block in range(lm.n_layers):
        mask = None
        if block == layer:
            mask = torch.ones(tokens.shape[0], lm.n_heads)
            mask[:, head] = scale
        x = lm.run_block(block, x, head_mask=mask).resid
    log_probs = lm.logits(x[:, 1:-1]).double().log_softmax(-1)
    return -log_probs.gather(-1, tokens[:, 2:, None]).squeeze(-1).mean(-1)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_estimate_is_the_derivative_of_the_exact_ablation(
        arch: str, fast: bool, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    cfg = dict(seed=5, n_layers=3, **ARCHS[arch])
    lm = tiny_factories["random"](**cfg)
    assert lm.fast_path
    lm._ctx["fast_path"] = fast
    tokens = tiny_factories["tokens"](2, 16, lm.d_vocab_real, lm.bos_token_id, seed=3)
    opts = EngineOptions()
    eps = 1e-2
    with torch.inference_mode():
        ctx = clean_pass(lm, tokens, False, logit_chunks(lm, opts), lambda _: None,
                         capture_z=True)
        estimate = atp_loss_delta(ctx, opts)  # per attention block: [H, b]
        for layer in range(lm.n_layers):
            for head in range(lm.n_heads):
                # d/d(scale) at scale 1, times (0 - 1): the first-order change of zeroing it
                slope = (mean_loss(lm, tokens, layer, head, 1 + eps)
                         - mean_loss(lm, tokens, layer, head, 1 - eps)) / (2 * eps)
                assert estimate[layer][head].double() == pytest.approx(
                    -slope, rel=2e-3, abs=2e-5), (layer, head)


def test_screen_records_and_its_parts(tiny_factories: dict[str, Callable[..., Any]],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One row per (layer, head) in nats with n = sequences; a batch whose graph does not fit
    the memory budget is differentiated in parts (here 2 + 2 + 1 sequences) with the same
    numbers as whole, and as batches of one."""
    from compute.metrics import heads_atp

    lm = tiny_factories["random"](seed=6, n_layers=2)
    tokens = tiny_factories["tokens"](5, 16, lm.d_vocab_real, lm.bos_token_id, seed=4)

    def rows(opts: EngineOptions) -> dict[tuple[Any, ...], Any]:
        return {(r.metric, r.layer, r.component, r.head, r.neuron): r
                for r in sweep(lm, tokens, ["heads_atp"], opts).records}

    whole = rows(EngineOptions(batch_size=5))
    assert set(whole) == {("heads_atp.loss_delta", layer, None, head, None)
                          for layer in range(lm.n_layers) for head in range(lm.n_heads)}
    assert {(r.unit, r.n) for r in whole.values()} == {("nats", 5)}
    budget = 64
    monkeypatch.setattr(heads_atp, "graph_bytes_per_sequence",
                        lambda *_: budget * 2**20 // 2)
    assert heads_atp.graph_sequences(lm, 16, EngineOptions(memory_budget_mb=budget)) == 2
    for other in (rows(EngineOptions(batch_size=5, memory_budget_mb=budget)),
                  rows(EngineOptions(batch_size=1))):
        for key, record in whole.items():
            assert other[key].value == pytest.approx(record.value, rel=1e-4, abs=1e-6)
            assert other[key].stderr == pytest.approx(record.stderr, rel=1e-3, abs=1e-6)
