"""The engine against the slow, obvious reference (`tests/reference.py`) on one architecture of
the matrix (`compute/zoo/architectures.py`) per mechanism that departs from the sequential
pre-norm block: every family, every record, within the tolerance of
`tests/unit/test_reference_engine.py`.

- parallel attention + MLP: GPT-NeoX with `use_parallel_residual`;
- ALiBi: Bloom;
- qk-norm: Qwen3;
- post-norm: OLMo 2, and with sliding windows OLMo 3;
- qk-norm with pre- and post-sublayer norms, sliding windows and two rope bases: Gemma 3;
- pre- and post-sublayer norms, attention-score and logit soft-caps, alternating sliding windows:
  Gemma 2;
- sliding window on the fast blocks: Mistral;
- mixture of experts: Mixtral (fast blocks), and with attention sinks and sliding windows:
  GPT-OSS (TransformerLens's blocks).

Sequences are 20 tokens, longer than every window (16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compute.engine import sweep
from compute.metrics.base import EngineOptions
from compute.models import load_model, resolve_model_spec
from compute.zoo.architectures import CASES_BY_NAME, WINDOW, build_checkpoint
from tests import reference
from tests.unit.test_reference_engine import (
    FAMILIES,
    OPTS,
    Swept,
    _close,
    _engine_rows,
    assert_same,
    assert_same_sequence_means,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")
MECHANISMS = {
    "parallel": "gpt-neox-parallel",
    "alibi": "bloom",
    "qk-norm": "qwen3",
    "post-norm": "olmo-2",
    "post-norm-sliding-window": "olmo-3",
    "qk-norm-pre-post-norms-two-rope-bases": "gemma-3",
    "soft-cap-pre-post-norms": "gemma-2",
    "sliding-window-fast": "mistral",
    "moe-fast": "mixtral",
    "sinks-moe": "gpt-oss",
}
SEQ_LEN = 20
assert SEQ_LEN > WINDOW


@pytest.fixture(scope="module", params=list(MECHANISMS))
def swept(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Swept:
    name = MECHANISMS[request.param]
    path = build_checkpoint(CASES_BY_NAME[name], tmp_path_factory.mktemp("mech") / name)
    lm = load_model(resolve_model_spec(str(path)))
    import torch

    gen = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, lm.d_vocab_real, (2, SEQ_LEN), generator=gen)
    tokens[:, 0] = lm.bos_token_id
    opts = EngineOptions(batch_size=2, **OPTS)
    return Swept(lm, tokens, opts, sweep(lm, tokens, FAMILIES, opts))


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_reference(swept: Swept, family: str) -> None:
    rows = reference.reference_rows(swept.lm, swept.tokens, [family], swept.opts)
    expected = reference.to_frame(rows)
    assert expected.height > 0
    assert_same(_engine_rows(swept.result, family), expected)
    assert_same_sequence_means(swept.result, family, reference.sequence_frame(rows))


def test_neuron_tokens_match_reference(swept: Swept) -> None:
    fields = ("layer", "neuron_class", "neuron", "direction", "rank", "token_id")
    expected = {
        tuple(e[f] for f in fields): e["cosine"]
        for e in reference.neuron_token_rows(swept.lm, swept.opts)
    }
    got = {tuple(getattr(t, f) for f in fields): t.cosine for t in swept.result.neuron_tokens}
    assert sorted(got) == sorted(expected)
    assert all(_close(got[k], expected[k]) for k in expected)


def test_the_cases_exercise_their_mechanism(tmp_path: Path) -> None:
    """Each case has the mechanism it stands for (a config change upstream would otherwise
    quietly turn a case into another sequential pre-norm model)."""
    lms = {}
    for key, name in MECHANISMS.items():
        path = build_checkpoint(CASES_BY_NAME[name], tmp_path / name)
        lms[key] = load_model(resolve_model_spec(str(path)))

    def hf(key: str) -> Any:  # the Hugging Face model's own config
        return lms[key].model.original_model.config

    def has(key: str, part: str) -> bool:
        return any(n.endswith(part) for n, _ in lms[key].model.original_model.named_modules())

    assert lms["parallel"].parallel
    assert hf("alibi").model_type == "bloom"
    assert has("qk-norm", "q_norm")
    assert lms["post-norm"].architecture == "Olmo2ForCausalLM"
    assert lms["post-norm"].post_norm
    assert hf("soft-cap-pre-post-norms").attn_logit_softcapping > 0
    assert hf("soft-cap-pre-post-norms").final_logit_softcapping > 0
    assert "sliding_attention" in hf("soft-cap-pre-post-norms").layer_types
    assert has("soft-cap-pre-post-norms", "post_attention_layernorm")
    assert hf("sliding-window-fast").sliding_window == WINDOW
    assert lms["moe-fast"].n_experts == 4
    assert any("sinks" in n for n, _ in lms["sinks-moe"].model.original_model.named_parameters())
    assert lms["sinks-moe"].n_experts == 4
