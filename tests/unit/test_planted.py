"""Positive controls: every metric finds the structure planted in `compute.zoo.planted`.

Each planted property is checked by one criterion, applied to what Strata computes; where it is
cheap, the same criterion is applied to a deliberately broken computation (a sign flip, an
off-by-one in positions or heads, the wrong axis) and must reject it, so the test shows it would
fail if the metric lost its meaning.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pytest
import torch
from torch import Tensor

from compute.engine import sweep
from compute.errors import UnknownModelError
from compute.metrics.base import EngineOptions
from compute.metrics.neurons import classify, neuron_moments, unembedding_directions
from compute.models import LoadedModel, Processing, load_model, resolve_model_spec, zoo_names
from compute.records import records_to_table
from compute.stability import StabilityOptions, head_match, model_activations, stability_records
from compute.stages import infer_stages
from compute.tokens import TokenSpec, load_tokens, random_repeated_tokens, resolve_token_spec
from compute.zoo import planted as P

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# The engine's induction probe on a 128-token context: BOS, r_1..r_63, r_1..r_63 (seed 0).
N_REPEAT = 63
OPTS = EngineOptions(induction_sequences=4)


def _frame(records: list[Any]) -> pl.DataFrame:
    return pl.from_arrow(records_to_table(records))  # type: ignore[return-value]


def _per_head(df: pl.DataFrame, metric: str, n_layers: int, n_heads: int) -> Tensor:
    rows = df.filter((pl.col("metric") == metric) & pl.col("head").is_not_null())
    out = torch.full((n_layers, n_heads), float("nan"))
    for r in rows.iter_rows(named=True):
        out[r["layer"], r["head"]] = r["value"]
    assert not out.isnan().any(), metric
    return out


def _curve(df: pl.DataFrame, metric: str, component: str | None = None) -> dict[int, float]:
    rows = df.filter(pl.col("metric") == metric)
    if component is not None:
        rows = rows.filter(pl.col("component") == component)
    rows = rows.filter(pl.col("head").is_null() & pl.col("neuron").is_null())
    return {int(r["layer"]): float(r["value"]) for r in rows.iter_rows(named=True)}


def _singles_out(scores: Tensor, where: tuple[int, int], high: float, low: float) -> bool:
    """`where` is above `high` and every other entry below `low`."""
    others = scores.clone()
    others[where] = float("-inf")
    return bool(scores[where] > high) and bool(others.max() < low)


@pytest.fixture(scope="module")
def induction() -> LoadedModel:
    return load_model(resolve_model_spec("planted-induction"))


@pytest.fixture(scope="module")
def stages_lm() -> LoadedModel:
    return load_model(resolve_model_spec("zoo:planted-stages"))


@pytest.fixture(scope="module")
def repeated(induction: LoadedModel) -> Tensor:
    return random_repeated_tokens(OPTS.induction_sequences, N_REPEAT, induction.d_vocab_real,
                                  induction.bos_token_id, seed=OPTS.induction_seed)


@pytest.fixture(scope="module")
def induction_run(induction: LoadedModel, repeated: Tensor) -> pl.DataFrame:
    return _frame(sweep(induction, repeated, ["heads", "attention"], OPTS).records)


@pytest.fixture(scope="module")
def stages_run(stages_lm: LoadedModel) -> tuple[pl.DataFrame, list[Any]]:
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=4, seq_len=64))
    tokens = load_tokens(spec, stages_lm.tokenizer, bos_token_id=stages_lm.bos_token_id,
                         d_vocab=stages_lm.d_vocab, n_ctx=stages_lm.n_ctx)
    result = sweep(stages_lm, tokens, ["intervention", "logit_lens", "neurons", "attention"])
    return _frame(result.records), result.neuron_tokens


def _patterns(lm: LoadedModel, tokens: Tensor) -> list[Tensor]:
    out = []
    with torch.inference_mode():
        x = lm.embed(tokens)
        for layer in range(lm.n_layers):
            run = lm.run_block(layer, x, capture_pattern=True)
            assert run.pattern is not None
            out.append(run.pattern)
            x = run.resid
    return out


# --------------------------------------------------------------------------- induction circuit


def test_induction_score_singles_out_the_planted_head(induction: LoadedModel,
                                                      induction_run: pl.DataFrame,
                                                      repeated: Tensor) -> None:
    scores = _per_head(induction_run, "heads.induction", 2, 4)
    assert _singles_out(scores, P.INDUCTION_HEAD, high=0.95, low=0.05)

    # Broken variants of the score on the same patterns: the query's own earlier occurrence
    # (off by one: key i instead of i+1), and query/key axes exchanged. Both must be rejected.
    n = N_REPEAT
    i = torch.arange(1, n)
    pats = _patterns(induction, repeated)
    exact = torch.stack([p[:, :, n + i, i + 1].mean((0, 2)) for p in pats])
    torch.testing.assert_close(exact, scores.float(), atol=1e-5, rtol=0)
    off_by_one = torch.stack([p[:, :, n + i, i].mean((0, 2)) for p in pats])
    swapped_axes = torch.stack([p[:, :, i + 1, n + i].mean((0, 2)) for p in pats])
    assert not _singles_out(off_by_one, P.INDUCTION_HEAD, high=0.95, low=0.05)
    assert not _singles_out(swapped_axes, P.INDUCTION_HEAD, high=0.95, low=0.05)


def test_previous_token_score_singles_out_the_planted_head(induction: LoadedModel,
                                                           induction_run: pl.DataFrame,
                                                           repeated: Tensor) -> None:
    prev = _per_head(induction_run, "attention.prev_1", 2, 4)
    assert _singles_out(prev, P.PREV_TOKEN_HEAD, high=0.99, low=0.2)
    # Weight on the current token (offset 0) or two back (offset 2) instead of one back.
    pats = _patterns(induction, repeated)
    for offset in (0, 2):
        wrong = torch.stack([p.diagonal(offset=-offset, dim1=-2, dim2=-1)[..., 2:-1].mean((0, 2))
                             for p in pats])
        assert not _singles_out(wrong, P.PREV_TOKEN_HEAD, high=0.99, low=0.2)


def _ablation_loss_delta(lm: LoadedModel, tokens: Tensor, shift: int) -> Tensor:
    """Per-head loss delta from zeroing head (h + shift) mod H when asked for head h."""
    targets = tokens[:, 2:]

    def loss(mask_layer: int | None, head: int | None) -> float:
        with torch.inference_mode():
            x = lm.embed(tokens)
            for layer in range(lm.n_layers):
                mask = None
                if layer == mask_layer and head is not None:
                    mask = torch.ones(tokens.shape[0], lm.n_heads)
                    mask[:, (head + shift) % lm.n_heads] = 0.0
                x = lm.run_block(layer, x, head_mask=mask).resid
            logp = lm.logits(x[:, 1:-1]).log_softmax(-1)
        return float(-logp.gather(-1, targets[..., None]).mean())

    clean = loss(None, None)
    return torch.tensor([[loss(layer, h) - clean for h in range(lm.n_heads)]
                         for layer in range(lm.n_layers)])


def _circuit_dominates(delta: Tensor) -> bool:
    """Both circuit heads cost > 2 nats, the induction head the most, every other head < 5% of
    it (the previous-token head is the induction head's only source of keys, so ablating it
    stops induction as surely: the two are expected to be close)."""
    ind, prev = delta[P.INDUCTION_HEAD], delta[P.PREV_TOKEN_HEAD]
    others = delta.clone()
    others[P.INDUCTION_HEAD] = others[P.PREV_TOKEN_HEAD] = 0.0
    return bool(ind > 2.0 and prev > 2.0 and ind >= delta.max() - 1e-3
                and others.abs().max() < 0.05 * ind)


def test_ablating_the_circuit_heads_raises_loss_on_repeated_sequences(
        induction: LoadedModel, induction_run: pl.DataFrame, repeated: Tensor) -> None:
    delta = _per_head(induction_run, "heads.ablation_loss_delta", 2, 4)
    assert _circuit_dominates(delta)
    # The same computed by hand agrees; with the head index off by one it is rejected.
    torch.testing.assert_close(_ablation_loss_delta(induction, repeated, 0), delta.float(),
                               atol=1e-3, rtol=0)
    assert not _circuit_dominates(_ablation_loss_delta(induction, repeated, 1))


def test_refits_sharing_the_circuit_are_stable_there_and_null_elsewhere(
        induction: LoadedModel) -> None:
    refits = [load_model(resolve_model_spec(f"planted-induction-s{s}")) for s in (1, 2)]
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=8, seq_len=64))
    prompts = load_tokens(spec, induction.tokenizer, bos_token_id=induction.bos_token_id,
                          d_vocab=induction.d_vocab, n_ctx=induction.n_ctx)
    opts = StabilityOptions(n_prompts=8, prompt_len=64, n_null=2, cka_tokens=64)
    df = _frame(stability_records(induction, refits, prompts, opts, load_model))
    stab = _per_head(df, "heads.stability", 2, 4)
    null = _per_head(df, "heads.stability_null", 2, 4)
    planted = [P.PREV_TOKEN_HEAD, P.INDUCTION_HEAD]
    for where in planted:
        assert stab[where] > 0.99
        assert stab[where] > null[where] + 0.5
    diffuse = torch.ones(2, 4, dtype=torch.bool)
    for where in planted:
        diffuse[where] = False
    assert (stab[diffuse] - null[diffuse]).abs().max() < 0.1
    # Matching each anchor head against the refit's heads of the other layer (the wrong axis)
    # loses the circuit.
    base = model_activations(induction, prompts, 64)
    other = model_activations(refits[0], prompts, 64)
    other.patterns = other.patterns.flip(0)
    wrong = head_match(base, other)
    assert all(wrong[where] < 0.9 for where in planted)


# --------------------------------------------------------------------------- planted-stages


def test_sink_head_attends_to_bos(stages_lm: LoadedModel,
                                  stages_run: tuple[pl.DataFrame, list[Any]]) -> None:
    df, _ = stages_run
    bos = _per_head(df, "attention.bos", 6, 4)
    assert _singles_out(bos, P.SINK_HEAD, high=0.99, low=0.2)
    # Attention on the query's own position instead of position 0 is rejected.
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=4, seq_len=64))
    tokens = load_tokens(spec, stages_lm.tokenizer, bos_token_id=0, d_vocab=stages_lm.d_vocab,
                         n_ctx=stages_lm.n_ctx)
    pats = _patterns(stages_lm, tokens)
    current = torch.stack([p.diagonal(dim1=-2, dim2=-1)[..., 1:-1].mean((0, 2)) for p in pats])
    assert not _singles_out(current, P.SINK_HEAD, high=0.99, low=0.2)


def _classes(moments: Tensor) -> dict[str, set[int]]:
    return {cls: set(mask.nonzero().squeeze(-1).tolist())
            for cls, mask in classify(moments).items()}


def _planted_classes(layer: int) -> dict[str, set[int]]:
    return {"prediction": {n for (at, n) in P.PLANTED_PREDICTION if at == layer},
            "suppression": {n for (at, n) in P.PLANTED_SUPPRESSION if at == layer},
            "partition": {n for (at, n) in P.PLANTED_PARTITION if at == layer}}


def test_neurons_are_classified_exactly_as_planted(
        stages_lm: LoadedModel, stages_run: tuple[pl.DataFrame, list[Any]]) -> None:
    df, neuron_tokens = stages_run
    for layer in range(P.STAGES_LAYERS):
        rows = df.filter((pl.col("layer") == layer) & pl.col("neuron").is_not_null())
        moments = torch.tensor([[r["value"] for r in rows.filter(pl.col("metric") == m)
                                 .sort("neuron").iter_rows(named=True)]
                                for m in ("neurons.vocab_mean", "neurons.vocab_var",
                                          "neurons.vocab_skew", "neurons.vocab_kurt")])
        assert _classes(moments) == _planted_classes(layer), layer
        counts = (_curve(df, "neurons.n_prediction")[layer],
                  _curve(df, "neurons.n_suppression")[layer])
        assert counts == (len(_planted_classes(layer)["prediction"]),
                          len(_planted_classes(layer)["suppression"]))

    # The planted tokens are the top promoted (prediction) / suppressed (suppression) tokens.
    tok = stages_lm.tokenizer
    for planted, cls, direction in ((P.PLANTED_PREDICTION, "prediction", "promoted"),
                                    (P.PLANTED_SUPPRESSION, "suppression", "suppressed")):
        for (layer, neuron), strings in planted.items():
            top = {t.token_id for t in neuron_tokens
                   if (t.layer, t.neuron, t.neuron_class, t.direction) ==
                   (layer, neuron, cls, direction) and t.rank < len(strings)}
            assert top == set(P._token_ids(tok, strings)), (layer, neuron)

    # A sign flip of the output weights, or reading input weights instead, is rejected.
    u = unembedding_directions(stages_lm)
    layer = P.SUPPRESSION_LAYER
    w_out = stages_lm.w_out(layer)
    flipped = _classes(neuron_moments(-w_out, u))
    w_in = stages_lm.model.blocks[layer].mlp.W_in.detach().T
    inputs = _classes(neuron_moments(w_in, u))
    assert flipped != _planted_classes(layer)
    assert inputs != _planted_classes(layer)


def _identity_found(drop: dict[int, float], swap: dict[int, float]) -> bool:
    """Drop KL ~0 exactly at the identity layer, swap KL ~0 exactly for the two swaps that
    involve it; every other drop and swap moves the output."""
    ident = P.IDENTITY_LAYER
    zero_swaps = {ident - 1, ident}
    return (all((v < 1e-6) == (layer == ident) for layer, v in drop.items())
            and all((v < 1e-6) == (layer in zero_swaps) for layer, v in swap.items())
            and min(v for layer, v in drop.items() if layer != ident) > 0.05
            and min(v for layer, v in swap.items() if layer not in zero_swaps) > 0.05)


def test_identity_layer_has_zero_drop_and_swap_kl(
        stages_run: tuple[pl.DataFrame, list[Any]]) -> None:
    df, _ = stages_run
    drop = _curve(df, "intervention.kl", "drop")
    swap = _curve(df, "intervention.kl", "swap")
    assert len(drop) == P.STAGES_LAYERS
    assert len(swap) == P.STAGES_LAYERS - 1
    assert _identity_found(drop, swap)
    # Rows labelled one layer off (layer l reporting block l+1) are rejected.
    shifted = {layer: drop[(layer + 1) % len(drop)] for layer in drop}
    assert not _identity_found(shifted, swap)


def test_stage_boundaries_land_where_planted(
        stages_run: tuple[pl.DataFrame, list[Any]]) -> None:
    df, _ = stages_run
    b1, b2, b3 = infer_stages(df, P.STAGES_LAYERS)
    assert (b1.layer, b2.layer, b3.layer) == (2, P.PREDICTION_LAYER, P.SUPPRESSION_LAYER)
    drop = _curve(df, "intervention.kl", "drop")
    assert min(drop[layer] for layer in P.CATASTROPHIC_LAYERS) > 3.0  # nats
    # With prediction and suppression counts exchanged (a sign flip in the classification)
    # the third boundary is not found.
    flipped = df.with_columns(pl.col("metric").replace({
        "neurons.n_prediction": "neurons.n_suppression",
        "neurons.n_suppression": "neurons.n_prediction",
        "neurons.n_prediction_cal": "neurons.n_suppression_cal",
        "neurons.n_suppression_cal": "neurons.n_prediction_cal"}))
    assert infer_stages(flipped, P.STAGES_LAYERS)[2].layer != P.SUPPRESSION_LAYER


# --------------------------------------------------------------------------- registration


def test_planted_models_are_zoo_models_with_a_content_revision() -> None:
    assert {"planted-induction", "planted-induction-s1", "planted-induction-s2",
            "planted-stages"} <= set(zoo_names())
    spec = resolve_model_spec("planted-stages")
    assert (spec.source, spec.name) == ("zoo", "planted-stages")
    assert spec.revision == resolve_model_spec("zoo:planted-stages").revision
    assert str(spec.revision).startswith("sha256:")
    assert resolve_model_spec("planted-induction").revision != \
        resolve_model_spec("planted-induction-s1").revision
    with pytest.raises(UnknownModelError):
        P.planted_model("planted-nothing")


def test_weight_processing_leaves_the_planted_function_unchanged(
        stages_lm: LoadedModel) -> None:
    raw = load_model(resolve_model_spec("planted-stages", processing=Processing(
        fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False)))
    tokens = random_repeated_tokens(2, 20, 4096, 0, seed=3)

    def logprobs(lm: LoadedModel) -> Tensor:
        with torch.inference_mode():
            return lm.model(tokens).log_softmax(-1)

    torch.testing.assert_close(logprobs(stages_lm), logprobs(raw), atol=2e-4, rtol=0)
    # Without a norm, nothing reads the residual with its mean removed: writes are left as
    # they are, and the processing says why.
    assert not stages_lm.applied.center_writing_weights
    assert stages_lm.applied.center_unembed
    assert any("no normalisation" in note for note in stages_lm.applied.notes)


def test_zoo_cli_lists_and_shows_the_expected_answers() -> None:
    from click.testing import CliRunner

    from service.cli import main

    runner = CliRunner()
    listed = runner.invoke(main, ["zoo", "list"])
    assert listed.exit_code == 0, listed.output
    assert "planted-induction\tplanted control:" in listed.output
    shown = runner.invoke(main, ["zoo", "show", "planted-stages"])
    assert shown.exit_code == 0, shown.output
    entry = json.loads(shown.output)
    assert entry["kind"] == "planted control"
    assert any(e["metric"] == "stages.boundary_3" and e["layer"] == 5
               for e in entry["expected"])
    missing = runner.invoke(main, ["zoo", "show", "no-such-model"])
    assert missing.exit_code == 2
