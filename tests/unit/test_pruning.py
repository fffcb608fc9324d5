"""The layer-pruning families (`pruning`, `pruning_drops`) against a slow, obvious reference,
their FLOP count, and their positive controls (`zoo:planted-pruning`, `zoo:planted-stages`).

The reference runs one sequence at a time through `lm.embed` and `lm.run_block` (no hooks, no
cached residuals): the residual points of the clean model by the obvious loop, cosines position
by position in float64 numpy, and every n-block drop as a fresh forward of the whole model with
those blocks left out, compared with its own clean forward position by position.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from compute.engine import sweep
from compute.flops import family_flops, pruning_flops
from compute.memory import ModelDims
from compute.metrics.base import EngineOptions
from compute.metrics.pruning import angular_widths
from compute.metrics.pruning_drops import DROP_WIDTHS, drop_widths
from compute.models import zoo_names
from compute.records import records_to_table, validate_records

pytestmark = pytest.mark.usefixtures("single_torch_thread")
TOL = 1e-4  # the drops: float32 model, float64 reductions (as the reference engine test)
COS_TOL = 1e-6  # the predictors: float32 residuals, float64 cosines on both sides

Factories = dict[str, Callable[..., Any]]
UNCENTRED = dict(center_writing_weights=False)


def _frame(records: list[Any], n_layers: int) -> pl.DataFrame:
    table = validate_records(records_to_table(records), n_layers=n_layers)
    return pl.from_arrow(table)  # type: ignore[return-value]


# --------------------------------------------------------------------------- the reference


def _points(lm: Any, seq: torch.Tensor, skip: frozenset[int] = frozenset()) -> list[np.ndarray]:
    """Residual points 0..L of one sequence ([T, d] each, float64), blocks in `skip` left out
    (their output is their input)."""
    with torch.inference_mode():
        x = lm.embed(seq[None])
        points = [x[0].double().numpy()]
        for layer in range(lm.n_layers):
            if layer not in skip:
                x = lm.run_block(layer, x).resid
            points.append(x[0].double().numpy())
    return points


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return min(1.0, max(-1.0, float(np.dot(a, b)) / (na * nb)))


def _mean_row(per_sequence: list[list[float]]) -> tuple[float, float | None, int, np.ndarray]:
    """(mean of per-sequence means, their std (ddof 1) / sqrt(n), n, the per-sequence means)."""
    means = np.asarray([np.mean(v) for v in per_sequence])
    n = len(means)
    stderr = float(means.std(ddof=1) / math.sqrt(n)) if n > 1 else None
    return float(means.mean()), stderr, n, means


def reference_predictors(lm: Any, tokens: torch.Tensor) -> dict[tuple[str, int], tuple]:
    """(metric, layer) -> (value, stderr, n) of block influence and both angular distances."""
    values: dict[tuple[str, int], list[list[float]]] = {}
    n_layers = lm.n_layers
    for seq in tokens:
        x = _points(lm, seq)
        t = len(seq)
        for layer in range(n_layers):
            row = [1.0 - _cos(x[layer][p], x[layer + 1][p]) for p in range(1, t - 1)]
            values.setdefault(("pruning.block_influence", layer), []).append(row)
        for n in range(1, max(1, n_layers // 2) + 1):
            for start in range(n_layers - n + 1):
                a, b = x[start], x[start + n]
                row = [math.acos(_cos(a[p], b[p])) / math.pi for p in range(1, t - 1)]
                values.setdefault((f"pruning.angular_distance_{n}", start), []).append(row)
                last = [math.acos(_cos(a[t - 1], b[t - 1])) / math.pi]
                values.setdefault((f"pruning.angular_distance_last_{n}", start), []).append(last)
    return {key: _mean_row(rows) for key, rows in values.items()}


def _compare(p_logits: torch.Tensor, q_logits: torch.Tensor, seq: torch.Tensor) -> list[dict]:
    """Per evaluated position: the intervention family's per-token quantities."""
    logp = torch.log_softmax(p_logits.double(), -1)
    logq = torch.log_softmax(q_logits.double(), -1)
    out = []
    for p in range(1, len(seq) - 1):
        target = int(seq[p + 1])
        hq = float(-(logq[p].exp() * logq[p]).sum()) / math.log(2)
        hp = float(-(logp[p].exp() * logp[p]).sum()) / math.log(2)
        top_q, top_p = int(q_logits[p].argmax()), int(p_logits[p].argmax())
        out.append(
            {
                "kl": float((logp[p].exp() * (logp[p] - logq[p])).sum()),
                "top1_agreement": float(top_q == top_p),
                "entropy": hq,
                "entropy_delta": hq - hp,
                "loss": float(-logq[p, target]),
                "loss_delta": float(-logq[p, target] + logp[p, target]),
                "accuracy": float(top_q == target),
            }
        )
    return out


def reference_drops(
    lm: Any, tokens: torch.Tensor, widths: tuple[int, ...] = DROP_WIDTHS
) -> dict[tuple[str, int], tuple]:
    """(metric, start) -> (value, stderr, n) of every n-block drop (n in `widths`, at most
    half the blocks), each a fresh forward."""
    values: dict[tuple[str, int], list[list[float]]] = {}
    for seq in tokens:
        with torch.inference_mode():
            clean = lm.logits(torch.from_numpy(_points(lm, seq)[-1]).float())
        for n in [n for n in widths if n <= max(1, lm.n_layers // 2)]:
            for start in range(lm.n_layers - n + 1):
                final = _points(lm, seq, frozenset(range(start, start + n)))[-1]
                with torch.inference_mode():
                    dropped = lm.logits(torch.from_numpy(final).float())
                per_token = _compare(clean, dropped, seq)
                for metric in per_token[0]:
                    row = [v[metric] for v in per_token]
                    values.setdefault((f"pruning_drops.{metric}_{n}", start), []).append(row)
    return {key: _mean_row(rows) for key, rows in values.items()}


def _check(engine: pl.DataFrame, reference: dict[tuple[str, int], tuple], tol: float) -> None:
    got = {(r["metric"], r["layer"]): r for r in engine.iter_rows(named=True)}
    assert set(got) == set(reference), sorted(set(got) ^ set(reference))[:6]
    for key, (value, stderr, n, _) in reference.items():
        row = got[key]
        scale = max(1.0, abs(value))
        assert abs(row["value"] - value) <= tol * scale, (key, row["value"], value)
        assert row["n"] == n, key
        if stderr is None:
            assert row["stderr"] is None, key
        else:
            assert abs(row["stderr"] - stderr) <= tol * max(1.0, stderr), (key, row, stderr)


# --------------------------------------------------------------------------- the cases

CASES: dict[str, Callable[[Factories, pytest.FixtureRequest], Any]] = {
    # GPT-2 style: LayerNorm, writing weights centered (the processed stream is centred)
    "gpt2-random": lambda f, r: f["random"](seed=1, n_layers=5),
    "gpt2-random-uncentred": lambda f, r: f["random"](seed=1, n_layers=5, processing=UNCENTRED),
    "llama-hf": lambda f, r: f["checkpoint"](r.getfixturevalue("hf_llama_dir")),
    # parallel attention and MLP: GPT-NeoX (TransformerLens 4's native blocks are sequential)
    "neox-parallel-hf": lambda f, r: f["checkpoint"](r.getfixturevalue("hf_neox_dir")),
    "attn-only-random": lambda f, r: f["random"](seed=6, attn_only=True, n_layers=4),
}


@dataclass
class Case:
    """A model, its tokens, and the reference's numbers on them (made once, when first asked)."""

    lm: Any
    tokens: torch.Tensor

    @cached_property
    def predictors(self) -> dict[tuple[str, int], tuple]:
        return reference_predictors(self.lm, self.tokens)

    @cached_property
    def drops(self) -> dict[tuple[str, int], tuple]:
        return reference_drops(self.lm, self.tokens)


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tiny_factories: Factories) -> Case:
    lm = CASES[request.param](tiny_factories, request)
    tokens = tiny_factories["tokens"](3, 14, lm.d_vocab_real, lm.bos_token_id, seed=5)
    return Case(lm, tokens)


def test_predictors_equal_the_reference(case: Case) -> None:
    lm, tokens = case.lm, case.tokens
    result = sweep(lm, tokens, ["pruning"], EngineOptions(batch_size=2))
    engine = _frame(result.records, lm.n_layers)
    _check(engine, case.predictors, COS_TOL)
    widths = {int(m.rsplit("_", 1)[1]) for m in engine["metric"] if "angular" in m}
    assert widths == set(angular_widths(lm.n_layers))
    # every row has its per-sequence means, whose mean is the row's value
    means = pl.from_arrow(result.sequence_means)
    assert isinstance(means, pl.DataFrame)
    by_key = means.group_by("metric", "layer").agg(pl.col("value").mean(), pl.len())
    assert by_key.height == engine.height
    assert (by_key["len"] == tokens.shape[0]).all()


def test_drops_equal_the_reference(case: Case) -> None:
    lm, tokens = case.lm, case.tokens
    alone = sweep(lm, tokens, ["pruning_drops"], EngineOptions(batch_size=2))
    engine = _frame(alone.records, lm.n_layers).filter(~pl.col("metric").str.contains("spearman"))
    _check(engine, case.drops, TOL)
    # Beside intervention and the lens (width 1 and the last-block drops are shared with
    # them), the records are the same, and width 1 is the intervention family's drop.
    both = sweep(
        lm, tokens, ["pruning_drops", "logit_lens", "intervention"], EngineOptions(batch_size=2)
    )
    shared = _frame(both.records, lm.n_layers)
    mine = shared.filter(pl.col("metric").str.starts_with("pruning_drops."))
    joined = engine.join(mine, on=["metric", "layer"], suffix="_shared")
    assert joined.height == engine.height
    assert (joined["value"] - joined["value_shared"]).abs().max() < 1e-9  # type: ignore[operator]
    for metric in ("kl", "top1_agreement", "loss_delta", "accuracy"):
        single = shared.filter(
            (pl.col("metric") == f"intervention.{metric}") & (pl.col("component") == "drop")
        ).sort("layer")
        width1 = mine.filter(pl.col("metric") == f"pruning_drops.{metric}_1").sort("layer")
        assert single["layer"].to_list() == width1["layer"].to_list()
        assert single["value"].to_list() == width1["value"].to_list()


def reference_scores(
    lm: Any, predictors: dict[tuple[str, int], tuple], drops: dict[tuple[str, int], tuple]
) -> dict[str, tuple[float, float, float, float]]:
    """name -> (rho, bootstrap std, low, high) of every scored (predictor, width): scipy's
    Spearman on the per-layer means; 1000 resamples of the sequences drawn as
    compute.bootstrap draws them (PCG64, seed 0), one at a time; the 5% and 95% quantiles."""
    from scipy.stats import spearmanr

    def rho(a: np.ndarray, b: np.ndarray) -> float | None:
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            return None
        return float(spearmanr(a, b).statistic)

    out = {}
    for n in drop_widths(lm.n_layers):
        starts = range(lm.n_layers - n + 1)
        if len(starts) < 3:
            continue
        target = np.stack([drops[(f"pruning_drops.kl_{n}", s)][3] for s in starts], axis=1)
        names = ["angular_distance", "angular_distance_last"]
        for name in ["block_influence"] * (n == 1) + names:
            metric = (
                "pruning.block_influence" if name == "block_influence" else (f"pruning.{name}_{n}")
            )
            pred = np.stack([predictors[(metric, s)][3] for s in starts], axis=1)
            full = rho(pred.mean(0), target.mean(0))
            if full is None:
                continue
            rng = np.random.default_rng(0)
            samples = []
            for _ in range(1000):
                drawn = rng.integers(0, len(pred), size=len(pred))
                r = rho(pred[drawn].mean(0), target[drawn].mean(0))
                if r is not None:
                    samples.append(r)
            low, high = np.quantile(samples, [0.05, 0.95])
            out[f"pruning_drops.spearman_{name}_{n}"] = (
                full,
                float(np.std(samples, ddof=1)),
                float(low),
                float(high),
            )
    return out


def test_scores_equal_the_reference(case: Case) -> None:
    lm, tokens = case.lm, case.tokens
    result = sweep(lm, tokens, ["pruning_drops"], EngineOptions(batch_size=2))
    engine = _frame(result.records, lm.n_layers).filter(pl.col("metric").str.contains("spearman"))
    expected = reference_scores(lm, case.predictors, case.drops)
    got = {r["metric"]: r for r in engine.iter_rows(named=True)}
    assert set(got) == {f"{m}{s}" for m in expected for s in ("", "_low", "_high")}
    for name, (rho, spread, low, high) in expected.items():
        assert got[name]["value"] == pytest.approx(rho, abs=1e-9)
        assert got[name]["stderr"] == pytest.approx(spread, abs=1e-9)
        assert got[name]["n"] == tokens.shape[0]
        assert got[f"{name}_low"]["value"] == pytest.approx(low, abs=1e-9)
        assert got[f"{name}_high"]["value"] == pytest.approx(high, abs=1e-9)
    # the internal predictor keys stay inside the family
    assert not any(m.startswith("pruning_drops._") for m in engine["metric"])
    means = pl.from_arrow(result.sequence_means)
    assert isinstance(means, pl.DataFrame)
    assert not means.filter(pl.col("metric").str.contains("pruning_drops._")).height


def test_other_widths_are_a_setting_of_the_drops_runs_only(tiny_factories: Factories) -> None:
    from compute.models import ModelSpec
    from compute.run import RunConfig
    from compute.tokens import TokenSpec

    lm = tiny_factories["random"](seed=2, n_layers=6)
    tokens = tiny_factories["tokens"](2, 12, lm.d_vocab_real, lm.bos_token_id, seed=4)
    opts = EngineOptions(batch_size=2, drop_widths=(3, 5, 2))  # 5 > 6 // 2: skipped
    done: list[int] = []
    result = sweep(lm, tokens, ["pruning_drops"], opts, progress=lambda p: done.append(p.done))
    engine = _frame(result.records, lm.n_layers).filter(~pl.col("metric").str.contains("spearman"))
    _check(engine, reference_drops(lm, tokens, (2, 3)), TOL)
    scores = {m for m in _frame(result.records, lm.n_layers)["metric"] if "spearman" in m}
    assert {m.rsplit("_", 1)[1] for m in scores if m.endswith(("_2", "_3"))} == {"2", "3"}
    assert done[-1] == sum(7 - n for n in drop_widths(6))  # progress ends at its total
    with pytest.raises(ValueError, match="at least 1"):
        EngineOptions(drop_widths=(0, 2))
    # the setting is part of a run's identity only where the run drops blocks
    spec = ModelSpec(source="zoo", name="tiny-2l-s0")
    token_spec = TokenSpec(source="builtin", n_sequences=2, seq_len=8)

    def config_hash(families: tuple[str, ...], widths: tuple[int, ...]) -> str:
        options = EngineOptions(drop_widths=widths)
        return RunConfig(
            model=spec, tokens=token_spec, families=families, options=options
        ).config_hash()

    assert config_hash(("norms",), (2,)) == config_hash(("norms",), DROP_WIDTHS)
    assert config_hash(("pruning_drops",), (2,)) != config_hash(("pruning_drops",), DROP_WIDTHS)


# --------------------------------------------------------------------------- the FLOP count


@pytest.mark.parametrize(
    "families",
    [
        ["pruning_drops"],
        ["intervention", "pruning_drops"],
        ["intervention", "logit_lens", "pruning_drops"],
    ],
)
@pytest.mark.parametrize("n_layers", [4, 9])
def test_drops_do_the_counted_work(
    families: list[str], n_layers: int, tiny_factories: Factories
) -> None:
    from tests.unit.test_schedule import Counter

    lm = tiny_factories["random"](seed=3, n_layers=n_layers)
    n_seq, seq_len = 3, 12
    tokens = tiny_factories["tokens"](n_seq, seq_len, lm.d_vocab_real, lm.bos_token_id, seed=2)
    baseline = Counter(lm)
    sweep(
        lm,
        tokens,
        [f for f in families if f != "pruning_drops"] or ["norms"],
        EngineOptions(batch_size=2),
    )
    lm = tiny_factories["random"](seed=3, n_layers=n_layers)
    counter = Counter(lm)
    sweep(lm, tokens, families, EngineOptions(batch_size=2))
    dims = ModelDims.of(lm)
    per_family = family_flops(dims, seq_len, families, parallel=lm.parallel)
    # the counter sees model calls: the predictors' Gram matrices are not among them
    expected = per_family["pruning_drops"] - pruning_flops(dims, seq_len)
    assert counter.flops - baseline.flops == pytest.approx(expected * n_seq, rel=1e-9)


# --------------------------------------------------------------------------- positive controls


def _planted(name: str, tiny_factories: Factories) -> tuple[Any, pl.DataFrame]:
    if name not in zoo_names():
        pytest.skip(f"{name} needs the zoo tokenizer")
    lm = tiny_factories["checkpoint"](f"zoo:{name}")
    tokens = tiny_factories["tokens"](4, 32, lm.d_vocab_real, lm.bos_token_id, seed=3)
    result = sweep(
        lm, tokens, ["intervention", "pruning", "pruning_drops"], EngineOptions(batch_size=4)
    )
    return lm, _frame(result.records, lm.n_layers)


def _values(df: pl.DataFrame, metric: str, component: str | None = None) -> dict[int, float]:
    rows = df.filter(pl.col("metric") == metric)
    if component is not None:
        rows = rows.filter(pl.col("component") == component)
    return {int(r["layer"]): float(r["value"]) for r in rows.iter_rows(named=True)}


def test_planted_pruning_is_found_by_every_predictor_that_can(tiny_factories: Factories) -> None:
    from compute.zoo.planted import CANCELLING_PAIR, IDLE_RUN

    lm, df = _planted("planted-pruning", tiny_factories)
    pair, idle = CANCELLING_PAIR[0], IDLE_RUN[0]
    # (start, width) whose blocks write nothing in sum
    free = {(5, 1), (6, 1), (pair, 2), (idle, 2), (pair, 3), (pair, 4)}
    bi = _values(df, "pruning.block_influence")
    assert {layer for layer, v in bi.items() if abs(v) < 1e-9} == set(IDLE_RUN)
    assert min(v for layer, v in bi.items() if layer not in IDLE_RUN) > 0.05
    # Block influence scores one block at a time: the cancelling pair looks like the most
    # important blocks of the model, by construction.
    assert min(bi[layer] for layer in CANCELLING_PAIR) >= max(bi.values()) - 1e-6
    for n in drop_widths(lm.n_layers):
        for metric, zero, positive in (
            (f"pruning.angular_distance_{n}", 1e-5, 0.05),
            (f"pruning.angular_distance_last_{n}", 1e-5, 0.02),
            (f"pruning_drops.kl_{n}", 1e-4, 0.5),
        ):
            got = _values(df, metric)
            assert set(got) == set(range(lm.n_layers - n + 1))
            found = {start for start, v in got.items() if v < zero}
            assert found == {start for start, w in free if w == n}, (metric, got)
            assert all(v > positive for s, v in got.items() if s not in found), (metric, got)
            # a pruning rule's choice, argmin over starts, is a free drop
            assert (min(got, key=got.__getitem__), n) in free
        agreement = _values(df, f"pruning_drops.top1_agreement_{n}")
        assert all(agreement[s] == 1.0 for s, w in free if w == n)
    single = _values(df, "intervention.kl", "drop")
    assert {layer for layer, v in single.items() if v < 1e-4} == set(IDLE_RUN)


def test_planted_stages_identity_layer_is_found(tiny_factories: Factories) -> None:
    from compute.zoo.planted import IDENTITY_LAYER

    _, df = _planted("planted-stages", tiny_factories)
    for metric in (
        "pruning.block_influence",
        "pruning.angular_distance_1",
        "pruning.angular_distance_last_1",
        "pruning_drops.kl_1",
    ):
        got = _values(df, metric)
        assert min(got, key=got.__getitem__) == IDENTITY_LAYER, (metric, got)
        assert got[IDENTITY_LAYER] < 1e-5, (metric, got)


# --------------------------------------------------------------------------- which stream


def test_the_centred_stream_gives_the_correlation_of_the_raw_one(tiny_factories: Factories) -> None:
    """With writing weights centered (LayerNorm models), every residual point is the raw one
    minus its mean over d_model, so the predictors are the raw residuals' Pearson correlations;
    a model loaded without centring gives the published (raw) cosines; RMSNorm models are never
    centered."""
    centred = tiny_factories["random"](seed=1, n_layers=3)
    raw = tiny_factories["random"](seed=1, n_layers=3, processing=UNCENTRED)
    assert centred.applied.center_writing_weights
    assert not raw.applied.center_writing_weights
    tokens = tiny_factories["tokens"](2, 10, raw.d_vocab_real, raw.bos_token_id, seed=1)
    for seq in tokens:
        for a, b in zip(_points(centred, seq), _points(raw, seq), strict=True):
            np.testing.assert_allclose(a, b - b.mean(-1, keepdims=True), atol=2e-5)
    bi_centred = _values(
        _frame(sweep(centred, tokens, ["pruning"]).records, 3), "pruning.block_influence"
    )
    bi_raw = _values(_frame(sweep(raw, tokens, ["pruning"]).records, 3), "pruning.block_influence")
    assert max(abs(bi_centred[k] - bi_raw[k]) for k in bi_raw) > 1e-4  # they differ
    rms = tiny_factories["random"](seed=5, normalization_type="RMS", n_layers=2)
    assert not rms.applied.center_writing_weights

