"""A real pretrained model: SmolLM2-135M-Instruct from its 4-bit GGUF file (Llama family: RMSNorm,
rotary, grouped-query attention 9 over 3, SiLU-gated MLP, tied embeddings, 49,152 tokens).

`scripts/setup.sh` fetches the file (`scripts/fetch_smollm2.sh`, cached); without it these tests
are skipped, except in CI, where they fail. Its dequantized checkpoint is cached beside it, so
only the first run on a machine pays for dequantizing (about a minute).

- Strata's clean forward (fast blocks and TransformerLens's own) against the Hugging Face
  model's forward on the same tokens, every position's log-probabilities within 2e-4;
- the dequantized model is a working language model (Paris; in-context copying);
- `strata compute` on the GGUF file, stored: the run's identity records the file's format,
  quantization and checksum; registration over HTTP names the model by the file's stem;
- its bfloat16 numbers within the stated bounds of its float32 ones (docs/metrics.md: "bfloat16
  against float32"), where bfloat16 is native.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from litestar.testing import TestClient

from compute import gguf as strata_gguf
from compute.engine import sweep
from compute.hardware import dtype_speed_warning
from compute.metrics.base import EngineOptions
from compute.models import LoadedModel, ModelSpec, load_model, resolve_model_spec
from compute.tokens import TokenSpec, load_tokens, resolve_token_spec
from service.api.app import create_app
from service.settings import ApiSettings, Settings
from service.store import Store
from tests.integration.real_models import data_dir_beside, require_gguf
from tests.serving import run_strata
from tests.unit.test_bfloat16_bounds import outside_bounds
from tests.unit.test_hf_forward import strata_log_probs

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TOL = 2e-4
KEY = "smollm2-test-key"


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    return require_gguf(FILE, "STRATA_SMOLLM2_GGUF", "SmolLM2", "scripts/fetch_smollm2.sh")


@pytest.fixture(scope="module")
def data_dir(gguf_file: Path) -> Path:
    return data_dir_beside(gguf_file)


@pytest.fixture(scope="module")
def smollm2(gguf_file: Path, data_dir: Path) -> LoadedModel:
    return load_model(resolve_model_spec(str(gguf_file)))


def test_the_file_is_read_as_what_it_is(gguf_file: Path, smollm2: LoadedModel) -> None:
    spec = smollm2.spec
    assert (spec.source, spec.quantization, spec.revision) == ("gguf", "Q4_1",
                                                               "sha256:" + SHA256)
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_mlp) == \
        (30, 576, 9, 3, 1536)
    assert cfg.gated_mlp
    # the norms folded into the weights that read them: each keeps unit gains (TransformerLens
    # 4 keeps the module, where 3.9 made it an RMSPre)
    assert cfg.normalization_type == "RMS"
    assert smollm2.applied.fold_ln
    gain = smollm2.model.blocks[0].ln1.original_component.weight
    assert torch.equal(gain, torch.ones_like(gain))
    assert smollm2.d_vocab_real == 49_152
    assert smollm2.fast_path
    # Once dequantized, the file's header is not parsed again: what the cache recorded for
    # these bytes is what a fresh read of the header says.
    sha = strata_gguf.file_sha256(gguf_file)
    assert strata_gguf.inspect_gguf(gguf_file) == strata_gguf._read_header(gguf_file, sha)
    # Tied embeddings: before processing W_U = W_E^T. Folding the final RMSNorm's gain g and
    # centering over the vocabulary make row i of W_U equal to g_i (W_E[:, i] - its mean).
    w_e, w_u = smollm2.model.embed.W_E.detach().double(), smollm2.w_u().double()
    centered = (w_e - w_e.mean(0)).T
    cos = (w_u * centered).sum(-1) / (w_u.norm(dim=-1) * centered.norm(dim=-1))
    assert cos.abs().min().item() > 0.9999


@pytest.fixture(scope="module")
def hf_log_probs(gguf_file: Path, smollm2: LoadedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded tokens and the Hugging Face model's log-probabilities on them (the reference both
    of Strata's forwards are held to; the model is loaded once)."""
    from transformers import AutoModelForCausalLM

    checkpoint, _ = strata_gguf.dequantized_checkpoint(gguf_file)
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, smollm2.d_vocab_real, (2, 48), generator=gen)
    tokens[:, 0] = smollm2.bos_token_id
    with torch.inference_mode():
        theirs = hf(tokens).logits.double().log_softmax(-1)
    return tokens, theirs


@pytest.mark.parametrize("blocks", ["fast", "bridge"])
def test_forward_matches_hugging_face(smollm2: LoadedModel,
                                      hf_log_probs: tuple[torch.Tensor, torch.Tensor],
                                      blocks: str) -> None:
    tokens, theirs = hf_log_probs
    smollm2._ctx["fast_path"] = blocks == "fast"
    try:
        ours = strata_log_probs(smollm2, tokens)
    finally:
        smollm2._ctx.pop("fast_path")
    diff = (ours - theirs).abs().max().item()
    assert diff < TOL, f"{blocks} blocks: max |log p difference| {diff:.2e}"


def test_it_is_a_working_language_model(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    prompt = torch.tensor([tok("The Eiffel Tower is in the city of").input_ids])
    assert tok.decode(strata_log_probs(smollm2, prompt)[0, -1].argmax()) == " Paris"
    gen = torch.Generator().manual_seed(1)
    half = torch.randint(100, smollm2.d_vocab_real, (1, 64), generator=gen)
    tokens = torch.cat([torch.tensor([[smollm2.bos_token_id]]), half, half], dim=1)
    lp = strata_log_probs(smollm2, tokens)[0, :-1].gather(-1, tokens[0, 1:, None])[:, 0]
    first, second = -lp[:64].mean().item(), -lp[65:].mean().item()
    assert first > 8.0, f"loss on random tokens should be high, got {first:.2f} nats"
    assert second < 3.0, f"the repeat should be copied (induction), loss {second:.2f} nats"


def test_compute_store_and_register(gguf_file: Path, data_dir: Path, smollm2: LoadedModel,
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`strata compute` on the file computes, writes and stores a run that names the file;
    registration over HTTP loads it as a run would and stores what that load measured. The
    module's model stands in for both loads, which would be the same `load_model` of the same
    spec (held to it here; the load itself is this module's fixture, and the command's own load
    in a process of its own is the docs' first look, test_doc_commands.py)."""
    import compute.run
    from service.store import registration

    def loaded(spec: ModelSpec, device: str = "cpu") -> LoadedModel:
        assert spec == smollm2.spec
        assert device == "cpu"
        return smollm2

    monkeypatch.setattr(registration, "load_model", loaded)
    monkeypatch.setattr(compute.run, "load_model", loaded)
    db, out = tmp_path / "s.duckdb", tmp_path / "r.parquet"
    env = {"HF_HUB_OFFLINE": "1", "STRATA_DATABASE": str(db), "STRATA_DATA_DIR": str(data_dir)}
    ran = run_strata(["compute", "--model", str(gguf_file), "--metrics", "intervention,logit_lens",
                      "--n-sequences", "2", "--seq-len", "12", "--out", str(out), "--store",
                      "--quiet"], env)
    assert ran.exit_code == 0, ran.output
    frame = pl.read_parquet(out)
    drop = frame.filter((pl.col("metric") == "intervention.kl") & (pl.col("component") == "drop"))
    assert drop["layer"].to_list() == list(range(30))
    assert drop["value"].is_finite().all()
    assert (drop["value"] > 0).all()
    lens = frame.filter(pl.col("metric") == "logit_lens.kl_to_final").sort("layer")
    assert lens["value"][-1] == 0.0
    assert lens["value"][0] > lens["value"][15] > lens["value"][29]
    with Store.open(db, threads=1) as store:
        settings = Settings(database=db, api_keys=KEY, data_dir=data_dir,
                            api=ApiSettings(checkpoint_roots=[gguf_file.parent]))
        with TestClient(create_app(settings, store)) as client:
            runs = client.get("/api/v1/runs").json()["items"]
            assert len(runs) == 1
            model = client.get(f"/api/v1/runs/{runs[0]['id']}").json()["config"]["model"]
            assert model["source"] == "gguf"
            assert model["quantization"] == "Q4_1"
            assert model["revision"] == "sha256:" + SHA256
            made = client.post("/api/v1/models", json={"source": str(gguf_file)},
                               headers={"X-API-Key": KEY})
            assert made.status_code in (200, 201), made.text
            assert made.json()["name"] == Path(FILE).stem
            assert made.json()["n_layers"] == 30
            outside = tmp_path / "elsewhere.gguf"
            outside.write_bytes(b"x")
            refused = client.post("/api/v1/models", json={"source": str(outside)},
                                  headers={"X-API-Key": KEY})
            assert refused.status_code == 422, refused.text
            assert "root" in refused.json()["detail"]
    assert json.dumps(model)  # the identity is plain JSON


# --------------------------------------------------------------------------- bfloat16
# The zoo test (`tests/unit/test_bfloat16_bounds.py`) holds every family on a 4-layer model; this
# one holds the token families on a 30-layer, 49,152-token model, where bfloat16's rounding has 30
# blocks to accumulate through and a vocabulary twelve times the zoo's, on 2 x 32 tokens of the
# built-in corpus (text, as a run reads: on uniformly random ids the model's distributions are far
# from anything it was trained on, and a KL moves by up to 8% between dtypes). Neurons (weights
# only) and heads (270 ablations) are left to the zoo test and to the default-run comparison of
# docs/performance.md ("bfloat16: where it is fast, and the default dtype"): on SmolLM2 they cost
# more than the test budget. The float32 side is this module's model (the same `load_model` of the
# same spec); the bfloat16 side is loaded as a run in bfloat16 loads it.
#
# Where bfloat16 is emulated (a CPU without AMX or AVX512-BF16: `compute.hardware` measures it) the
# test is skipped: there the bfloat16 sweep runs ~100x slower than float32's, about an hour for
# these tokens on 2 cores.
BFLOAT16_FAMILIES = ["intervention", "logit_lens", "similarity", "attention", "norms"]


@pytest.mark.skipif(
    dtype_speed_warning("bfloat16") is not None,
    reason="bfloat16 is emulated on this CPU (compute.hardware; no AMX / AVX512-BF16): "
    "the bfloat16 half of this test would take about an hour here",
)
def test_smollm2_in_bfloat16_is_within_the_stated_bounds_of_float32(
    gguf_file: Path, smollm2: LoadedModel
) -> None:
    assert smollm2.spec == resolve_model_spec(str(gguf_file), dtype="float32")
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=2, seq_len=32))
    tokens = load_tokens(spec, smollm2.tokenizer, bos_token_id=smollm2.bos_token_id,
                         d_vocab=smollm2.d_vocab_real, n_ctx=smollm2.n_ctx)
    full = sweep(smollm2, tokens, BFLOAT16_FAMILIES, EngineOptions()).records
    low_lm = load_model(resolve_model_spec(str(gguf_file), dtype="bfloat16"))
    low = sweep(low_lm, tokens, BFLOAT16_FAMILIES, EngineOptions()).records
    problems = outside_bounds(full, low, smollm2.d_mlp, tokens=2 * 30)
    assert not problems, f"{len(problems)} records outside the bounds:\n" + "\n".join(problems[:30])
