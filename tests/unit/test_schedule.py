"""The FLOP-minimal schedule: it does exactly the work `compute.flops` counts, and its records
equal those of the hooked TransformerLens path (the schedule before issue 11 ran every
intervention through hooked blocks; `tests/unit/test_reference_engine.py` holds both to the
reference at 1e-4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest
import torch

from compute.engine import auto_batch_size, sweep
from compute.errors import ModelTooLargeError
from compute.flops import family_flops
from compute.memory import ModelDims, sweep_bytes_per_sequence
from compute.metrics import families_named
from compute.metrics.base import EngineOptions
from compute.models import ModelSpec, load_model
from tests import reference

pytestmark = pytest.mark.usefixtures("single_torch_thread")
OPTS = dict(induction_n=8, induction_sequences=3, top_neurons=3, top_tokens=4)
ARCHS: dict[str, dict[str, Any]] = {
    "sequential": {},
    # (parallel attention/MLP: TransformerLens 4's native blocks are sequential; the GPT-NeoX
    # checkpoint of the reference tests holds the parallel arrangement)
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=4),
    "attn-only": dict(attn_only=True),
}


class Counter:
    """Counts the dense FLOPs of every model call the engine makes."""

    def __init__(self, lm: Any) -> None:
        self.flops = 0.0
        dims = ModelDims.of(lm)
        hd, d = dims.n_heads * dims.d_head, dims.d_model
        mlp_per_token = 4 * d * dims.d_mlp
        orig_block, orig_mlp, orig_logits, orig_heads = (lm.run_block, lm.run_mlp,
                                                         lm.logit_columns, lm.head_writes)

        def run_block(layer: int, resid: torch.Tensor, **kw: Any) -> Any:
            b, t, _ = resid.shape
            self.flops += b * (2 * t * 4 * d * hd + 4 * t * t * hd + t * mlp_per_token)
            return orig_block(layer, resid, **kw)

        def run_mlp(layer: int, resid: torch.Tensor) -> Any:
            self.flops += resid[..., 0].numel() * mlp_per_token
            return orig_mlp(layer, resid)

        def logit_columns(x: torch.Tensor, start: int, stop: int) -> Any:
            # Every unembedding, whole rows or column blocks, goes through logit_columns.
            self.flops += x[..., 0].numel() * 2 * d * (stop - start)
            return orig_logits(x, start, stop)

        def head_writes(layer: int, z: torch.Tensor, heads: list[int]) -> Any:
            self.flops += len(heads) * z.shape[0] * z.shape[1] * 2 * dims.d_head * d
            return orig_heads(layer, z, heads)

        lm.run_block, lm.run_mlp, lm.logit_columns, lm.head_writes = run_block, run_mlp, \
            logit_columns, head_writes


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("families", [["intervention"], ["heads"], ["logit_lens"], ["heads_atp"],
                                      ["intervention", "logit_lens", "similarity"]])
def test_engine_does_the_counted_work(arch: str, families: list[str],
                                      tiny_factories: dict[str, Callable[..., Any]]) -> None:
    lm = tiny_factories["random"](seed=3, n_layers=4, **ARCHS[arch])
    if "heads" in families and not lm.has_mlp:
        pytest.skip("heads on attention-only is covered by the reference test")
    n_seq, seq_len = 3, 12
    tokens = tiny_factories["tokens"](n_seq, seq_len, lm.d_vocab_real, lm.bos_token_id, seed=2)
    counter = Counter(lm)
    sweep(lm, tokens, families, EngineOptions(batch_size=2, **OPTS))
    if "heads" in families:  # induction's forward on its own tokens, counted separately
        n = min(OPTS["induction_n"], (lm.n_ctx - 1) // 2)
        from compute.flops import induction_flops
        counter.flops -= induction_flops(ModelDims.of(lm), n, OPTS["induction_sequences"])
    per_family = family_flops(ModelDims.of(lm), seq_len, families, parallel=lm.parallel)
    if "heads_atp" in families:
        # The counter sees forward calls: the screen's one forward with gradients per batch.
        # Its backward, the other half of its formula, runs inside autograd.
        per_family["heads_atp"] /= 2
    expected = sum(per_family.values()) * n_seq
    assert counter.flops == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_screens_calibration_does_the_counted_work(
        arch: str, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """The calibration's forward work (every head ablated exactly on the first c sequences, on
    their clean pass made again) is `screen_calibration_flops`: the counted difference between a
    screen with c = 2 and one without (k = 0: the same screen otherwise)."""
    from compute.flops import screen_calibration_flops

    lm = tiny_factories["random"](seed=3, n_layers=3, **ARCHS[arch])
    tokens = tiny_factories["tokens"](3, 12, lm.d_vocab_real, lm.bos_token_id, seed=2)
    counted = []
    for c in (0, 2):
        counter = Counter(lm)
        sweep(lm, tokens, ["heads_screen"],
              EngineOptions(batch_size=2, screen_top_k=0, screen_calibration=c, **OPTS))
        counted.append(counter.flops)
    expected = screen_calibration_flops(ModelDims.of(lm), 12, 2, parallel=lm.parallel)
    assert counted[1] - counted[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_fast_blocks_give_the_hooked_blocks_records(
        arch: str, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Every family through the fast forward and through TransformerLens's hooked blocks."""
    lm = tiny_factories["random"](seed=4, **ARCHS[arch])
    tokens = tiny_factories["tokens"](3, 16, lm.d_vocab_real, lm.bos_token_id, seed=1)
    opts = EngineOptions(batch_size=2, **OPTS)
    assert lm.fast_path
    fast = {(r.metric, r.layer, r.component, r.head, r.neuron): r.value
            for r in sweep(lm, tokens, list(reference.FAMILIES), opts).records}
    lm._ctx["fast_path"] = False
    hooked = {(r.metric, r.layer, r.component, r.head, r.neuron): r.value
              for r in sweep(lm, tokens, list(reference.FAMILIES), opts).records}
    assert fast.keys() == hooked.keys()
    for key, value in hooked.items():
        assert fast[key] == pytest.approx(value, abs=1e-5, rel=1e-5), key


def test_cpu_auto_batch_is_about_a_thousand_tokens(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    lm = tiny_factories["random"](seed=5)
    assert auto_batch_size(lm, 128, EngineOptions()) == 8
    assert auto_batch_size(lm, 64, EngineOptions(tokens_per_batch=256)) == 4
    assert auto_batch_size(lm, 2048, EngineOptions()) == 1
    assert auto_batch_size(lm, 128, EngineOptions(batch_size=96)) == 96


def test_cpu_auto_batch_keeps_its_memory_within_half_the_weights_or_the_budget(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """A vocabulary large against the weights (as GPT-2's): fewer than 1024 tokens, so that the
    batch's estimated memory stays under max(64 MiB, weights / 2) or the budget given."""
    lm = tiny_factories["random"](seed=5, d_model=64, n_heads=2, d_mlp=32, d_vocab=400_000)
    weights = lm.n_params * lm.dtype_bytes
    assert weights / 2 > 64 * 2**20  # the half-of-the-weights bound applies, not the floor
    families = families_named(["intervention", "heads"])
    # Soft-capped logits: the reference keeps P whole, [tokens, vocab] float32, and binds.
    lm.cfg.output_logits_soft_cap = 30.0
    assert not lm.logits_are_linear
    per_sequence = sweep_bytes_per_sequence(ModelDims.of(lm), 16, 4, patterns=False, z=True)
    batch = auto_batch_size(lm, 16, EngineOptions(), families)
    assert 2 <= batch < 64  # 1024 tokens would be 64 sequences of 16
    assert batch * per_sequence <= weights / 2 < (batch + 1) * per_sequence
    roomy = auto_batch_size(lm, 16, EngineOptions(memory_budget_mb=8192), families)
    # The budget given lifts the bound; the reference distribution's (logits_budget_mb) binds.
    assert roomy == EngineOptions().logits_budget_mb * 2**20 // (16 * lm.d_vocab * 4) > batch
    assert auto_batch_size(lm, 16, EngineOptions(memory_budget_mb=64), families) < batch
    # float32 logits without a soft-cap: the reference keeps W_U p ([tokens, d_model]
    # float64), so the vocabulary no longer binds and the 1024 tokens do.
    lm.cfg.output_logits_soft_cap = -1.0
    assert lm.logits_are_linear
    without_p = sweep_bytes_per_sequence(ModelDims.of(lm), 16, 4, patterns=False, z=True,
                                         probs=False)
    assert per_sequence - without_p == 16 * (lm.d_vocab * 4 - (lm.d_model + 1) * 8)
    assert auto_batch_size(lm, 16, EngineOptions(), families) == 64


def test_auto_batch_gives_the_fixed_batch_records(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    lm = tiny_factories["random"](seed=6)
    tokens = tiny_factories["tokens"](5, 40, lm.d_vocab_real, lm.bos_token_id, seed=8)
    auto = sweep(lm, tokens, ["intervention"], EngineOptions(tokens_per_batch=80, **OPTS))
    fixed = sweep(lm, tokens, ["intervention"], EngineOptions(batch_size=5, **OPTS))
    for a, f in zip(auto.records, fixed.records, strict=True):
        assert (a.metric, a.layer, a.component) == (f.metric, f.layer, f.component)
        assert a.value == pytest.approx(f.value, abs=1e-6, rel=1e-5)


def test_estimate_counts_the_parameters(tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Exactly, but for the norm gains and biases that processing folds away and the
    unembedding bias TransformerLens 4's native model does not have (the estimate counts one,
    as Hugging Face models with a bias have)."""
    for arch in ARCHS.values():
        lm = tiny_factories["random"](seed=7, **arch)
        dims = ModelDims.of(lm)
        norms = (4 * dims.n_layers + 2) * dims.d_model if dims.d_mlp else \
            (2 * dims.n_layers + 2) * dims.d_model
        assert dims.n_params - lm.n_params in (0, norms, dims.d_vocab, norms + dims.d_vocab)


def test_a_model_that_will_not_fit_is_refused_before_loading() -> None:
    huge = dict(n_layers=400, d_model=16384, n_heads=128, d_head=128, d_mlp=65536,
                d_vocab=256_000, n_ctx=4096, act_fn="gelu_new", normalization_type="LN")
    spec = ModelSpec(source="random", name="huge", architecture=huge, seed=0)
    with pytest.raises(ModelTooLargeError, match=r"needs about .* GiB .* available"):
        load_model(spec)


def test_records_are_unchanged_by_the_shared_work(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Families run together share work (lens point L-1, the first half of swaps); alone they
    compute it themselves. Both give the same records."""
    lm = tiny_factories["random"](seed=8)
    tokens = tiny_factories["tokens"](2, 14, lm.d_vocab_real, lm.bos_token_id, seed=3)
    opts = EngineOptions(batch_size=2, **OPTS)
    together = sweep(lm, tokens, ["intervention", "logit_lens", "similarity"], opts).records
    alone = [r for f in ("intervention", "logit_lens", "similarity")
             for r in sweep(lm, tokens, [f], opts).records]
    assert [asdict(r) for r in together] == [asdict(r) for r in alone]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fast_path_equals_hooked_and_bfloat16_is_close() -> None:
    """On CUDA: the fast path (fused attention, no pattern) equals the hooked blocks in float32
    (1e-4 absolute or 1e-3 relative), and in bfloat16 every intervention KL above 0.05 nats is
    within 10% of float32 (docs/performance.md: the bfloat16 tolerance)."""
    arch = dict(n_layers=3, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=512, n_ctx=64,
                act_fn="gelu_new", normalization_type="LN", initializer_range=0.2)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 512, (6, 32), generator=g)
    tokens[:, 0] = 0
    opts = EngineOptions(induction_n=8, induction_sequences=4)
    families = ["intervention", "logit_lens", "heads", "similarity"]

    def run(dtype: str, fast: bool) -> dict[tuple[Any, ...], float]:
        lm = load_model(ModelSpec(source="random", name="g", architecture=arch, seed=0,
                                  dtype=dtype), "cuda")  # type: ignore[arg-type]
        lm._ctx["fast_path"] = fast
        return {(r.metric, r.layer, r.component, r.head): r.value
                for r in sweep(lm, tokens, families, opts).records}

    fast, hooked = run("float32", True), run("float32", False)
    for key, value in hooked.items():
        assert fast[key] == pytest.approx(value, abs=1e-4, rel=1e-3), key
    low = run("bfloat16", True)
    compared = [(low[k], v) for k, v in fast.items() if k[0] == "intervention.kl" and v > 0.05]
    assert compared
    for got, want in compared:
        assert got == pytest.approx(want, rel=0.1)


def test_logit_blocks_and_head_groups_by_device(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """CPU: cache-sized [rows, cols] logit blocks and ~2048-token head groups. Accelerator (the
    sizes only; no device needed): whole rows within a quarter of the logits budget, and as many
    head variants as the budget holds."""
    from types import SimpleNamespace

    from compute.memory import variant_bytes_per_sequence
    from compute.metrics.base import CPU_LOGIT_BLOCK_MB, CPU_LOGIT_COLS, logit_chunks
    from compute.metrics.heads import CPU_HEAD_GROUP_TOKENS, head_group_size

    lm = tiny_factories["random"](seed=5, d_vocab=5000, n_heads=4)
    opts = EngineOptions()
    cpu = logit_chunks(lm, opts)
    assert (cpu.rows, cpu.cols) == (CPU_LOGIT_BLOCK_MB * 2**20 // 4 // CPU_LOGIT_COLS,
                                    CPU_LOGIT_COLS)
    assert logit_chunks(lm, EngineOptions(chunk_mb=1)).rows == cpu.rows // CPU_LOGIT_BLOCK_MB
    assert head_group_size(lm, 4, 128, opts) == min(lm.n_heads, CPU_HEAD_GROUP_TOKENS // 512)
    assert head_group_size(lm, 64, 128, opts) == 1

    gpu = SimpleNamespace(device="cuda:0", d_vocab=lm.d_vocab, n_heads=lm.n_heads, cfg=lm.cfg,
                          dtype_bytes=2)
    whole = logit_chunks(gpu, opts)  # type: ignore[arg-type]
    assert whole.cols == lm.d_vocab
    assert whole.rows == (opts.logits_budget_mb // 4) * 2**20 // (4 * lm.d_vocab)
    per_variant = 64 * variant_bytes_per_sequence(ModelDims.of(lm), 128, 2)
    small = EngineOptions(logits_budget_mb=8)
    assert head_group_size(gpu, 64, 128, small) == max(  # type: ignore[arg-type]
        1, min(lm.n_heads, 8 * 2**20 // per_variant))
    assert head_group_size(gpu, 1, 16, opts) == lm.n_heads  # type: ignore[arg-type]


def test_progress_is_a_fraction_of_the_work(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Progress counts the families' units weighted by their FLOPs: what a family's reports
    advance is its share of the counted work (compute.flops), not of the units; the total
    is the plain unit count; reports only grow and end at the total. Here a wide vocabulary
    makes each layer of head ablations (4 downstream passes, 4 unembeddings) far costlier than
    an intervention unit."""
    from compute.flops import induction_flops, neurons_flops

    lm = tiny_factories["random"](seed=7, n_layers=3, d_vocab=4000)
    n_seq, seq_len = 4, 12
    tokens = tiny_factories["tokens"](n_seq, seq_len, lm.d_vocab_real, lm.bos_token_id, seed=1)
    families = ["intervention", "heads", "neurons"]
    seen: list[Any] = []
    sweep(lm, tokens, families, EngineOptions(batch_size=2, **OPTS), progress=seen.append)
    units = sum(f.units_per_batch(lm) for f in families_named(families)) * 2 + sum(
        f.units_at_finish(lm, EngineOptions(**OPTS)) for f in families_named(families))
    assert {p.total for p in seen} == {units}
    dones = [p.done for p in seen]
    assert dones == sorted(dones)
    assert dones[-1] == units
    dims = ModelDims.of(lm)
    per_seq = family_flops(dims, seq_len, families, parallel=lm.parallel)
    n = min(OPTS["induction_n"], (lm.n_ctx - 1) // 2)
    work = {"intervention": per_seq["intervention"] * n_seq, "neurons": neurons_flops(dims),
            "heads": per_seq["heads"] * n_seq + induction_flops(dims, n,
                                                                OPTS["induction_sequences"])}
    # The first batch runs intervention, then heads: the reports between them measure heads.
    per_batch = {f.name: f.units_per_batch(lm) for f in families_named(families)}
    first_intervention = seen[per_batch["intervention"] - 1].done
    first_heads = seen[per_batch["intervention"] + per_batch["heads"] - 1].done - first_intervention
    share = sum(work.values())
    assert first_intervention / units == pytest.approx(work["intervention"] / 2 / share, abs=0.02)
    heads_batch = per_seq["heads"] * n_seq / 2
    assert first_heads / units == pytest.approx(heads_batch / share, abs=0.02)
    assert first_heads > 3 * first_intervention / per_batch["intervention"] * per_batch["heads"]


def test_progress_weighs_the_screen_and_the_drops_at_the_runs_own_settings(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Progress weights (`compute.flops.unit_weights`, as the sweep calls it) count the head
    screen's and the n-block drops' work at the run's settings — the screen's draws and top k,
    the drop widths — not at the defaults: a batch of each weighs what its FLOPs at those
    settings are, relative to a batch of intervention."""
    from compute.flops import (
        flop_settings,
        heads_screen_flops,
        pruning_drops_flops,
        pruning_flops,
        unit_weights,
    )

    lm = tiny_factories["random"](seed=7, n_layers=6, d_vocab=4000)
    seq_len, batch, n_batches = 12, 2, 3
    dims = ModelDims.of(lm)
    names = ["intervention", "heads_screen", "pruning_drops"]
    opts = EngineOptions(screen_samples=0, screen_top_k=2, drop_widths=(3,), **OPTS)
    units = {f.name: (f.units_per_batch(lm), f.units_at_finish(lm, opts))
             for f in families_named(names)}
    per_seq = family_flops(dims, seq_len, names, parallel=lm.parallel)  # at the defaults

    def batch_work(weights: dict[str, tuple[float, float]], name: str) -> float:
        return weights[name][0] * units[name][0]

    got = unit_weights(dims, seq_len, batch, n_batches, units, parallel=lm.parallel,
                       **flop_settings(opts))
    at_defaults = unit_weights(dims, seq_len, batch, n_batches, units, parallel=lm.parallel)
    screen = heads_screen_flops(dims, seq_len, 1, 0, samples=0, parallel=lm.parallel)
    # the drops at width 3 (width 1 is intervention's), and the predictors they are scored with
    drops = pruning_drops_flops(dims, seq_len, with_intervention=True, widths=(3,)) + \
        pruning_flops(dims, seq_len)
    intervention = batch_work(got, "intervention")
    assert batch_work(got, "heads_screen") / intervention == pytest.approx(
        screen / per_seq["intervention"], rel=1e-9)
    assert batch_work(got, "pruning_drops") / intervention == pytest.approx(
        drops / per_seq["intervention"], rel=1e-9)
    # the defaults (8 draws; widths 1..3 here) would have weighed both differently
    for name in ("heads_screen", "pruning_drops"):
        ratio = batch_work(at_defaults, name) / batch_work(at_defaults, "intervention")
        assert ratio > 1.5 * batch_work(got, name) / intervention


def test_a_wide_vocabulary_compares_unchanged_logits_to_zero_kl(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """With P kept as W_U p the reference holds one row block's whole logits, so its rows are
    capped (REFERENCE_BLOCK_BYTES) — and the comparisons' rows with them: the same row blocks
    make the same matmuls, so unchanged logits still compare to KL 0 to the bit at a
    vocabulary as wide as Gemma 3's."""
    from compute.metrics.base import logit_chunks
    from compute.reduce import (
        REFERENCE_BLOCK_BYTES,
        compare_distributions,
        reference_distribution,
    )

    lm = tiny_factories["random"](seed=9, n_layers=1, d_model=16, n_heads=2, d_head=8,
                                  d_mlp=32, d_vocab=300_000)
    chunks = logit_chunks(lm, EngineOptions())
    assert chunks.rows == REFERENCE_BLOCK_BYTES // (4 * lm.d_vocab) < 512
    gen = torch.Generator().manual_seed(2)
    resid = torch.randn(600, 16, generator=gen) * 3
    targets = torch.randint(0, lm.d_vocab, (600,), generator=gen)
    with torch.inference_mode():
        ref = reference_distribution(lm, resid, targets, chunks=chunks)
        got = compare_distributions(lm, resid[None], ref, chunks=chunks)
    assert ref.probs is None
    assert torch.equal(got.kl[0], torch.zeros(600))
    assert torch.equal(got.loss[0], ref.loss)
