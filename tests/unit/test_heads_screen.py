"""The head screen with its exact top k (`heads_screen`).

The screen's estimate is held to a slow, obvious reference (a loop over path points, sequences
and heads with plain autograd through `run_block(head_mask=...)` and the model's own logits);
its integral to the exact ablation where the path is the head's own (one head); its exact top k
to the `heads` family's numbers; and a planted head whose zeroing matters only through the norm
after attention (a tiny Gemma 3) is found by it, where the first-order AtP screen misses it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from compute.engine import clean_pass, sweep
from compute.metrics.base import EngineOptions, logit_chunks
from compute.metrics.heads import head_ablations
from compute.metrics.heads_screen import screen_loss_delta

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def resid_after(lm: Any, one: torch.Tensor, layer: int, alpha: float) -> tuple[Any, Any]:
    """(the residual after block `layer`, the final residual) of one sequence, every head's z
    scaled by 1 - alpha, in one autograd graph from a leaf embedding."""
    x = lm.embed(one).detach().requires_grad_()
    point = None
    for block in range(lm.n_layers):
        mask = None
        if block in lm.attention_layers:
            mask = torch.full((1, lm.layers[block].heads.n_heads), 1.0 - alpha)
        x = lm.run_block(block, x, head_mask=mask).resid
        if block == layer:
            point = x
    return point, x


def reference_estimate(lm: Any, tokens: torch.Tensor, steps: int,
                       samples: int = 0) -> dict[tuple[int, int], list[float]]:
    """Per (layer, head), per sequence, with d = resid after block l with head h zeroed minus
    the clean one: mean over alpha in {0, 1/S, .., (S-1)/S} of d . d loss / d resid after
    block l, on the model whose every head is scaled by 1 - alpha; plus, over `samples` target
    sets y drawn at each position from the clean model's softmax (sequence i's uniforms from
    torch.Generator seeded i, [T-2, samples], inverse transform), half the mean of
    (d . d sum log p(y) / d resid)^2; all divided by T-2."""
    t = tokens.shape[1]
    out: dict[tuple[int, int], list[float]] = {}
    for seq in range(tokens.shape[0]):
        one = tokens[seq : seq + 1]
        with torch.no_grad():
            clean = [lm.embed(one)]
            for layer in range(lm.n_layers):
                clean.append(lm.run_block(layer, clean[-1]).resid)
            probs = lm.logits(clean[-1][0, 1:-1]).double().softmax(-1)
        uniforms = torch.rand(t - 2, samples, generator=torch.Generator().manual_seed(seq))
        drawn = []
        for j in range(samples):
            ys = []
            for pos in range(t - 2):
                cdf = probs[pos].cumsum(0)
                ys.append(min(int((cdf < uniforms[pos, j] * cdf[-1]).sum()), probs.shape[1] - 1))
            drawn.append(torch.tensor(ys))
        for layer in lm.attention_layers:
            n_heads = lm.layers[layer].heads.n_heads
            grads = []
            for i in range(steps):
                point, x = resid_after(lm, one, layer, i / steps)
                logits = lm.logits(x[0, 1:-1]).float()
                loss = F.cross_entropy(logits, one[0, 2:], reduction="sum")
                (grad,) = torch.autograd.grad(loss, point)
                grads.append(grad)
            mean_grad = torch.stack(grads).mean(0)
            sampled = []
            for ys in drawn:
                point, x = resid_after(lm, one, layer, 0.0)
                log_probs = lm.logits(x[0, 1:-1]).float().log_softmax(-1)
                (grad,) = torch.autograd.grad(log_probs[torch.arange(t - 2), ys].sum(), point)
                sampled.append(grad)
            for head in range(n_heads):
                mask = torch.ones(1, n_heads)
                mask[0, head] = 0.0
                with torch.no_grad():
                    zeroed = lm.run_block(layer, clean[layer], head_mask=mask).resid
                d = zeroed - clean[layer + 1]
                value = (d * mean_grad).sum()
                if sampled:
                    value = value + 0.5 * sum(float((d * g).sum()) ** 2 for g in sampled) / samples
                out.setdefault((layer, head), []).append(float(value) / (t - 2))
    return out


ARCHS: dict[str, dict[str, Any]] = {
    "sequential": {},
    "gqa-rms-gated": dict(normalization_type="RMS", positional_embedding_type="rotary",
                          rotary_dim=8, n_key_value_heads=2, gated_mlp=True, act_fn="silu"),
}


def _screen(lm: Any, tokens: torch.Tensor, opts: EngineOptions) -> list[torch.Tensor]:
    with torch.inference_mode():
        ctx = clean_pass(lm, tokens, False, logit_chunks(lm, opts), lambda _: None,
                         capture_z=True)
        return screen_loss_delta(ctx, opts)


@pytest.mark.parametrize(("steps", "samples"), [(1, 0), (3, 0), (1, 3), (2, 2)])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_estimate_equals_the_slow_reference(
        arch: str, fast: bool, steps: int, samples: int,
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    lm = tiny_factories["random"](seed=5, n_layers=3, **ARCHS[arch])
    lm._ctx["fast_path"] = fast
    tokens = tiny_factories["tokens"](2, 12, lm.d_vocab_real, lm.bos_token_id, seed=3)
    estimate = _screen(lm, tokens, EngineOptions(screen_steps=steps, screen_samples=samples))
    reference = reference_estimate(lm, tokens, steps, samples)
    for index, layer in enumerate(lm.attention_layers):
        for head in range(lm.n_heads):
            assert estimate[index][head].tolist() == pytest.approx(
                reference[(layer, head)], rel=1e-3, abs=1e-6), (layer, head)


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from compute.zoo.architectures import CASES_BY_NAME, build_checkpoint

    return build_checkpoint(CASES_BY_NAME["gemma-3"], tmp_path_factory.mktemp("g3") / "gemma3")


def test_estimate_equals_the_slow_reference_through_a_norm_after_attention(
        tiny_gemma3: Path, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Gemma 3 (a norm after attention and after the MLP, qk-norm, the model's own blocks):
    the block's write is not linear in z, so the screen reruns the block per head."""
    lm = tiny_factories["checkpoint"](tiny_gemma3)
    assert not lm.head_writes_are_linear(lm.attention_layers[0])
    tokens = tiny_factories["tokens"](2, 12, lm.d_vocab_real, lm.bos_token_id, seed=3)
    estimate = _screen(lm, tokens, EngineOptions(screen_steps=2, screen_samples=2))
    reference = reference_estimate(lm, tokens, 2, 2)
    for index, layer in enumerate(lm.attention_layers):
        for head in range(lm.layers[layer].heads.n_heads):
            assert estimate[index][head].tolist() == pytest.approx(
                reference[(layer, head)], rel=1e-3, abs=1e-6), (layer, head)


def test_the_integral_reaches_the_exact_ablation_on_one_head(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """One block, one head, attention only: the shared path is the head's own straight line
    from its output to zero, so the Riemann sum converges (error ~ 1/S) to the exact loss
    delta, where the first-order term (S = 1) is off by the curvature of what follows."""
    lm = tiny_factories["random"](seed=2, n_layers=1, n_heads=1, d_head=32, attn_only=True)
    tokens = tiny_factories["tokens"](3, 16, lm.d_vocab_real, lm.bos_token_id, seed=1)
    with torch.inference_mode():
        ctx = clean_pass(lm, tokens, False, logit_chunks(lm, EngineOptions()), lambda _: None,
                         capture_z=True)
        _, loss_delta = head_ablations(ctx, 0, [0])
    exact = loss_delta.view(3, -1).mean(-1)  # per sequence
    errors = {}
    for steps in (1, 8, 64):
        estimate = _screen(lm, tokens, EngineOptions(screen_steps=steps, screen_samples=0))[0][0]
        errors[steps] = (estimate - exact).abs().max().item()
    assert errors[1] > 1e-3 * exact.abs().max().item(), errors  # there is curvature to see
    assert errors[8] < errors[1] / 4, errors
    assert errors[64] < errors[1] / 30, errors


def test_top_k_exact_are_the_heads_family_numbers(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """The k heads of largest mean estimate, ablated exactly over every batch: the same numbers
    as `heads` for those heads (n = every sequence), and no exact row for the others."""
    lm = tiny_factories["random"](seed=6, n_layers=3)
    tokens = tiny_factories["tokens"](5, 16, lm.d_vocab_real, lm.bos_token_id, seed=4)
    opts = EngineOptions(batch_size=2, screen_top_k=4, screen_steps=2)
    records = sweep(lm, tokens, ["heads", "heads_screen"], opts).records
    rows = {(r.metric, r.layer, r.head): r for r in records}
    screen = sorted(((r.value, r.layer, r.head) for r in records
                     if r.metric == "heads_screen.loss_delta"), reverse=True)
    assert len(screen) == lm.n_layers * lm.n_heads
    top = {(layer, head) for _, layer, head in screen[:4]}
    for metric, unit in (("ablation_loss_delta", "nats"), ("ablation_kl", "nats")):
        exact = {(r.layer, r.head): r for r in records if r.metric == f"heads_screen.{metric}"}
        assert set(exact) == top
        for key, record in exact.items():
            assert record.n == 5
            assert record.unit == unit
            assert record.value == pytest.approx(rows[(f"heads.{metric}", *key)].value,
                                                  rel=1e-5, abs=1e-7)
            assert record.stderr == pytest.approx(rows[(f"heads.{metric}", *key)].stderr,
                                                   rel=1e-4, abs=1e-7)


# The planted control: layer 0's head PLANTED writes only into coordinates that the norm after
# attention multiplies by 0 (Gemma's gain is 1 + w: w = -1), at a norm far above the other heads'
# writes. Its own write never reaches the residual stream; what it does is make the norm's
# denominator large, so the other heads' writes arrive scaled down by about BOOST. Zeroing it
# scales them back up, through a gain of 1 + LIVE_GAIN on the other coordinates: the block's
# write goes from small to LIVE_GAIN times the residual's scale. Its whole effect passes through
# the norm after attention; each other head's is small (it is scaled down while PLANTED writes).
PLANTED = (0, 2)
DEAD = slice(0, 32)  # the coordinates the norm's gain kills
BOOST = 30.0
LIVE_GAIN = 2.0


def planted_post_norm_model(path: Path, tiny_factories: dict[str, Callable[..., Any]]) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    attn = model.model.layers[PLANTED[0]].self_attn
    d_head = model.config.head_dim
    cols = slice(PLANTED[1] * d_head, (PLANTED[1] + 1) * d_head)
    with torch.no_grad():
        w_o = attn.o_proj.weight  # [d_model, heads * d_head]
        planted = w_o[:, cols].clone()
        w_o[:, cols] = 0.0
        w_o[DEAD, cols] = BOOST * planted[DEAD] / planted[DEAD].norm() * planted.shape[1] ** 0.5
        # the other heads write nothing there, so the head's write is all that norm sees there
        w_o[DEAD, : cols.start] = 0.0
        w_o[DEAD, cols.stop :] = 0.0
        gain = model.model.layers[PLANTED[0]].post_attention_layernorm.weight
        gain[:] = LIVE_GAIN
        gain[DEAD] = -1.0
    out = path.parent / "planted-post-norm"
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (path / name).exists():
            (out / name).write_bytes((path / name).read_bytes())
    return tiny_factories["checkpoint"](out)


def test_a_head_that_matters_only_through_the_norm_after_attention_is_found(
        tiny_gemma3: Path, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """In a random-weight model the signs of loss deltas are not planted, only where they come
    from: the planted head is among the three whose exact ablation costs most (its effect
    through the norm is of the size of a whole layer's attention), AtP reads it as next to
    nothing (the derivative at the clean point does not see the norm's rescaling), and the
    screen ranks it in its top 3, so its exact top 3 measures it."""
    lm = planted_post_norm_model(tiny_gemma3, tiny_factories)
    tokens = tiny_factories["tokens"](4, 32, lm.d_vocab_real, lm.bos_token_id, seed=7)
    records = sweep(lm, tokens, ["heads", "heads_atp", "heads_screen"],
                    EngineOptions(screen_top_k=3)).records

    def ranked(metric: str) -> list[tuple[int, int]]:
        rows = sorted(((r.value, r.layer, r.head) for r in records if r.metric == metric),
                      reverse=True)
        return [(layer, head) for _, layer, head in rows]

    def value(metric: str) -> float:
        return next(r.value for r in records
                    if r.metric == metric and (r.layer, r.head) == PLANTED)

    exact = value("heads.ablation_loss_delta")
    # the construction: a top-3 head by its exact cost, its write killed by the norm's gain
    assert PLANTED in ranked("heads.ablation_loss_delta")[:3]
    assert abs(value("heads_atp.loss_delta")) < 0.25 * exact  # AtP does not see it
    assert PLANTED not in ranked("heads_atp.loss_delta")[:3]
    # the screen does, and its exact top 3 hold it with the exact number
    assert PLANTED in ranked("heads_screen.loss_delta")[:3]
    assert value("heads_screen.loss_delta") > 0.5 * exact
    assert PLANTED in ranked("heads_screen.ablation_loss_delta")
    assert value("heads_screen.ablation_loss_delta") == pytest.approx(exact, rel=1e-5)


def test_the_curvature_term_estimates_the_gauss_newton_form(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """With many draws, the curvature term (the estimate with draws minus the one without) is
    half the Gauss-Newton form of the loss along d = r_h - r: the sum over positions of the
    variance under p of the logits' derivative along d, here by central finite differences of
    the model's own logits (no autograd, no draws). 200 draws: relative noise ~10%."""
    lm = tiny_factories["random"](seed=8, n_layers=2)
    tokens = tiny_factories["tokens"](2, 12, lm.d_vocab_real, lm.bos_token_id, seed=5)
    t, samples, eps = tokens.shape[1], 200, 1e-3
    first = _screen(lm, tokens, EngineOptions(screen_samples=0))
    both = _screen(lm, tokens, EngineOptions(screen_samples=samples))
    with torch.no_grad():
        clean = [lm.embed(tokens)]
        for layer in range(lm.n_layers):
            clean.append(lm.run_block(layer, clean[-1]).resid)
        probs = lm.logits(clean[-1][:, 1:-1]).double().softmax(-1)

        def logits_from(layer: int, r: torch.Tensor) -> torch.Tensor:
            for block in range(layer + 1, lm.n_layers):
                r = lm.run_block(block, r).resid
            return lm.logits(r[:, 1:-1]).double()

        for layer in range(lm.n_layers):
            for head in range(lm.n_heads):
                mask = torch.ones(tokens.shape[0], lm.n_heads)
                mask[:, head] = 0.0
                d = lm.run_block(layer, clean[layer], head_mask=mask).resid - clean[layer + 1]
                slope = (logits_from(layer, clean[layer + 1] + eps * d)
                         - logits_from(layer, clean[layer + 1] - eps * d)) / (2 * eps)
                mean = (probs * slope).sum(-1, keepdim=True)
                gauss_newton = (probs * (slope - mean) ** 2).sum(dim=(1, 2))  # per sequence
                curvature = (both[layer][head] - first[layer][head]).double() * (t - 2)
                assert curvature.tolist() == pytest.approx(
                    (0.5 * gauss_newton).tolist(), rel=0.35, abs=1e-6), (layer, head)


def test_draws_through_a_logit_soft_cap_equal_the_slow_reference(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Logits that are not x W_U + b_U (a soft-cap): each draw's gradient is a backward through
    the unembedding instead of W_U[:, y] - W_U p."""
    lm = tiny_factories["random"](seed=5, n_layers=2, output_logits_soft_cap=2.0)
    assert not lm.logits_are_linear
    tokens = tiny_factories["tokens"](2, 12, lm.d_vocab_real, lm.bos_token_id, seed=3)
    estimate = _screen(lm, tokens, EngineOptions(screen_samples=3))
    reference = reference_estimate(lm, tokens, 1, 3)
    for index, layer in enumerate(lm.attention_layers):
        for head in range(lm.n_heads):
            assert estimate[index][head].tolist() == pytest.approx(
                reference[(layer, head)], rel=1e-3, abs=1e-6), (layer, head)


def test_batching_does_not_change_the_numbers(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """The draws are seeded per sequence: one batch of 5 sequences, batches of 2 + 2 + 1 and
    batches of 1 give the same estimates, calibrated on 3 sequences, and the same exact top k."""
    lm = tiny_factories["random"](seed=3, n_layers=2)
    tokens = tiny_factories["tokens"](5, 14, lm.d_vocab_real, lm.bos_token_id, seed=2)

    def rows(batch: int) -> dict[tuple[Any, ...], float]:
        opts = EngineOptions(batch_size=batch, screen_samples=4, screen_top_k=3,
                             screen_calibration=3)
        return {(r.metric, r.layer, r.head): r.value
                for r in sweep(lm, tokens, ["heads_screen"], opts).records}

    whole = rows(5)
    assert len([k for k in whole if k[0] == "heads_screen.ablation_loss_delta"]) == 3
    for other in (rows(2), rows(1)):
        assert set(other) == set(whole)
        for key, value in whole.items():
            assert other[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key


# --------------------------------------------------------------------------- calibration
def _per_sequence_screen(lm: Any, tokens: torch.Tensor, opts: EngineOptions) -> torch.Tensor:
    """[layers, heads, sequences]: the screen's estimate of each sequence alone, its draws
    seeded by the sequence's index in the run as a run seeds them."""
    out = []
    for i in range(tokens.shape[0]):
        with torch.inference_mode():
            ctx = clean_pass(lm, tokens[i : i + 1], False, logit_chunks(lm, opts),
                             lambda _: None, capture_z=True)
            out.append(torch.stack([e[:, 0] for e in screen_loss_delta(ctx, opts, i)]))
    return torch.stack(out, -1).double()


def _per_sequence_exact(lm: Any, tokens: torch.Tensor) -> torch.Tensor:
    """[layers, heads, sequences]: `heads.ablation_loss_delta` of each sequence alone."""
    out = torch.zeros(lm.n_layers, lm.n_heads, tokens.shape[0], dtype=torch.float64)
    for i in range(tokens.shape[0]):
        for r in sweep(lm, tokens[i : i + 1], ["heads"], EngineOptions()).records:
            if r.metric == "heads.ablation_loss_delta":
                out[r.layer, r.head, i] = r.value
    return out


@pytest.mark.parametrize("c", [1, 3])
def test_the_calibrated_estimate_equals_the_slow_reference(
        c: int, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """loss_delta = mean over all N sequences of the screen + mean over the first c of (exact -
    screen), each sequence computed alone; stderr sqrt(Var(s)/N + Var(e - s)/c + 2 Cov(s, e - s)/N),
    none at c = 1;
    and the top k are the k largest of it."""
    lm = tiny_factories["random"](seed=8, n_layers=3)
    tokens = tiny_factories["tokens"](5, 14, lm.d_vocab_real, lm.bos_token_id, seed=6)
    opts = EngineOptions(batch_size=2, screen_samples=3, screen_top_k=3, screen_calibration=c)
    reports: list[Any] = []
    records = sweep(lm, tokens, ["heads_screen"], opts, progress=reports.append).records
    # a unit per batch, per calibrated head and per top-k head: progress ends at its total
    assert reports[-1].done == reports[-1].total == 3 + lm.n_layers * lm.n_heads + 3
    screen = _per_sequence_screen(lm, tokens, opts)
    exact = _per_sequence_exact(lm, tokens[:c])
    error = exact - screen[..., :c]
    want = screen.mean(-1) + error.mean(-1)
    got = {(r.layer, r.head): r for r in records if r.metric == "heads_screen.loss_delta"}
    assert len(got) == lm.n_layers * lm.n_heads
    for (layer, head), r in got.items():
        assert r.value == pytest.approx(float(want[layer, head]), rel=1e-4, abs=1e-7)
        assert r.n == 5
        if c == 1:
            assert r.stderr is None
        else:
            s_c, err = screen[layer, head, :c], error[layer, head]
            cov = ((s_c - s_c.mean()) * (err - err.mean())).sum() / (c - 1)
            var = screen[layer, head].var() / 5 + err.var() / c + 2 * cov / 5
            assert r.stderr == pytest.approx(float(var.clamp(min=0).sqrt()), rel=1e-3, abs=1e-8)
    order = sorted(got, key=lambda k: (-got[k].value, k))
    exact_rows = {(r.layer, r.head) for r in records
                  if r.metric == "heads_screen.ablation_loss_delta"}
    assert exact_rows == set(order[:3])


def test_calibrated_on_every_sequence_the_screen_is_the_exact_ablation(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """With c = N the correction replaces the estimate by the exact mean: every head's
    loss_delta is `heads.ablation_loss_delta` and its stderr that one's, whatever the screen
    estimated (here first order alone, far from it on a random model)."""
    lm = tiny_factories["random"](seed=9, n_layers=3)
    tokens = tiny_factories["tokens"](4, 12, lm.d_vocab_real, lm.bos_token_id, seed=1)
    opts = EngineOptions(batch_size=3, screen_samples=0, screen_top_k=0, screen_calibration=4)
    records = sweep(lm, tokens, ["heads", "heads_screen"], opts).records
    exact = {(r.layer, r.head): r.value for r in records
             if r.metric == "heads.ablation_loss_delta"}
    screen = {(r.layer, r.head): r.value for r in records
              if r.metric == "heads_screen.loss_delta"}
    assert screen.keys() == exact.keys()
    for key, value in exact.items():
        assert screen[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    # ... and its stderr is theirs: Var(s)/N + Var(e - s)/N + 2 Cov(s, e - s)/N = Var(e)/N
    exact_se = {(r.layer, r.head): r.stderr for r in records
                if r.metric == "heads.ablation_loss_delta"}
    for r in records:
        if r.metric == "heads_screen.loss_delta":
            assert r.stderr == pytest.approx(exact_se[(r.layer, r.head)], rel=1e-3, abs=1e-9)
    uncalibrated = sweep(lm, tokens, ["heads_screen"],
                         EngineOptions(batch_size=3, screen_samples=0, screen_top_k=0,
                                       screen_calibration=0)).records
    assert max(abs(r.value - exact[(r.layer, r.head)]) for r in uncalibrated) > 1e-3


def test_the_calibration_is_part_of_a_screens_identity_only() -> None:
    """c is part of a heads_screen run's identity; a run without the screen, and a screen at
    c = 0 (as every screen was before the calibration), keep the hashes they had."""
    from compute.models import ModelSpec
    from compute.run import RunConfig
    from compute.tokens import TokenSpec

    def config(families: tuple[str, ...], c: int) -> RunConfig:
        return RunConfig(model=ModelSpec(source="zoo", name="tiny-2l-s0"),
                         tokens=TokenSpec(source="builtin", n_sequences=2, seq_len=8),
                         families=families, options=EngineOptions(screen_calibration=c))

    assert config(("norms",), 0).config_hash() == config(("norms",), 2).config_hash()
    assert config(("heads_screen",), 2).config_hash() != config(("heads_screen",), 3).config_hash()
    assert '"screen_calibration":2' in config(("heads_screen",), 2).canonical_json()
    assert "screen_calibration" not in config(("heads_screen",), 0).canonical_json()
