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
from compute.models import Processing, load_model, resolve_model_spec
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


def tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 128, (2, SEQ_LEN), generator=gen)
    ids[:, 0] = 0
    return ids


@pytest.mark.parametrize("name", EXACT)
def test_clean_forward_matches_hugging_face(matrix_dir: Path, name: str) -> None:
    case = CASES_BY_NAME[name]
    path = checkpoint(matrix_dir, name)
    lm = load_model(resolve_model_spec(str(path)))
    assert lm.architecture == case.architecture
    assert lm.fast_path is (case.path == "fast"), f"{name}: the documented path is {case.path}"
    ids = tokens()
    theirs = hf_log_probs(path, ids)
    paths = [True, False] if lm.fast_path else [False]
    for fast in paths:
        lm._ctx["fast_path"] = fast
        diff = (strata_log_probs(lm, ids) - theirs).abs().max().item()
        where = "fast" if fast else "bridge"
        assert diff <= case.tolerance, f"{name} ({where} blocks): max |Δ log p| {diff:.2e}"
    # The parity report measured at load says the model passed, by a number of the same size.
    lm._ctx.pop("fast_path")
    assert lm.parity is not None
    assert lm.parity.reference == "huggingface"
    assert lm.parity.passed
    assert lm.parity.max_abs_logprob_diff is not None
    assert lm.parity.max_abs_logprob_diff <= case.tolerance
    assert lm.parity.block_paths == (lm.block_path,) * 3


@pytest.mark.parametrize("name", EXACT)
def test_every_family_runs_without_nan(matrix_dir: Path, name: str) -> None:
    from compute.engine import sweep
    from compute.metrics.base import EngineOptions

    lm = load_model(resolve_model_spec(str(checkpoint(matrix_dir, name))))
    opts = EngineOptions(induction_n=8, induction_sequences=2, top_neurons=2, top_tokens=2)
    # The default run's families, the head screen, which differentiates through every block
    # (autograd must get through each architecture's forward), and the pruning families.
    names = [*DEFAULT_FAMILIES, "heads_atp", "pruning", "pruning_drops"]
    result = sweep(lm, tokens()[:, :24], names, opts)
    families = {r.metric.split(".")[0] for r in result.records}
    assert families == set(names)
    bad = [r for r in result.records if not math.isfinite(r.value)]
    assert not bad, f"{name}: {len(bad)} non-finite values, e.g. {bad[:3]}"
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
}


@pytest.mark.parametrize("name", list(PROCESSING_RULES))
def test_processing_follows_the_architecture(matrix_dir: Path, name: str) -> None:
    lm = load_model(resolve_model_spec(str(checkpoint(matrix_dir, name))))
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
    fp32 = load_model(resolve_model_spec(path))
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
    processed = load_model(resolve_model_spec(path))
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
