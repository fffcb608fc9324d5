"""The demo model's training additions: repeated synthetic rows and the rotary architecture."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from compute.corpus import builtin_corpus_documents
from compute.models import load_model, resolve_model_spec
from compute.zoo.demo import DEMO_CONFIG, report
from compute.zoo.train import ZooModelConfig, repeated_rows, train_zoo_model

DOCS = builtin_corpus_documents()[:200]


def test_repeated_rows_repeat_with_their_period() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = repeated_rows(64, 33, 400, gen)
    assert rows.shape == (64, 33)
    assert bool((rows[:, 0] == 0).all())
    body = rows[:, 1:]
    assert bool((body != 0).all())  # BOS never appears inside a row
    assert bool((body < 400).all())
    for row in body:
        period = next(m for m in range(4, 17) if bool((row[m:] == row[:-m]).all()))
        assert 4 <= period <= 16
    again = repeated_rows(64, 33, 400, torch.Generator().manual_seed(0))
    assert torch.equal(rows, again)


def test_rotary_zoo_model_trains_and_loads_with_mixed_batches(tmp_path: Path) -> None:
    cfg = ZooModelConfig(name="rot", n_layers=2, d_model=32, n_heads=2, n_ctx=32, vocab_size=400,
                         steps=3, batch_size=4, repeat_fraction=0.5, positional="rotary")
    out = train_zoo_model(cfg, tmp_path / "rot", documents=DOCS)
    meta = json.loads((out / "strata_zoo.json").read_text())
    assert meta["config"]["positional"] == "rotary"
    assert meta["config"]["repeat_fraction"] == 0.5
    lm = load_model(resolve_model_spec(str(out)))
    assert lm.cfg.positional_embedding_type == "rotary"
    assert not lm.cfg.parallel_attn_mlp
    assert (lm.n_layers, lm.d_model, lm.d_vocab) == (2, 32, 400)
    tokens = torch.tensor([[0, *range(5, 20)]])
    with torch.inference_mode():
        resid = lm.embed(tokens)
        for layer in range(lm.n_layers):
            resid = lm.run_block(layer, resid).resid
        assert torch.isfinite(lm.logits(resid)).all()


def test_demo_config_is_the_documented_one() -> None:
    assert DEMO_CONFIG.repeat_fraction > 0
    assert DEMO_CONFIG.positional == "rotary"
    assert DEMO_CONFIG.n_layers >= 3  # stage boundary 1 needs three layers
    assert callable(report)
