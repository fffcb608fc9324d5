"""Properties every sweep must have, whatever the model: exact zeros where the maths gives zero,
invariance to weight processing, neuron moments of a hand-built model, the record catalog, and
the compute/service boundary.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.stats
import torch

from compute.engine import sweep
from compute.metrics.base import EngineOptions
from compute.records import Record, records_to_table, unit_of, validate_records

pytestmark = pytest.mark.usefixtures("single_torch_thread")

ALL_FAMILIES = ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms",
                "heads"]
OPTS = EngineOptions(batch_size=2, induction_n=8, induction_sequences=3, top_neurons=3,
                     top_tokens=4)
UNPROCESSED = dict(fold_ln=False, center_writing_weights=False, center_unembed=False,
                   fold_value_biases=False)
ROTARY = dict(positional_embedding_type="rotary", rotary_dim=4)  # native blocks are sequential

Factories = dict[str, Callable[..., Any]]


def _by_key(records: list[Record]) -> dict[tuple[Any, ...], Record]:
    return {(r.metric, r.layer, r.component, r.head, r.neuron): r for r in records}


@pytest.fixture(scope="module")
def full_sweep(tiny_factories: Factories) -> tuple[Any, list[Record]]:
    lm = tiny_factories["random"](seed=21)
    tokens = tiny_factories["tokens"](3, 20, lm.d_vocab_real, lm.bos_token_id, seed=1)
    return lm, sweep(lm, tokens, ALL_FAMILIES, OPTS).records


@pytest.fixture(scope="module")
def neox_sweep(tiny_factories: Factories, hf_neox_dir: Path) -> tuple[Any, list[Record]]:
    lm = tiny_factories["checkpoint"](hf_neox_dir)
    tokens = tiny_factories["tokens"](3, 20, lm.d_vocab_real, lm.bos_token_id, seed=2)
    return lm, sweep(lm, tokens, ALL_FAMILIES, OPTS).records


@pytest.fixture(params=["full_sweep", "neox_sweep"])
def any_sweep(request: pytest.FixtureRequest) -> tuple[Any, list[Record]]:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- exact values


def test_kl_is_never_negative(any_sweep: tuple[Any, list[Record]]) -> None:
    _, records = any_sweep
    kls = [r for r in records
           if r.metric in ("intervention.kl", "logit_lens.kl_to_final", "heads.ablation_kl")]
    assert len(kls) > 10
    assert all(r.value >= 0.0 for r in kls), [r for r in kls if r.value < 0]


def test_logit_lens_is_exact_at_the_last_point(any_sweep: tuple[Any, list[Record]]) -> None:
    lm, records = any_sweep
    last = _by_key(records)
    kl = last[("logit_lens.kl_to_final", lm.n_layers, None, None, None)]
    agreement = last[("logit_lens.top1_agreement", lm.n_layers, None, None, None)]
    assert kl.value == 0.0
    assert kl.stderr == 0.0
    assert agreement.value == 1.0
    assert all(r.value > 0.0 for r in records
               if r.metric == "logit_lens.kl_to_final" and r.layer < lm.n_layers)


def test_the_unmodified_model_row_is_the_baseline(any_sweep: tuple[Any, list[Record]]) -> None:
    _, records = any_sweep
    none = {r.metric: r for r in records if r.component == "none"}
    assert set(none) == {f"intervention.{m}" for m in (
        "kl", "top1_agreement", "entropy", "entropy_delta", "loss", "loss_delta", "accuracy")}
    assert all(r.layer is None for r in none.values())
    assert none["intervention.kl"].value == 0.0
    assert none["intervention.top1_agreement"].value == 1.0
    assert none["intervention.loss_delta"].value == 0.0
    assert none["intervention.entropy_delta"].value == 0.0
    assert none["intervention.entropy_delta"].stderr == 0.0


@pytest.mark.parametrize("arch", [{}, ROTARY], ids=["gpt2-style", "rotary"])
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_dropping_an_all_zero_block_changes_nothing(tiny_factories: Factories, layer: int,
                                                    arch: dict[str, Any]) -> None:
    lm = tiny_factories["random"](seed=22, **arch)
    with torch.no_grad():
        for p in lm.model.blocks[layer].parameters():
            p.zero_()
    assert float(lm.model.blocks[layer].attn.b_O.abs().sum()) == 0.0
    assert float(lm.model.blocks[layer].mlp.b_out.abs().sum()) == 0.0
    tokens = tiny_factories["tokens"](3, 16, lm.d_vocab_real, lm.bos_token_id, seed=3)
    got = _by_key(sweep(lm, tokens, ["intervention"], OPTS).records)
    for kind in ("drop", "drop_attn", "drop_mlp"):
        assert got[("intervention.kl", layer, kind, None, None)].value == 0.0, kind
        assert got[("intervention.top1_agreement", layer, kind, None, None)].value == 1.0, kind
        assert got[("intervention.loss_delta", layer, kind, None, None)].value == 0.0, kind
    # ...while dropping a block that does write something is visible.
    other = (layer + 1) % lm.n_layers
    assert got[("intervention.kl", other, "drop", None, None)].value > 1e-3


# --------------------------------------------------------------------------- weight processing

INVARIANT_FAMILIES = ["intervention", "logit_lens", "attention", "heads"]


@pytest.mark.parametrize("checkpoint", ["hf_gpt2_dir", "hf_neox_dir"])
def test_results_do_not_depend_on_weight_processing(
        request: pytest.FixtureRequest, tiny_factories: Factories, checkpoint: str) -> None:
    """Folding LayerNorm, centering writing weights / the unembedding and folding value biases
    change the weights but not the function: interventions (drop, swap, drop_attn, drop_mlp),
    the logit lens, attention patterns and induction scores must not move.

    (Head ablation is not in the list on purpose: zeroing z removes the value-bias write only
    when value biases are not folded into b_O, so heads.ablation_* depends on the processing,
    which is stored with every run.)
    """
    path = request.getfixturevalue(checkpoint)
    processed = tiny_factories["checkpoint"](path)
    raw = tiny_factories["checkpoint"](path, UNPROCESSED)
    assert processed.applied.fold_ln
    assert not raw.applied.fold_ln
    assert raw.cfg.normalization_type == "LN"
    gains = [raw.model.blocks[0].ln1.w, raw.model.ln_final.b]
    assert all(float((g - g.mean()).abs().max()) > 0.1 for g in gains), "LN must be non-trivial"
    tokens = tiny_factories["tokens"](3, 20, processed.d_vocab_real, processed.bos_token_id,
                                      seed=4)
    a = _by_key(sweep(processed, tokens, INVARIANT_FAMILIES, OPTS).records)
    b = _by_key(sweep(raw, tokens, INVARIANT_FAMILIES, OPTS).records)
    a = {k: r for k, r in a.items() if not k[0].startswith("heads.ablation")}
    b = {k: r for k, r in b.items() if not k[0].startswith("heads.ablation")}
    assert set(a) == set(b)
    assert {k[2] for k in a if k[0] == "intervention.kl"} == {
        "none", "drop", "swap", "drop_attn", "drop_mlp"}
    worse = {k: (a[k].value, b[k].value) for k in a
             if abs(a[k].value - b[k].value) > 1e-4 * max(1.0, abs(b[k].value))}
    assert not worse


# --------------------------------------------------------------------------- neuron moments


def _hand_built_unembedding(d_model: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
    """Unit, doubly centered W_U columns with known cosines to two directions e1, e2.

    Tokens come in pairs (2k, 2k+1) sharing c_k: u = c_k e1 ± sqrt(1 - c_k^2) e2, with e1, e2
    orthonormal and orthogonal to the all-ones vector. Then every column is centered over d_model
    and has unit norm, the ± pairs and sum(c) = 0 center the vocabulary, and the cosine of u with
    e1 is exactly c. Here 49 pairs have c = -0.02 and the last pair c = 0.98: a two-point
    distribution with p = 0.02, heavy-tailed and positively skewed.
    """
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(np.column_stack([np.ones(d_model), rng.normal(size=(d_model, 2))]))
    e1, e2 = basis[:, 1], basis[:, 2]
    c = np.repeat(np.r_[np.full(49, -0.02), 0.98], 2)
    sign = np.tile([1.0, -1.0], 50)
    s = np.sqrt(1.0 - c**2)
    w_u = np.outer(e1, c) + np.outer(e2, sign * s)
    return w_u, e1, e2, c


def test_neuron_moments_of_a_hand_built_model(tiny_factories: Factories) -> None:
    lm = tiny_factories["random"](seed=23, n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=4,
                                  d_vocab=100)
    w_u, e1, e2, c = _hand_built_unembedding(lm.d_model)
    rows = np.stack([e1, -e1, e2, (e1 + e2) / math.sqrt(2)])
    with torch.no_grad():
        lm.model.unembed.W_U.copy_(torch.from_numpy(w_u).float())
        lm.model.blocks[1].mlp.W_out.copy_(torch.from_numpy(rows).float())
    sign = np.tile([1.0, -1.0], 50)
    s = np.sqrt(1.0 - c**2)
    cosines = [c, -c, sign * s, (c + sign * s) / math.sqrt(2)]
    out = sweep(lm, torch.zeros(1, 3, dtype=torch.long), ["neurons"],
                EngineOptions(top_neurons=4, top_tokens=2))
    got = _by_key(out.records)

    # The two-point distribution (p = 0.02 at 0.98, else -0.02) in closed form.
    p, q = 0.02, 0.98
    assert scipy.stats.skew(c) == pytest.approx((1 - 2 * p) / math.sqrt(p * q))
    assert scipy.stats.kurtosis(c, fisher=False) == pytest.approx((1 - 3 * p * q) / (p * q))
    for neuron, cos in enumerate(cosines):
        expected = {"vocab_mean": np.mean(cos), "vocab_var": np.var(cos),
                    "vocab_skew": scipy.stats.skew(cos),
                    "vocab_kurt": scipy.stats.kurtosis(cos, fisher=False)}
        for name, value in expected.items():
            record = got[(f"neurons.{name}", 1, None, None, neuron)]
            assert record.value == pytest.approx(value, rel=1e-4, abs=1e-5), (neuron, name)
            assert record.n == 100
            assert record.stderr is None
    assert got[("neurons.vocab_kurt", 1, None, None, 0)].value == pytest.approx(48.02, rel=1e-4)
    assert got[("neurons.vocab_skew", 1, None, None, 1)].value == pytest.approx(-6.857, rel=1e-3)
    counts = {cls: got[(f"neurons.n_{cls}", 1, None, None, None)].value
              for cls in ("prediction", "suppression", "partition")}
    assert counts == {"prediction": 1, "suppression": 1, "partition": 4}
    assert got[("neurons.frac_prediction", 1, None, None, None)].value == 0.25
    top: dict[tuple[str, str], set[int]] = defaultdict(set)
    for t in out.neuron_tokens:
        if t.layer == 1:
            top[(t.neuron_class, t.direction)].add(t.token_id)
    assert top[("prediction", "promoted")] == {98, 99}
    assert top[("suppression", "suppressed")] == {98, 99}


# --------------------------------------------------------------------------- the record format


def test_units_match_the_catalog(full_sweep: tuple[Any, list[Record]]) -> None:
    _, records = full_sweep
    wrong = {(r.metric, r.unit, unit_of(r.metric)) for r in records
             if unit_of(r.metric) is None or r.unit != unit_of(r.metric)}
    assert not wrong
    families = {r.metric.split(".")[0] for r in records}
    assert families == {"intervention", "logit_lens", "neurons", "similarity", "attention",
                        "norms", "heads"}


def test_record_table_validates(any_sweep: tuple[Any, list[Record]]) -> None:
    lm, records = any_sweep
    table = validate_records(records_to_table(records), n_layers=lm.n_layers)
    assert table.num_rows == len(records)
    assert table.column("metric").to_pylist() == [r.metric for r in records]
    assert all(math.isfinite(r.value) for r in records)
    assert all(r.n > 0 for r in records)
    assert all(asdict(r)["component"] in (None, "drop", "swap", "drop_attn", "drop_mlp", "none",
                                          "attn", "mlp", "swap-drop") for r in records)


@pytest.mark.parametrize(("seq_len", "window"), [(128, None), (24, None), (40, 8)])
def test_attention_chance_levels_are_the_closed_forms(seq_len: int, window: int | None) -> None:
    """The chance level of each attention metric (uniform attention over the visible keys)
    against its closed form, query by query: prev_k = k / visible, bos = 1 / visible (0 once
    a sliding window has left position 0), entropy = log2(visible), over the evaluated queries
    1..T-2 (q > k for prev_k)."""
    import math

    from compute.metrics.attention import chance_levels

    ks = (1, 2, 5, 16)
    got = chance_levels(seq_len, ks, window)
    visible = [min(q + 1, window or q + 1) for q in range(seq_len)]
    queries = range(1, seq_len - 1)
    assert got["bos"] == pytest.approx(
        sum((1 / visible[q]) if q < (window or seq_len) else 0.0 for q in queries)
        / len(queries), rel=1e-6)
    assert got["entropy"] == pytest.approx(
        sum(math.log2(visible[q]) for q in queries) / len(queries), rel=1e-6)
    for k in ks:
        if k > seq_len - 3:
            assert f"prev_{k}" not in got
            continue
        qs = [q for q in queries if q > k]
        want = sum(min(k, visible[q] - 1) / visible[q] for q in qs) / len(qs)
        assert got[f"prev_{k}"] == pytest.approx(want, rel=1e-6), k
        assert got[f"prev_{k}_mean"] == pytest.approx(want / k, rel=1e-6), k
