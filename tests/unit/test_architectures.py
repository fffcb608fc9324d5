"""The architecture matrix (`compute/zoo/architectures.py`): for every causal-LM architecture
TransformerLens 3.9 converts, a tiny random checkpoint built by code is loaded as a user's
checkpoint folder is, and

- Strata's clean forward matches the Hugging Face model's own float32 forward within the case's
  tolerance (max |Δ log p| over every position and token of 2 x 48 tokens, longer than every
  sliding window), on the fast blocks and on TransformerLens's blocks where both apply;
- the parity report the load measured says the same;
- every metric family runs and no number is NaN or infinite;
- the weight processing follows the architecture (no norm folding into post-norm blocks, no
  value-bias folding under attention sinks, no unembedding centering under a logit soft-cap),
  and a model processed wrongly is refused by its parity check rather than measured;
- `docs/architectures.md` is the table generated from the matrix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from compute.errors import ParityError, UnsupportedArchitectureError
from compute.metrics import DEFAULT_FAMILIES
from compute.models import LoadedModel, Processing, load_model, resolve_model_spec
from compute.zoo.architectures import CASES, CASES_BY_NAME, SEQ_LEN, build_checkpoint
from tests.unit.test_hf_forward import hf_log_probs, strata_log_probs

pytestmark = pytest.mark.usefixtures("single_torch_thread")
EXACT = [c.name for c in CASES if c.expect == "exact"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def matrix_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix")


def checkpoint(matrix_dir: Path, name: str) -> Path:
    path = matrix_dir / name
    if not (path / "config.json").is_file():
        build_checkpoint(CASES_BY_NAME[name], path)
    return path


# Each case's model as a run loads it (the default spec), loaded once for the module's tests
# that only read it (the module runs in one process): the load, with its Hugging Face parity
# forward, was a third of the matrix's time when each test made its own.
_LOADED: dict[str, LoadedModel] = {}


def loaded(matrix_dir: Path, name: str) -> LoadedModel:
    if name not in _LOADED:
        _LOADED[name] = load_model(resolve_model_spec(str(checkpoint(matrix_dir, name))))
    return _LOADED[name]


def tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 128, (2, SEQ_LEN), generator=gen)
    ids[:, 0] = 0
    return ids


@pytest.mark.parametrize("name", EXACT)
def test_clean_forward_matches_hugging_face(matrix_dir: Path, name: str) -> None:
    case = CASES_BY_NAME[name]
    path = checkpoint(matrix_dir, name)
    lm = loaded(matrix_dir, name)
    assert lm.architecture == case.architecture
    assert lm.fast_path is (case.path == "fast"), f"{name}: the documented path is {case.path}"
    ids = tokens()
    theirs = hf_log_probs(path, ids)
    decided = lm.fast_path
    paths = [True, False] if decided else [False]
    try:
        for fast in paths:
            lm._ctx["fast_path"] = fast
            diff = (strata_log_probs(lm, ids) - theirs).abs().max().item()
            where = "fast" if fast else "bridge"
            assert diff <= case.tolerance, f"{name} ({where} blocks): max |Δ log p| {diff:.2e}"
    finally:  # the module's other tests read the model as loaded: its own path back
        lm._ctx["fast_path"] = decided
    # The parity report measured at load says the model passed, by a number of the same size.
    assert lm.parity is not None
    assert lm.parity.reference == "huggingface"
    assert lm.parity.passed
    assert lm.parity.max_abs_logprob_diff is not None
    assert lm.parity.max_abs_logprob_diff <= case.tolerance
    assert lm.parity.block_paths == (lm.block_path,) * 3


ATTENTION_FAMILIES = {"attention", "heads", "heads_atp", "heads_screen"}


@pytest.mark.parametrize("name", EXACT)
def test_every_family_runs_without_nan(matrix_dir: Path, name: str) -> None:
    """Every family runs on the blocks it applies to (docs/metrics.md, "Block kinds") or is
    refused on the architecture by name: the whole-block families on every block, drop_attn
    where a block has a token mixer, drop_mlp and neurons where it has an MLP, the attention
    families on the attention blocks only; and each block is what the matrix says it is."""
    from compute.engine import sweep
    from compute.metrics.base import EngineOptions

    case = CASES_BY_NAME[name]
    lm = loaded(matrix_dir, name)
    kinds = lm.layers
    refused = set(lm.refused_families)
    if case.blocks is not None:
        assert tuple(k.label for k in kinds) == case.blocks
    else:  # attention in every block, its heads read unless the head families are refused
        assert all(k.attention and k.mlp is not None for k in kinds), name
        assert lm.attention_layers == (() if "heads" in refused else tuple(range(lm.n_layers)))
    assert lm.describe()["blocks"] == [k.describe() for k in kinds]
    opts = EngineOptions(induction_n=8, induction_sequences=2, top_neurons=2, top_tokens=2)
    # The default run's families, the head screens, which differentiate through every block
    # (autograd must get through each architecture's forward), and the pruning families.
    names = [*DEFAULT_FAMILIES, "heads_atp", "heads_screen", "pruning", "pruning_drops"]
    result = sweep(lm, tokens()[:, :24], names, opts)
    families = {r.metric.split(".")[0] for r in result.records}
    expected = set(names) - refused
    if not lm.attention_layers:
        expected -= ATTENTION_FAMILIES  # recorded as such: no rows, and the model says why
    if not lm.mlp_layers:
        expected -= {"neurons"}
    assert families == expected
    bad = [r for r in result.records if not math.isfinite(r.value)]
    assert not bad, f"{name}: {len(bad)} non-finite values, e.g. {bad[:3]}"

    def layers_of(family: str, component: str | None = None) -> set[int | None]:
        return {
            r.layer
            for r in result.records
            if r.metric.split(".")[0] == family
            and r.layer is not None
            and (component is None or r.component == component)
        }

    mixers = {i for i, k in enumerate(kinds) if k.mixer is not None}
    mlps = set(lm.mlp_layers)
    assert layers_of("intervention", "drop") == set(range(lm.n_layers))
    assert layers_of("intervention", "drop_attn") == mixers
    assert layers_of("intervention", "drop_mlp") == mlps
    assert layers_of("norms", "attn") == mixers
    assert layers_of("norms", "mlp") == mlps
    for family in ATTENTION_FAMILIES & families:
        assert layers_of(family) == set(lm.attention_layers), family
    if "neurons" in families:
        assert layers_of("neurons") == mlps
        neurons = {r.neuron for r in result.records if r.metric == "neurons.vocab_kurt"}
        assert len(neurons) == lm.n_neurons  # every expert's units under a mixture of experts


PROCESSING_RULES: dict[str, dict[str, bool]] = {
    # post-norm: nothing folded or centered into weights whose output is normalised
    "olmo-2": dict(fold_ln=False, center_writing_weights=False),
    "olmo-3": dict(fold_ln=False, center_writing_weights=False),
    # attention sinks: rows do not sum to one, so b_V cannot move into b_O
    "gpt-oss": dict(fold_value_biases=False),
    # a logit soft-cap is not shift-invariant; the writes pass through post-sublayer norms
    # TransformerLens 4.3's processing changes Gemma 2's function: none is applied
    "gemma-2": dict(center_unembed=False, center_writing_weights=False, fold_ln=False,
                    fold_value_biases=False),
    "gpt2": dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                 fold_value_biases=True),
    # steps the TransformerLens adapter declares it does not take are recorded as not taken
    "modernbert-decoder": dict(fold_ln=False, center_writing_weights=False),
    "deepseek-v2": dict(fold_ln=False),
}


@pytest.mark.parametrize("name", list(PROCESSING_RULES))
def test_processing_follows_the_architecture(matrix_dir: Path, name: str) -> None:
    lm = loaded(matrix_dir, name)
    applied = lm.applied.as_dict()
    for flag, expected in PROCESSING_RULES[name].items():
        assert applied[flag] is expected, f"{name}: {flag} should be {expected}"
    if not all(PROCESSING_RULES[name].values()):
        assert applied["notes"], "a step left out must say why"


@pytest.mark.parametrize(
    ("name", "wrong"),
    [("gemma-2", dict(fold_ln=True)), ("gpt-oss", dict(fold_value_biases=True))],
)
def test_a_model_processed_wrongly_is_refused_by_its_parity(
    matrix_dir: Path, name: str, wrong: dict[str, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the rules above missing, the parity check would catch it: the model is refused
    with the size of the difference, not measured."""
    from compute.models import processing, sources

    real = processing.effective_processing

    def careless(requested: Processing, cfg: Any) -> Any:
        return processing.AppliedProcessing(**{**real(requested, cfg).as_dict(), **wrong,
                                               "notes": ()})

    monkeypatch.setattr(sources, "effective_processing", careless)
    with pytest.raises(ParityError, match=r"differs from the Hugging Face model's by"):
        load_model(resolve_model_spec(str(checkpoint(matrix_dir, name))))


def test_a_mechanism_strata_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    """Phi with qk-norm: TransformerLens 4.3's Phi attention has none, so the load is refused
    before any weight is read, naming the architecture and the mechanism."""
    import transformers

    from compute.zoo.architectures import word_level_tokenizer

    case = CASES_BY_NAME["phi"]
    config = transformers.PhiConfig(**{**case.settings, "qk_layernorm": True,
                                       "num_hidden_layers": 2})
    config.architectures = ["PhiForCausalLM"]
    transformers.PhiForCausalLM(config).save_pretrained(tmp_path)
    word_level_tokenizer(128).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match=r"PhiForCausalLM with qk_layernorm"):
        load_model(resolve_model_spec(str(tmp_path)))


def test_bfloat16_load_reports_its_noise_floor(matrix_dir: Path) -> None:
    """At bfloat16 the report keeps float32's parity (measured before the cast) and adds the
    noise floor: KL(float32 || bfloat16) of Strata's own forward, small but not zero."""
    path = str(checkpoint(matrix_dir, "llama"))
    fp32 = loaded(matrix_dir, "llama")
    bf16 = load_model(resolve_model_spec(path, dtype="bfloat16"))
    assert bf16.parity is not None
    assert fp32.parity is not None
    assert bf16.parity.max_abs_logprob_diff == pytest.approx(fp32.parity.max_abs_logprob_diff)
    assert fp32.parity.noise_floor_kl is None
    assert bf16.parity.noise_floor_kl is not None
    assert 0.0 < bf16.parity.noise_floor_kl < 0.05
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    # the floor is the KL of the two forwards Strata runs, measured independently here
    from compute.models.parity import parity_tokens

    ids = parity_tokens(fp32.d_vocab_real, fp32.bos_token_id, fp32.n_ctx)
    p32, p16 = strata_log_probs(fp32, ids), strata_log_probs(bf16, ids)
    kl = (p32.exp() * (p32 - p16)).sum(-1).mean().item()
    assert bf16.parity.noise_floor_kl == pytest.approx(kl, rel=1e-6)


def test_the_supported_architectures_doc_is_generated_from_the_matrix() -> None:
    from compute.zoo.architectures import markdown_table

    doc = ROOT / "docs" / "architectures.md"
    assert doc.read_text() == markdown_table(), (
        "docs/architectures.md is stale: python -m compute.zoo.architectures > "
        "docs/architectures.md"
    )


def test_strata_models_check_prints_the_report_and_refuses_with_exit_3(
    matrix_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compute.models import processing, sources
    from tests.serving import run_strata

    gpt2 = str(checkpoint(matrix_dir, "gpt2"))
    ok = run_strata(["models", "check", gpt2, "--dtype", "bfloat16"], {})
    assert ok.exit_code == 0, ok.output
    assert "parity           passed" in ok.output
    assert "noise floor      KL(float32 || bfloat16)" in ok.output
    from compute import hardware

    rates = {dt: hardware.matmul_gflops("cpu", dt) for dt in ("bfloat16", "float32")}
    assert f"matmul speed     bfloat16 {rates['bfloat16']:.1f} GFLOP/s" in ok.output
    # the run's warning where bfloat16 is emulated here, and only there
    assert ("bfloat16 is emulated" in ok.output) == (rates["bfloat16"] < rates["float32"])
    as_json = run_strata(["models", "check", gpt2, "--json"], {})
    assert '"passed": true' in as_json.output
    assert "matmul_gflops" not in as_json.output  # float32: nothing to compare
    # a model processed wrongly: the report is printed, FAILED, and the exit code is 3
    real = processing.effective_processing
    monkeypatch.setattr(
        sources,
        "effective_processing",
        lambda req, cfg: processing.AppliedProcessing(
            **{**real(req, cfg).as_dict(), "fold_ln": True, "notes": ()}
        ),
    )
    bad = run_strata(["models", "check", str(checkpoint(matrix_dir, "gemma-2"))], {})
    assert bad.exit_code == 3
    assert "parity           FAILED" in bad.output
    assert "Gemma2ForCausalLM" in bad.output


def test_strata_compute_refuses_an_unsupported_mechanism_with_exit_3(tmp_path: Path) -> None:
    import transformers

    from compute.zoo.architectures import word_level_tokenizer
    from tests.serving import run_strata

    config = transformers.PhiConfig(**{**CASES_BY_NAME["phi"].settings, "qk_layernorm": True,
                                       "num_hidden_layers": 2})
    config.architectures = ["PhiForCausalLM"]
    transformers.PhiForCausalLM(config).save_pretrained(tmp_path / "phi")
    word_level_tokenizer(128).save_pretrained(tmp_path / "phi")
    out = tmp_path / "out.json"
    result = run_strata(["compute", "--model", str(tmp_path / "phi"), "--metrics", "norms",
                         "--n-sequences", "2", "--seq-len", "8", "--out", str(out)], {})
    assert result.exit_code == 3, result.output
    assert "PhiForCausalLM with qk_layernorm" in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "override"),
    [
        ("olmo", {"num_key_value_heads": 2}),
        ("olmo-2", {"attention_bias": True}),
        ("gemma-3", {"final_logit_softcapping": 3.0}),
        ("gemma", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                       "rope_theta": 10000.0}}),
    ],
)
def test_what_transformer_lens_3_refused_is_now_exact(
    tmp_path: Path, name: str, override: dict[str, Any]
) -> None:
    """Mechanisms TransformerLens 3.9's converters could not take (grouped-query OLMo, OLMo 2
    with attention biases, Gemma 3 with a logit soft-cap, Gemma with linear rope scaling) run
    on the model's own modules through the bridge, held to Hugging Face like every case."""
    import dataclasses

    case = CASES_BY_NAME[name]
    odd = dataclasses.replace(case, settings={**case.settings, **override})
    path = build_checkpoint(odd, tmp_path / name)
    lm = load_model(resolve_model_spec(str(path)))
    assert lm.parity is not None
    assert lm.parity.passed
    diff = (strata_log_probs(lm, tokens()) - hf_log_probs(path, tokens())).abs().max().item()
    assert diff <= case.tolerance


@pytest.mark.parametrize("name", EXACT)
def test_interventions_and_lens_do_not_depend_on_the_processing_applied(
    matrix_dir: Path, name: str
) -> None:
    """docs/metrics.md: drop, swap, drop_attn / drop_mlp, the logit lens and attention patterns
    do not depend on weight processing, where it is applied as the architecture allows — held
    here on every architecture of the matrix, the processed load against the unprocessed one."""
    from compute.engine import sweep
    from compute.metrics.base import EngineOptions

    path = str(checkpoint(matrix_dir, name))
    none = Processing(fold_ln=False, center_writing_weights=False, center_unembed=False,
                      fold_value_biases=False)
    processed = loaded(matrix_dir, name)
    raw = load_model(resolve_model_spec(path, processing=none))
    ids = tokens()[:, :20]
    families = ["intervention", "logit_lens", "attention"]
    opts = EngineOptions(batch_size=2)
    a = {(r.metric, r.layer, r.component, r.head): r.value
         for r in sweep(processed, ids, families, opts).records}
    b = {(r.metric, r.layer, r.component, r.head): r.value
         for r in sweep(raw, ids, families, opts).records}
    assert set(a) == set(b)
    worse = {k: (a[k], b[k]) for k in a if abs(a[k] - b[k]) > 1e-4 * max(1.0, abs(b[k]))}
    assert not worse, f"{name}: {len(worse)} numbers moved with the processing, e.g. " + str(
        list(worse.items())[:4])


# Blocks whose output is not their input plus the writes Strata reads: GPT-1's post-LN blocks
# normalise the sum (x + attn, then + mlp). Their sublayer ablations rerun the block instead.
NOT_ADDITIVE = {"openai-gpt"}


@pytest.mark.parametrize("name", EXACT)
def test_each_block_adds_the_writes_it_reports(matrix_dir: Path, name: str) -> None:
    """The shortcuts of drop_attn, drop_mlp and the head ablations assume a block's output is
    its input plus the writes Strata reads: held here on the matrix's own tokens for every
    block the load's probe called additive, by running the block clean and with each write
    zeroed; and the probe calls exactly GPT-1's post-LN blocks otherwise."""
    lm = loaded(matrix_dir, name)
    assert [k.additive for k in lm.layers] == [name not in NOT_ADDITIVE] * lm.n_layers
    with torch.inference_mode():
        resid = lm.embed(tokens()[:, :24])
        for layer, kind in enumerate(lm.layers):
            clean = lm.run_block(layer, resid)
            if kind.additive:
                scale = float(clean.resid.abs().max())
                a = clean.attn_out if clean.attn_out is not None else 0.0
                m = clean.mlp_out if clean.mlp_out is not None else 0.0
                alone = lm.run_block(layer, resid, zero_attn=True)
                m0 = alone.mlp_out if alone.mlp_out is not None else 0.0
                for got, want in (
                    (clean.resid, resid + a + m),
                    (lm.run_block(layer, resid, zero_mlp=True).resid, resid + a),
                    (alone.resid, resid + m0),
                ):
                    assert float((got - want).abs().max()) <= 1e-5 * max(scale, 1.0), layer
            resid = clean.resid


@pytest.mark.parametrize("name", EXACT)
def test_head_ablation_is_the_block_rerun_with_the_head_zeroed(
    matrix_dir: Path, name: str
) -> None:
    """`heads`' ablation (the cached write minus the head's z through its rows of W_O, where
    the load's probe found that exact) against the slow reference: the block rerun with the
    head's z zeroed by its hook, head by head, on every attention block."""
    from compute.engine import clean_pass
    from compute.metrics.base import EngineOptions, logit_chunks
    from compute.metrics.heads import ablated_block_output

    lm = loaded(matrix_dir, name)
    if not lm.attention_layers:
        pytest.skip(f"{name}: no attention heads")
    ids = tokens()[:, :24]
    with torch.inference_mode():
        ctx = clean_pass(lm, ids, False, logit_chunks(lm, EngineOptions()), lambda _: None,
                         capture_z=True)
        for layer in lm.attention_layers:
            heads = lm.layers[layer].heads
            assert heads is not None
            group = list(range(heads.n_heads))
            fast = ablated_block_output(ctx, layer, group).unflatten(0, (len(group), -1))
            scale = max(float(ctx.resid[layer + 1].abs().max()), 1.0)
            for h in group:
                mask = torch.ones(ids.shape[0], heads.n_heads)
                mask[:, h] = 0.0
                slow = lm.run_block(layer, ctx.resid[layer], head_mask=mask).resid
                assert float((fast[h] - slow).abs().max()) <= 1e-5 * scale, (layer, h)


@pytest.mark.parametrize("name", ["granite", "granite-moe", "afmoe"])
def test_the_probe_finds_head_writes_the_structure_misses(matrix_dir: Path, name: str) -> None:
    """Granite's residual multiplier and AFMoE's norm after attention sit between the output
    projection and the residual stream, where no post-norm list names them: subtracting a
    head's z W_O from the cached write would be wrong there (by more than rounding), so the
    load's probe sends their head ablations to the rerun."""
    from compute.engine import clean_pass
    from compute.metrics.base import EngineOptions, logit_chunks

    lm = loaded(matrix_dir, name)
    assert not any(lm.head_writes_are_linear(layer) for layer in lm.attention_layers)
    ids = tokens()[:, :24]
    with torch.inference_mode():
        ctx = clean_pass(lm, ids, False, logit_chunks(lm, EngineOptions()), lambda _: None,
                         capture_z=True)
        assert ctx.z is not None
        z, attn = ctx.z[0], ctx.attn_out[0]
        assert z is not None
        assert attn is not None
        naive = attn - lm.head_writes(0, z, [0])[0]
        mask = torch.ones(ids.shape[0], lm.n_heads)
        mask[:, 0] = 0.0
        rerun = lm.run_block(0, ctx.resid[0], head_mask=mask).attn_out
        assert rerun is not None
        assert float((naive - rerun).abs().max()) > 1e-3 * float(attn.abs().max())


@pytest.mark.parametrize("name", ["deepseek-v2", "deepseek-v3", "glm-4-moe-lite", "youtu"])
def test_a_latent_attention_head_ablation_zeroes_that_heads_values(
    matrix_dir: Path, name: str
) -> None:
    """Multi-head latent attention: a head's z is its v_head_dim slice of the output
    projection's input (TransformerLens's hook_z splits by the query/key width instead). The
    reference, by hand: the head's value rows of kv_b_proj zeroed in the weights, so the
    attention computes a zero value for that head alone; the block's output must be what
    `run_block` gives with the head's z zeroed, and what the `heads` family computes."""
    from compute.engine import clean_pass
    from compute.metrics.base import EngineOptions, logit_chunks
    from compute.metrics.heads import ablated_block_output

    lm = loaded(matrix_dir, name)
    attn = lm.model.blocks[1].attn.original_component
    heads = lm.layers[1].heads
    assert heads is not None
    nope, v = int(attn.qk_nope_head_dim), int(attn.v_head_dim)
    assert (heads.n_heads, heads.d_head) == (int(attn.num_heads), v)
    assert v != int(lm.cfg.d_head)  # the width TransformerLens would split z by
    ids = tokens()[:, :24]
    with torch.inference_mode():
        ctx = clean_pass(lm, ids, False, logit_chunks(lm, EngineOptions()), lambda _: None,
                         capture_z=True)
        family = ablated_block_output(ctx, 1, list(range(heads.n_heads)))
        family = family.unflatten(0, (heads.n_heads, -1))
        weight = getattr(attn.kv_b_proj, "original_component", attn.kv_b_proj).weight
        kept = weight.detach().clone()
        for h in range(heads.n_heads):
            mask = torch.ones(ids.shape[0], heads.n_heads)
            mask[:, h] = 0.0
            hooked = lm.run_block(1, ctx.resid[1], head_mask=mask).resid
            rows = slice(h * (nope + v) + nope, (h + 1) * (nope + v))
            with torch.no_grad():
                weight[rows] = 0.0
            try:
                by_hand = lm.run_block(1, ctx.resid[1]).resid
            finally:
                with torch.no_grad():
                    weight.copy_(kept)
            scale = max(float(by_hand.abs().max()), 1.0)
            assert float((hooked - by_hand).abs().max()) <= 1e-5 * scale, h
            assert float((family[h] - by_hand).abs().max()) <= 1e-5 * scale, h
            # and it is one head: the clean block differs
            assert float((ctx.resid[2] - by_hand).abs().max()) > 1e-4


def test_per_layer_head_widths_are_read_at_the_output_projection(matrix_dir: Path) -> None:
    """Gemma 4's global layers have heads of global_head_dim, not the config's head_dim, where
    TransformerLens's W_O and hook_z cannot split: there a head is its slice of o_proj's input,
    and zeroing it equals zeroing that slice's columns of o_proj by hand."""
    lm = load_model(resolve_model_spec(str(checkpoint(matrix_dir, "gemma-4-text"))))
    layer = 2  # the global layer
    heads = lm.layers[layer].heads
    assert heads is not None
    assert heads.o_proj is not None
    assert heads.d_head != int(lm.cfg.d_head)
    weight = getattr(heads.o_proj, "original_component", heads.o_proj).weight
    kept = weight.detach().clone()
    with torch.inference_mode():
        resid = lm.embed(tokens()[:, :24])
        for block in range(layer):
            resid = lm.run_block(block, resid).resid
    for h in (0, heads.n_heads - 1):
        mask = torch.ones(resid.shape[0], heads.n_heads)
        mask[:, h] = 0.0
        with torch.inference_mode():
            hooked = lm.run_block(layer, resid, head_mask=mask).resid
        with torch.no_grad():
            weight[:, h * heads.d_head : (h + 1) * heads.d_head] = 0.0
        try:
            with torch.inference_mode():
                by_hand = lm.run_block(layer, resid).resid
        finally:
            with torch.no_grad():
                weight.copy_(kept)
        assert float((hooked - by_hand).abs().max()) <= 1e-5 * float(by_hand.abs().max())


def test_refused_families_are_recorded_and_not_run(matrix_dir: Path) -> None:
    """JetMoE's heads are routed experts: the attention families are refused on it by name,
    recorded with the model, and a run of them alone is refused; the rest run."""
    from compute.engine import sweep
    from compute.metrics.base import EngineOptions

    lm = load_model(resolve_model_spec(str(checkpoint(matrix_dir, "jetmoe"))))
    refused = lm.describe()["refused_families"]
    assert set(refused) == ATTENTION_FAMILIES
    assert "mixture of attention heads" in refused["heads"]
    opts = EngineOptions(induction_n=8, induction_sequences=2)
    result = sweep(lm, tokens()[:, :12], ["heads", "norms"], opts)
    assert {r.metric.split(".")[0] for r in result.records} == {"norms"}
    with pytest.raises(UnsupportedArchitectureError, match="mixture of attention heads"):
        sweep(lm, tokens()[:, :12], ["heads", "attention"], opts)


def test_every_refused_case_is_refused_from_its_config_alone() -> None:
    """The matrix's refused cases are refused by `refusal_of` (config.json alone, no weight
    read), and so are Gemma 4's per-layer-input and shared key/value variants, while the
    matrix's Gemma 4 (neither) is not."""
    from compute.models.refusals import refusal_of

    for case in CASES:
        reason = refusal_of(case.architecture, case.settings)
        assert (reason is not None) == (case.expect == "refused"), case.name
    gemma = CASES_BY_NAME["gemma-4-text"].settings
    assert refusal_of("Gemma4ForCausalLM", {**gemma, "num_kv_shared_layers": 1}) is not None
    unset = {k: v for k, v in gemma.items() if k != "hidden_size_per_layer_input"}
    assert "per-layer token inputs" in (refusal_of("Gemma4ForCausalLM", unset) or "")


def test_a_sublayer_strata_does_not_know_is_refused_by_name(
    matrix_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token mixer the block-kind tables do not name is refused at load, by name, never
    guessed at (here Mamba's, with its entry taken out)."""
    from compute.errors import ModelLoadError
    from compute.models import layers

    mixers = {k: v for k, v in layers.TOKEN_MIXERS.items() if k != "MambaMixer"}
    monkeypatch.setattr(layers, "TOKEN_MIXERS", mixers)
    with pytest.raises(ModelLoadError, match=r"'mixer' \(MambaMixer\) Strata does not know"):
        load_model(resolve_model_spec(str(checkpoint(matrix_dir, "mamba"))))


def test_a_run_of_refused_families_only_is_refused_before_loading(
    matrix_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From config.json alone: no weight is read for a run whose families are all refused."""
    from compute import run
    from compute.tokens import TokenSpec

    def no_loading(*_: Any, **__: Any) -> Any:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run, "load_model", no_loading)
    spec = resolve_model_spec(str(checkpoint(matrix_dir, "jetmoe")))
    tokens = TokenSpec(source="builtin", n_sequences=2, seq_len=16)
    config = run.RunConfig(model=spec, tokens=tokens, families=("heads", "heads_atp"))
    with pytest.raises(UnsupportedArchitectureError, match="mixture of attention heads"):
        run.compute_run(config)


def test_each_block_gets_the_inputs_of_its_own_kind(matrix_dir: Path) -> None:
    """Block inputs are captured per layer from the model's own forward: Jamba's Mamba layers
    get what its forward hands them (no mask: no padding), its attention layer the causal
    mask, each for its own layer."""
    lm = load_model(resolve_model_spec(str(checkpoint(matrix_dir, "jamba"))))
    resid = torch.zeros(1, 8, lm.d_model)
    masks = [lm._block_inputs.of(i, resid).get("attention_mask") for i in range(lm.n_layers)]
    assert [k.mixer for k in lm.layers] == ["Mamba", "Mamba", "attention"]
    assert masks[0] is None
    assert masks[1] is None
    assert masks[2] is not None
    assert tuple(masks[2].shape) == (1, 1, 8, 8)


def _same(a: Any, b: Any) -> bool:
    """Whether two captured block inputs are the same: tensors equal in dtype, shape and
    every element (NaN where NaN), containers element by element, anything else by type and
    `==` (or identity, where `==` is not a truth value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if torch.equal(a, b):
            return True
        # exact but for NaN, which equals NaN here (infinities stay as they are)
        inf = float("inf")
        return (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(0.0, inf, -inf), b.nan_to_num(0.0, inf, -inf)))
    if isinstance(a, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys()
                and all(_same(a[k], b[k]) for k in a))
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, RuntimeError, ValueError):
        return a is b


@pytest.mark.parametrize("name", EXACT)
def test_block_inputs_captured_without_running_the_blocks_are_the_whole_forwards(
    matrix_dir: Path, name: str
) -> None:
    """The capture of each block's inputs runs only the first block and stops after the last
    (`BlockInputs._capture`); held here to the capture from the model's whole forward, on every
    architecture, without its fallback to that forward."""
    lm = loaded(matrix_dir, name)
    inputs = lm._block_inputs
    device = torch.device("cpu")
    modules = [block.original_component for block in lm.model.blocks]
    before = [dict(vars(m)) for m in modules]
    fast = inputs.captured(SEQ_LEN, device, skip_blocks=True)
    # each block as it was: a `forward` set on an instance (Falcon's) is put back
    assert [dict(vars(m)) for m in modules] == before
    whole = inputs.captured(SEQ_LEN, device, skip_blocks=False)
    assert len(fast) == len(whole) == lm.n_layers
    for layer, (mine, theirs) in enumerate(zip(fast, whole, strict=True)):
        assert mine.keys() == theirs.keys(), f"{name} block {layer}"
        for key in theirs:
            if key == "shared_kv_states":
                # Gemma 4's store that its layers write their keys and values into during the
                # forward (read back only by KV-shared layers, which Strata refuses): empty when
                # each block is called either way, then filled by the blocks that run
                assert type(mine[key]) is type(theirs[key]), f"{name} block {layer}"
                continue
            assert _same(mine[key], theirs[key]), f"{name} block {layer}: {key}"
