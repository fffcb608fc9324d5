"""A second real pretrained model, of another family: Gemma 3 270M (google/gemma-3-270m, the base
model) from its Q4_K_M GGUF file. 18 blocks, five sliding-window (512-token) layers then one
global, rope base 10,000 on the local layers and 1,000,000 on the global ones, q/k RMSNorms,
pre- and post-sublayer norms, one key/value head for 4 query heads, a 262,144-token vocabulary,
the embedding scaled by sqrt(d_model). Its weights are under Google's Gemma Terms of Use.

`scripts/setup.sh` fetches the file (`scripts/fetch_gemma3.sh`, cached); without it these tests
are skipped, except in CI, where they fail. The model is loaded once for the module (18-46 s on
2 shared cores from the cached dequantized checkpoint; the first load on a machine dequantizes:
107 s in all).

- Strata's forward (TransformerLens's blocks) against the Hugging Face model's float32 forward
  on 768 tokens of the built-in corpus, past the 512-token window (the logits of every position
  past it and of every fourth before it): at positions 512-767 a local
  layer sees only its last 512 keys while a global one sees them all, so an off-by-one window,
  a local layer run as global or the two rope bases swapped fail here (measured in
  docs/architectures.md, "Gemma 3 270M, beyond its sliding window"), where the load's own
  2 x 32-token check cannot see them;
- the tokenizer the file carries: 262,144 tokens, BOS added by the tokenizer and exactly once in
  a run's windows, the built-in corpus tokenized losslessly;
- the parity report measured at load is stored with the registered model and served with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from litestar.testing import TestClient

from compute import gguf as strata_gguf
from compute.corpus import builtin_corpus_documents
from compute.models import LoadedModel, ModelSpec, load_model, resolve_model_spec
from compute.tokens import TokenSpec, load_tokens, resolve_token_spec
from service.api.app import create_app
from service.settings import ApiSettings, Settings
from service.store import Store
from tests.integration.real_models import data_dir_beside, require_gguf
from tests.unit.test_hf_forward import strata_log_probs

FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
WINDOW = 512
LONG = 768  # tokens, BOS included: 256 positions past the window
# Measured on these 768 tokens: max |Δ log p| 3.9e-4 nats (float32 rounding through an embedding
# scaled by sqrt(640) and 262,144 logits), mean KL 2.4e-11. A window one token too wide gives
# 0.28 and 8e-6, the mildest of the mismatches measured.
TOL = 1e-3
KL_TOL = 1e-9
KEY = "gemma3-test-key"


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    return require_gguf(FILE, "STRATA_GEMMA3_GGUF", "Gemma 3 270M", "scripts/fetch_gemma3.sh")


@pytest.fixture(scope="module")
def data_dir(gguf_file: Path) -> Path:
    return data_dir_beside(gguf_file)


@pytest.fixture(scope="module")
def gemma3(gguf_file: Path, data_dir: Path) -> LoadedModel:
    return load_model(resolve_model_spec(str(gguf_file)))


@pytest.fixture(scope="module")
def long_text(gemma3: LoadedModel) -> torch.Tensor:
    """One window of the built-in corpus past the sliding window, as a run reads it."""
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=1, seq_len=LONG))
    return load_tokens(spec, gemma3.tokenizer, bos_token_id=gemma3.bos_token_id,
                       d_vocab=gemma3.d_vocab_real, n_ctx=gemma3.n_ctx)


def test_the_file_is_read_as_what_it_is(gemma3: LoadedModel) -> None:
    spec = gemma3.spec
    assert (spec.source, spec.quantization, spec.revision) == ("gguf", "Q4_K_M",
                                                               "sha256:" + SHA256)
    cfg = gemma3.cfg
    assert gemma3.architecture == "Gemma3ForCausalLM"
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head,
            cfg.d_mlp) == (18, 640, 4, 1, 256, 2048)
    hf = gemma3.model.original_model.config  # the Hugging Face model's own, which it runs
    assert hf.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert hf.sliding_window == WINDOW
    rope = hf.rope_parameters
    thetas = (rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"])
    assert thetas == (1_000_000, 10_000)
    modules = [n for n, _ in gemma3.model.original_model.named_modules()]
    assert any(n.endswith("q_norm") for n in modules)  # qk-norm
    assert any(n.endswith("post_attention_layernorm") for n in modules)  # norms after sublayers
    # Post-sublayer norms and q/k norms: TransformerLens's blocks, not the fused ones.
    assert not gemma3.fast_path
    report = gemma3.parity
    assert report is not None
    assert report.passed
    assert report.reference == "huggingface"
    assert report.block_paths == ("bridge",) * 18
    assert report.max_abs_logprob_diff is not None
    assert report.max_abs_logprob_diff < TOL


def test_the_tokenizer_and_the_corpus(gemma3: LoadedModel, long_text: torch.Tensor) -> None:
    tok = gemma3.tokenizer
    assert len(tok) == gemma3.d_vocab == gemma3.d_vocab_real == 262_144
    assert (tok.bos_token, gemma3.bos_token_id, tok.eos_token_id, tok.pad_token_id) == \
        ("<bos>", 2, 1, 0)
    # Gemma 3's ids: its chat-template turn markers and newline; four spaces are one token.
    assert tok.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"]) == [105, 106]
    assert tok("\n    ", add_special_tokens=False).input_ids == [107, 140]
    # The tokenizer adds BOS itself; a run's stream is tokenized without it and gets exactly
    # one, prepended to each window (and as the separator between documents).
    assert tok("Hello world").input_ids == [2, 9259, 1902]
    assert tok("Hello world", add_special_tokens=False).input_ids == [9259, 1902]
    docs = builtin_corpus_documents()
    ids = tok(list(docs), add_special_tokens=False)["input_ids"]
    assert all(tok.decode(x) == d for x, d in zip(ids, docs, strict=True)), "lossless"
    assert not any(tok.unk_token_id in x or gemma3.bos_token_id in x for x in ids)
    assert long_text.shape == (1, LONG)
    assert long_text[0, 0] == gemma3.bos_token_id
    pieces = tok.decode(long_text[0, 1:].tolist()).split("<bos>")
    assert len(pieces) > 1  # the window crosses documents
    corpus = "\x00".join(docs)
    assert all(piece in corpus for piece in pieces)


def test_it_is_a_working_language_model(gemma3: LoadedModel) -> None:
    tok = gemma3.tokenizer
    prompt = torch.tensor([tok("The Eiffel Tower is in the city of").input_ids])
    assert tok.decode(strata_log_probs(gemma3, prompt)[0, -1].argmax()) == " Paris"


# The positions whose logits are compared: every position past the window, where a window or
# attention-type mistake shows, and every fourth inside it, where a rope base or norm mistake
# shows as well (every position's residual is computed either way; unembedding the 262,144-token
# vocabulary, on both sides, was most of the test's cost).
COMPARED = torch.cat([torch.arange(0, WINDOW, 4), torch.arange(WINDOW, LONG)])


@pytest.fixture(scope="module")
def hf_logits(data_dir: Path, gguf_file: Path, long_text: torch.Tensor) -> torch.Tensor:
    """The Hugging Face model's float32 logits on the long window at the `COMPARED` positions
    (its own `logits_to_keep`; the model freed after)."""
    from transformers import AutoModelForCausalLM

    checkpoint, _ = strata_gguf.dequantized_checkpoint(gguf_file)
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    assert hf.config.sliding_window == WINDOW
    with torch.inference_mode():
        logits = hf(long_text, logits_to_keep=COMPARED).logits[0]
    assert logits.shape == (len(COMPARED), 262_144)
    return logits


def _compared(ours: torch.Tensor, theirs: torch.Tensor) -> Iterator[tuple[float, float]]:
    """Per position: max |Δ log p| and KL(theirs || ours), log-softmax in float64 (by chunks:
    the 262,144-wide float64 rows of every position at once would take 3 GB)."""
    for start in range(0, ours.shape[0], 128):
        p = theirs[start:start + 128].double().log_softmax(-1)
        q = ours[start:start + 128].double().log_softmax(-1)
        diff = (p - q).abs().amax(-1)
        kl = (p.exp() * (p - q)).sum(-1)
        yield from zip(diff.tolist(), kl.tolist(), strict=True)


def test_beyond_the_sliding_window_it_matches_hugging_face(
    gemma3: LoadedModel, long_text: torch.Tensor, hf_logits: torch.Tensor
) -> None:
    with torch.inference_mode():
        resid = gemma3.embed(long_text)
        for layer in range(gemma3.n_layers):
            resid = gemma3.run_block(layer, resid).resid
        ours = gemma3.logits(resid[0, COMPARED])
    compared = list(_compared(ours, hf_logits))
    inside = int((COMPARED < WINDOW).sum())
    for name, part in (("inside", compared[:inside]), ("beyond", compared[inside:])):
        diff = max(d for d, _ in part)
        kl = sum(k for _, k in part) / len(part)
        assert diff < TOL, f"{name} the window: max |log p difference| {diff:.2e}"
        assert kl < KL_TOL, f"{name} the window: mean KL {kl:.2e}"


def test_its_parity_report_is_stored_and_served(
    gguf_file: Path, data_dir: Path, gemma3: LoadedModel, store: Store, db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registration loads the model as a run would and stores what that load measured; the
    module's model stands in for that load (a second load would cost half a minute)."""
    from service.store import registration

    def loaded(spec: ModelSpec, device: str) -> LoadedModel:
        assert spec == gemma3.spec
        return gemma3

    monkeypatch.setattr(registration, "load_model", loaded)
    settings = Settings(database=db_path, api_keys=KEY, data_dir=data_dir,
                        api=ApiSettings(checkpoint_roots=[gguf_file.parent]))
    with TestClient(create_app(settings, store)) as client:
        made = client.post("/api/v1/models", json={"source": str(gguf_file)},
                           headers={"X-API-Key": KEY})
        assert made.status_code == 201, made.text
        name = made.json()["name"]
        assert name == "gemma-3-270m-q4_k_m"
        served = client.get(f"/api/v1/models/{name}").json()
    assert (served["architecture"], served["n_layers"], served["d_vocab_real"]) == \
        ("Gemma3ForCausalLM", 18, 262_144)
    parity = served["parity"]
    assert parity["reference"] == "huggingface"
    assert parity["passed"] is True
    assert parity["dtype"] == "float32"
    assert parity["tokens"] == 64
    assert parity["block_paths"] == ["bridge"] * 18
    assert parity["max_abs_logprob_diff"] == pytest.approx(gemma3.parity.max_abs_logprob_diff)
    assert 0 <= parity["kl_to_reference"] <= parity["kl_tolerance"]
