"""The tuned lens: its evaluation against the slow reference, the identity lens against the logit
lens, the training split against the evaluated windows, the stored artifact (reused, never
retrained; exported and imported, mismatches refused) and the positive control
(`zoo:planted-rotated`: the raw lens fails where an exact affine translator exists)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
from safetensors.torch import save_file

from compute.engine import sweep
from compute.errors import LensError, TokenSpecError
from compute.lens.config import LensTraining
from compute.lens.store import LensStore, import_lens, lens_key, provide_lens
from compute.lens.training import final_terms, point_kl, residuals
from compute.lens.translators import BASIS_STRATA, LensInfo, TunedLens
from compute.metrics.base import EngineOptions
from compute.models import LoadedModel, Processing, load_model, resolve_model_spec
from compute.models.bridge import load_tl_weights
from compute.run import RunConfig, compute_run
from compute.tokens import (
    TokenSpec,
    load_tokens,
    resolve_token_spec,
    training_windows,
    window_order,
    window_split,
)
from compute.zoo import planted as P
from tests import reference

pytestmark = pytest.mark.usefixtures("single_torch_thread")
METRICS = ("kl_to_final", "entropy", "top1_agreement", "loss")
TINY_TRAINING = LensTraining(steps=3, sequences_per_step=2, train_sequences=4)


def _frame(records: list[Any]) -> pl.DataFrame:
    return pl.DataFrame([dataclasses.asdict(r) for r in records])


def _random_lens(lm: LoadedModel, seed: int, scale: float = 0.3) -> TunedLens:
    gen = torch.Generator().manual_seed(seed)
    d, n = lm.d_model, lm.n_layers
    info = LensInfo(key="0" * 16, n_layers=n, d_model=d, basis=BASIS_STRATA)
    weight = torch.randn(n, d, d, generator=gen) * scale / d**0.5
    return TunedLens(weight, torch.randn(n, d, generator=gen) * scale, info)


@pytest.fixture(scope="module")
def zoo_lm() -> LoadedModel:
    return load_model(resolve_model_spec("zoo:tiny-2l-s0"))


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize(
    "arch",
    [
        {},  # GPT-2 style: LayerNorm, standard processing
        {"normalization_type": "RMS", "gated_mlp": True, "act_fn": "silu", "n_layers": 2},
    ],
    ids=["layernorm", "rmsnorm-gated"],
)
def test_engine_matches_the_reference(
    tiny_factories: dict[str, Callable[..., Any]], arch: dict[str, Any]
) -> None:
    lm = tiny_factories["random"](seed=3, **arch)
    tokens = tiny_factories["tokens"](3, 14, lm.d_vocab_real, lm.bos_token_id, seed=5)
    lens = _random_lens(lm, seed=1)
    with lm.using_lens(lens):
        got = _frame(sweep(lm, tokens, ["tuned_lens"], EngineOptions(batch_size=2)).records)
    want = reference.to_frame(
        reference.tuned_lens_rows(
            lm, tokens, [w.double().numpy() for w in lens.weight],
            [b.double().numpy() for b in lens.bias],
        )
    )
    assert got.height == want.height == 4 * (lm.n_layers + 1)
    joined = got.join(want, on=["metric", "layer"], suffix="_ref")
    assert joined.height == got.height
    for row in joined.iter_rows(named=True):
        assert row["n"] == row["n_ref"] == 3
        assert row["unit"] == row["unit_ref"]
        assert row["value"] == pytest.approx(row["value_ref"], abs=1e-4, rel=1e-4), row
        assert row["stderr"] == pytest.approx(row["stderr_ref"], abs=1e-4, rel=1e-4), row
    # a random translator moves the read-out: the lens is not silently the identity
    kl = joined.filter(pl.col("metric") == "tuned_lens.kl_to_final").sort("layer")
    assert kl["value"][0] > 1e-3
    assert kl["value"][-1] == 0.0


def test_the_identity_lens_is_the_logit_lens(zoo_lm: LoadedModel) -> None:
    tokens = load_tokens(
        resolve_token_spec(TokenSpec(source="builtin", n_sequences=3, seq_len=24)),
        zoo_lm.tokenizer, bos_token_id=zoo_lm.bos_token_id, d_vocab=zoo_lm.d_vocab,
        n_ctx=zoo_lm.n_ctx,
    )
    info = LensInfo("0" * 16, zoo_lm.n_layers, zoo_lm.d_model, BASIS_STRATA)
    with zoo_lm.using_lens(TunedLens.identity(info)):
        df = _frame(sweep(zoo_lm, tokens, ["logit_lens", "tuned_lens"]).records)
    assert zoo_lm.tuned_lens is None  # the lens is the sweep's, not the cached model's
    for metric in METRICS:
        raw = df.filter(pl.col("metric") == f"logit_lens.{metric}").sort("layer")
        tuned = df.filter(pl.col("metric") == f"tuned_lens.{metric}").sort("layer")
        np.testing.assert_allclose(tuned["value"], raw["value"], atol=1e-6)


def test_the_family_without_a_lens_is_refused(zoo_lm: LoadedModel) -> None:
    tokens = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(Exception, match="needs a lens"):
        sweep(zoo_lm, tokens, ["tuned_lens"])


def test_the_training_loss_is_the_kl_to_final(zoo_lm: LoadedModel) -> None:
    """What training minimises, against KL computed the obvious way in float64."""
    lens = _random_lens(zoo_lm, seed=2)
    tokens = torch.randint(0, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    resid = residuals(zoo_lm, tokens)
    model = zoo_lm.model
    final = reference._logits_from_resid(model, resid[-1][:, 1:-1]).double()
    logp = torch.log_softmax(final, -1).reshape(-1, final.shape[-1])
    for point in range(zoo_lm.n_layers):
        h = resid[point][:, 1:-1].reshape(-1, zoo_lm.d_model)
        got = point_kl(zoo_lm, lens.weight, lens.bias, point, h, logp.float())
        shared = point_kl(zoo_lm, lens.weight, lens.bias, point, h, logp.float(),
                          final_terms(logp.float()))  # as training calls it: made once a step
        assert float(shared) == float(got)
        moved = h.double() + h.double() @ lens.weight[point].double().T + lens.bias[point]
        logq = torch.log_softmax(reference._logits_from_resid(model, moved.float()).double(), -1)
        want = float((logp.exp() * (logp - logq)).sum(-1).mean())
        assert float(got) == pytest.approx(want, rel=1e-4, abs=1e-6)


# --------------------------------------------------------------------------- splits


def test_training_and_evaluation_windows_never_overlap() -> None:
    evaluated, training = window_split(100, n_evaluated=30, n_training=70, seed=4)
    assert not set(evaluated.tolist()) & set(training.tolist())
    assert sorted([*evaluated.tolist(), *training.tolist()]) == list(range(100))
    assert evaluated.tolist() == window_order(100, 4)[:30].tolist()  # what a run evaluates
    with pytest.raises(TokenSpecError, match="too few"):
        window_split(100, n_evaluated=31, n_training=70, seed=4)


def test_the_training_split_is_disjoint_from_the_run_tokens(zoo_lm: LoadedModel) -> None:
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=40, seq_len=32, seed=3))
    kw = dict(bos_token_id=zoo_lm.bos_token_id, d_vocab=zoo_lm.d_vocab, n_ctx=zoo_lm.n_ctx)
    run = load_tokens(spec, zoo_lm.tokenizer, **kw)
    train = training_windows(spec, zoo_lm.tokenizer, n_training=200, **kw)
    assert train.shape == (200, 32)
    assert bool((train[:, 0] == zoo_lm.bos_token_id).all())
    # windows are non-overlapping slices of one stream: distinct windows share no position, and
    # (the corpus repeating no 31-token passage here) no evaluated window is a training one
    evaluated = {tuple(r) for r in run[:, 1:].tolist()}
    assert not evaluated & {tuple(r) for r in train[:, 1:].tolist()}


def test_sources_without_a_training_split_are_refused(zoo_lm: LoadedModel, tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.zeros((2, 8), dtype=np.int64))
    spec = TokenSpec(source="npy", path=str(tmp_path / "t.npy"), n_sequences=2, seq_len=8)
    with pytest.raises(TokenSpecError, match="no training split"):
        training_windows(spec, zoo_lm.tokenizer, n_training=4, bos_token_id=0,
                         d_vocab=zoo_lm.d_vocab, n_ctx=zoo_lm.n_ctx)


# --------------------------------------------------------------------------- the artifact


def _config(lm: LoadedModel, training: LensTraining = TINY_TRAINING) -> RunConfig:
    return RunConfig(
        model=lm.spec,
        tokens=TokenSpec(source="builtin", n_sequences=2, seq_len=16),
        families=("tuned_lens",),
        options=EngineOptions(tuned_lens=training),
    )


def test_a_stored_lens_is_reused_never_retrained(zoo_lm: LoadedModel, tmp_path: Path) -> None:
    store = LensStore(tmp_path)
    first = compute_run(_config(zoo_lm), lm=zoo_lm, lenses=store)
    assert first.lens is not None
    assert first.lens["trained"] is True
    assert first.lens["steps"] == 3
    assert first.lens["tokens_per_step"] == 2 * 14
    key = first.lens["key"]
    assert [i.key for i in store.list()] == [key]
    stamp = store.path(key).stat().st_mtime_ns
    second = compute_run(_config(zoo_lm), lm=zoo_lm, lenses=store)
    assert second.lens is not None
    assert second.lens["trained"] is False
    assert second.lens["key"] == key
    assert store.path(key).stat().st_mtime_ns == stamp
    assert second.records.equals(first.records)
    # another training configuration is another lens (and another run)
    other = _config(zoo_lm, TINY_TRAINING.model_copy(update={"seed": 1}))
    assert other.config_hash() != _config(zoo_lm).config_hash()
    third = compute_run(other, lm=zoo_lm, lenses=store)
    assert third.lens is not None
    assert third.lens["trained"]
    assert third.lens["key"] != key


def test_a_runs_progress_is_one_total_training_steps_then_sweep_units(
    zoo_lm: LoadedModel, tmp_path: Path
) -> None:
    """The training's steps and the sweep's units count against one total from the first
    report (a bar and a job's ETA see one run); a reused lens adds no steps."""
    store = LensStore(tmp_path)
    config = RunConfig(model=zoo_lm.spec,
                       tokens=TokenSpec(source="builtin", n_sequences=3, seq_len=16),
                       families=("logit_lens", "tuned_lens"),
                       options=EngineOptions(tuned_lens=TINY_TRAINING, batch_size=1))
    for trains in (True, False):
        seen: list[Any] = []
        result = compute_run(config, lm=zoo_lm, lenses=store, progress=seen.append)
        assert result.lens is not None
        assert result.lens["trained"] is trains
        sweep_total = 3 * 2 * (zoo_lm.n_layers + 1)  # 3 batches x 2 lens families x L + 1
        total = sweep_total + (TINY_TRAINING.steps if trains else 0)
        assert {p.total for p in seen} == {total}
        done = [p.done for p in seen]
        assert done == sorted(done)
        assert done[-1] == total
        if trains:
            assert done[: TINY_TRAINING.steps] == [1, 2, 3]
        elapsed = [p.elapsed_s for p in seen]
        assert elapsed == sorted(elapsed)  # one clock for the run, not one per phase


def test_runs_without_the_family_keep_their_hash(zoo_lm: LoadedModel) -> None:
    plain = RunConfig(model=zoo_lm.spec, tokens=TokenSpec(source="builtin", n_sequences=2,
                                                          seq_len=16), families=("logit_lens",))
    tuned = plain.model_copy(update={"options": EngineOptions(tuned_lens=TINY_TRAINING)})
    assert plain.config_hash() == tuned.config_hash()
    assert "tuned_lens" not in plain.canonical_json()


def test_export_then_import_and_mismatches_refused(zoo_lm: LoadedModel, tmp_path: Path) -> None:
    store = LensStore(tmp_path / "a")
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=2, seq_len=16))
    lens, _ = provide_lens(zoo_lm, spec, TINY_TRAINING, store)
    assert lens.info.key == lens_key(zoo_lm.spec, spec, TINY_TRAINING)
    exported = store.export(lens.info.key, tmp_path / "out" / "lens.safetensors")
    other = LensStore(tmp_path / "b")
    imported = import_lens(exported, zoo_lm, other)
    assert imported.info == lens.info
    assert torch.equal(other.get(lens.info.key).weight, lens.weight)
    # used by a run through its key, without training
    used, how = provide_lens(zoo_lm, spec, TINY_TRAINING.model_copy(
        update={"lens": lens.info.key}), other)
    assert how["trained"] is False
    assert torch.equal(used.bias, lens.bias)

    tensors = lens.tensors()
    bad = {
        "narrow": {k: v[..., :-1] if k.endswith("bias") else v for k, v in tensors.items()},
        "short": {k: v for k, v in tensors.items() if not k.startswith("1.")},
        "extra": {**tensors, "unembed.weight": torch.zeros(3)},
    }
    messages = {"narrow": "d_model is", "short": "translators for 1 points",
                "extra": "unexpected tensor"}
    for name, content in bad.items():
        save_file(content, str(tmp_path / f"{name}.safetensors"))
        with pytest.raises(LensError, match=messages[name]):
            import_lens(tmp_path / f"{name}.safetensors", zoo_lm, other)
    (tmp_path / "junk.safetensors").write_bytes(b"not a lens")
    with pytest.raises(LensError, match="cannot read"):
        import_lens(tmp_path / "junk.safetensors", zoo_lm, other)
    with pytest.raises(LensError, match="no stored lens"):
        other.get("ffffffffffffffff")


def test_a_tuned_lens_package_lens_imports_in_the_huggingface_basis(
    zoo_lm: LoadedModel, tmp_path: Path
) -> None:
    """The package's layer_translators state dict, saved as safetensors: used as it is where
    the run leaves the residual stream alone, refused where centring moved it."""
    lens = _random_lens(zoo_lm, seed=4)
    package = {f"layer_translators.{i}.{k}": getattr(lens, "weight" if k == "weight" else
                                                     "bias")[i].contiguous()
               for i in range(zoo_lm.n_layers) for k in ("weight", "bias")}
    path = tmp_path / "params.safetensors"
    save_file(package, str(path))
    with pytest.raises(LensError, match="centres the writing weights"):
        import_lens(path, zoo_lm, LensStore(tmp_path / "s"))  # standard processing: centred
    raw = load_model(resolve_model_spec("zoo:tiny-2l-s0", processing=Processing(
        fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False)))
    imported = import_lens(path, raw, LensStore(tmp_path / "s"))
    assert imported.info.basis == "huggingface"
    assert torch.equal(imported.weight, lens.weight)


# --------------------------------------------------------------------------- positive control


@pytest.fixture(scope="module")
def rotated() -> LoadedModel:
    return load_model(resolve_model_spec("zoo:planted-rotated"))


def test_the_rotation_preserves_the_model_function(rotated: LoadedModel) -> None:
    tokens = torch.randint(0, rotated.d_vocab, (2, 20), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = rotated.bos_token_id
    with torch.no_grad():
        rotated_logits = rotated.model(tokens).clone()
        plain = P.build_rotated(0, rotated.d_vocab, rotate=False)
        unrotated = load_model(resolve_model_spec("zoo:planted-rotated"))
        load_tl_weights(unrotated.model, {k: v.float() for k, v in plain.tensors.items()})
        unrotated.forget_derived_weights()
        plain_logits = unrotated.model(tokens)
    assert not torch.equal(unrotated.model.unembed.W_U, rotated.model.unembed.W_U)
    # the same next-token distribution (the loaded model's unembedding is centred over the
    # vocabulary, the raw one is not: logits differ by a constant per position)
    diff = rotated_logits.log_softmax(-1) - plain_logits.log_softmax(-1)
    assert diff.abs().max() < 1e-4


def test_the_tuned_lens_recovers_the_rotated_points(rotated: LoadedModel, tmp_path: Path) -> None:
    training = LensTraining(steps=200, train_sequences=128)
    config = RunConfig(
        model=rotated.spec,
        tokens=TokenSpec(source="builtin", n_sequences=16, seq_len=64),
        families=("logit_lens", "tuned_lens"),
        options=EngineOptions(tuned_lens=training),
    )
    result = compute_run(config, lm=rotated, lenses=LensStore(tmp_path))
    df = pl.from_arrow(result.records)
    assert isinstance(df, pl.DataFrame)

    def kl(family: str) -> list[float]:
        rows = df.filter(pl.col("metric") == f"{family}.kl_to_final").sort("layer")
        return rows["value"].to_list()

    raw, tuned = kl("logit_lens"), kl("tuned_lens")
    # points 0-2 precede the rotation (block 2): the raw lens reads them in the wrong basis
    assert min(raw[:3]) > 1.0
    # an exact translator exists at points 1-3 (a -> 2aQ, then a -> 2a): the tuned lens finds it
    assert max(tuned[1:4]) < 0.05
    # point 0 (the embeddings) lacks the context layer 0 adds: no translator is exact there,
    # and the tuned lens is still a tenth of the raw lens or less
    assert tuned[0] < 0.1 * raw[0]
    assert raw[4] == tuned[4] == 0.0
