"""The zoo tokenizer and a few-step training smoke test that loads through TransformerLens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compute.corpus import builtin_corpus_documents
from compute.zoo.tokenizer import (
    SPECIAL_TOKEN,
    load_zoo_tokenizer,
    save_zoo_tokenizer,
    train_bpe_tokenizer,
)
from compute.zoo.train import ZOO_METADATA_FILE, ZooModelConfig, train_zoo_model

DOCS = builtin_corpus_documents()[:200]


def test_tokenizer_round_trip(tmp_path: Path) -> None:
    tok = train_bpe_tokenizer(DOCS, vocab_size=400, model_max_length=64)
    assert len(tok) == 400
    assert tok.convert_tokens_to_ids(SPECIAL_TOKEN) == 0
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == 0
    text = "def f(x):\n    return x  # héllo ✓ ünïcode\t"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert 0 not in ids
    assert tok.decode(ids) == text
    save_zoo_tokenizer(tok, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    again = load_zoo_tokenizer(tmp_path)
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.bos_token_id == 0
    # Deterministic: the same text and vocabulary size give the same merges.
    assert train_bpe_tokenizer(DOCS, vocab_size=400)(text)["input_ids"] == ids


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible"):
        ZooModelConfig(name="x", n_layers=2, d_model=30, n_heads=4)
    cfg = ZooModelConfig(name="x", n_layers=2, optimizer="adam")
    assert cfg.resolved_weight_decay == 0.0
    assert cfg.resolved_d_mlp == 512
    assert ZooModelConfig(name="x", n_layers=2).resolved_weight_decay == 0.1


def test_training_smoke_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from compute.models import load_model, resolve_model_spec

    cfg = ZooModelConfig(
        name="smoke",
        n_layers=1,
        d_model=32,
        n_heads=2,
        n_ctx=32,
        vocab_size=400,
        steps=3,
        batch_size=4,
        seed=0,
    )
    before = torch.random.get_rng_state()
    out = train_zoo_model(cfg, tmp_path / "smoke", documents=DOCS)
    assert torch.equal(before, torch.random.get_rng_state()), "global RNG state leaked"
    meta = json.loads((out / ZOO_METADATA_FILE).read_text())
    assert meta["steps"] == 3
    assert meta["val_loss"] > 0
    assert meta["loss_curve"]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file()

    # Loadable as Strata loads a checkpoint (a TransformerLens 4 bridge, processed), with
    # the Hugging Face model's own loss.
    path = str(out)
    lm = load_model(resolve_model_spec(path))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    assert (lm.n_layers, lm.d_model, lm.n_ctx, lm.d_vocab) == (1, 32, 32, 400)
    ids = [0, *tok(DOCS[-1], add_special_tokens=False)["input_ids"][:31]]
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        tl_loss = lm.model(tokens, return_type="loss").item()
        hf_loss = hf(tokens, labels=tokens).loss.item()
    assert abs(tl_loss - hf_loss) < 1e-4

    # Same seed, same weights.
    again = train_zoo_model(cfg, tmp_path / "again", tokenizer_dir=out, documents=DOCS)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_the_validation_curve_is_the_validation_loss_at_each_step(tmp_path: Path) -> None:
    from compute.zoo.train import validation_loss

    cfg = ZooModelConfig(name="curve", n_layers=1, d_model=32, n_heads=2, n_ctx=32,
                         vocab_size=400, steps=5, batch_size=4, eval_every=2,
                         save_dtype="float32")
    out = train_zoo_model(cfg, tmp_path / "curve", documents=DOCS, corpus="two hundred docs")
    meta = json.loads((out / ZOO_METADATA_FILE).read_text())
    assert [step for step, _ in meta["val_curve"]] == [2, 4, 5]  # every 2 steps, and the last
    assert meta["corpus"] == "two hundred docs"
    assert meta["device"] == "cpu"
    # the last point is the saved model's validation loss (float32: no rounding on saving),
    # recomputed here from the checkpoint over the same held-out stream
    from transformers import AutoModelForCausalLM

    from compute.zoo.train import VALIDATION_FRACTION, token_stream

    stream = torch.from_numpy(token_stream(load_zoo_tokenizer(out), DOCS))
    held_out = stream[-max(32, int(len(stream) * VALIDATION_FRACTION)):]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert meta["val_curve"][-1][1] == pytest.approx(meta["val_loss"], abs=1e-4)
    assert validation_loss(model, held_out, 32) == pytest.approx(meta["val_loss"], abs=1e-4)


def test_plateau_change_is_the_relative_change_over_the_last_fifth() -> None:
    from compute.zoo.train import plateau_change

    curve = [(100, 4.0), (200, 3.5), (300, 3.2), (400, 3.1), (500, 3.08)]
    # the last 20% of 500 steps starts at step 400
    assert plateau_change(curve) == pytest.approx((3.08 - 3.1) / 3.1)
    assert abs(plateau_change(curve)) < 0.01  # a plateau by issue 38's criterion
    assert plateau_change(curve, fraction=0.5) == pytest.approx((3.08 - 3.2) / 3.2)
    with pytest.raises(ValueError, match="two points"):
        plateau_change([(10, 1.0)])
