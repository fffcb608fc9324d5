"""The engine (`compute.engine.sweep`) against the slow, obvious reference (`tests/reference.py`).

Every family, every record: the same keys (metric, layer, component, head, neuron), the same n
and unit, and value and stderr within 1e-4 (absolute, or relative for values above 1; the model
runs in float32, the reference reduces in float64). Models: GPT-2-style random (LayerNorm,
sequential), GPT-NeoX from a Hugging Face checkpoint (rotary, parallel attention/MLP), a random
rotary/parallel model, RMSNorm with a gated MLP, attention-only, an unprocessed GPT-2 checkpoint
whose tokenizer is smaller than W_U, a wide vocabulary that forces the engine's row chunking, a
batch size that does not divide the number of sequences, and the trained zoo models when built.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

from compute.engine import SweepResult, sweep
from compute.metrics.base import EngineOptions
from compute.models import zoo_names
from compute.tokens import windows_fingerprint
from tests import reference

FAMILIES = list(reference.FAMILIES)
TOL = 1e-4
OPTS = dict(induction_n=8, induction_sequences=3, induction_seed=7, top_neurons=3, top_tokens=4)

Key = tuple[str, int | None, str | None, int | None, int | None]
pytestmark = pytest.mark.usefixtures("single_torch_thread")


Loader = Callable[[dict[str, Callable[..., Any]], pytest.FixtureRequest], Any]


@dataclass
class Case:
    """A model, a token batch and the engine options of one comparison."""

    load: Loader
    n_sequences: int = 3
    seq_len: int = 20
    batch_size: int | None = 2
    options: dict[str, Any] = field(default_factory=dict)


def _random(seed: int = 1, processing: dict[str, bool] | None = None, **arch: Any) -> Loader:
    return lambda f, request: f["random"](seed=seed, processing=processing, **arch)


def _hf(fixture: str, processing: dict[str, bool] | None = None) -> Loader:
    return lambda f, request: f["checkpoint"](request.getfixturevalue(fixture), processing)


def _zoo(name: str) -> Loader:
    def load(f: dict[str, Callable[..., Any]], request: pytest.FixtureRequest) -> Any:
        if name not in zoo_names():
            pytest.skip(f"zoo model {name} is not built yet")
        return f["checkpoint"](f"zoo:{name}")
    return load


UNPROCESSED = dict(fold_ln=False, center_writing_weights=False, center_unembed=False,
                   fold_value_biases=False)
CASES: dict[str, Case] = {
    "gpt2-random": Case(_random(), batch_size=3),
    "gpt2-random-ragged-batch": Case(_random(seed=2), n_sequences=5, seq_len=16, batch_size=2),
    "gpt2-random-auto-batch": Case(_random(seed=3, n_layers=2), n_sequences=2, seq_len=12,
                                   batch_size=None),
    "neox-hf": Case(_hf("hf_neox_dir")),
    # Llama: RMSNorm, rotary, grouped-query attention (4 query heads over 2 key/value heads),
    # SiLU-gated MLP, tied embeddings; GPT-Neo: a local-attention layer with window 4 < seq_len.
    "llama-hf": Case(_hf("hf_llama_dir")),
    "neo-hf-local-attention": Case(_hf("hf_neo_dir"), n_sequences=2),
    # (parallel attention/MLP: the GPT-NeoX checkpoint; TransformerLens 4's native blocks are
    # sequential)
    "rotary-random": Case(_random(seed=4, positional_embedding_type="rotary", rotary_dim=4)),
    "rms-gated-random": Case(_random(seed=5, normalization_type="RMS", gated_mlp=True,
                                     act_fn="silu", n_layers=2)),
    "attn-only-random": Case(_random(seed=6, attn_only=True, n_layers=2)),
    "gpt2-hf-unprocessed": Case(_hf("hf_gpt2_dir", UNPROCESSED), seq_len=19),
    "gpt2-hf-processed": Case(_hf("hf_gpt2_dir"), n_sequences=2, seq_len=19, batch_size=1),
    # chunk_mb=1 on a CPU makes logits in blocks of 256 rows x 1024 columns (20,000 columns:
    # 19 full blocks and a ragged one); logits_budget_mb=8 takes 34 neurons per chunk of the
    # neurons family.
    "wide-vocab-chunked": Case(_random(seed=8, n_layers=2, d_model=16, n_heads=2, d_mlp=32,
                                       d_vocab=20_000), n_sequences=2, seq_len=32, batch_size=2,
                               options=dict(logits_budget_mb=8, chunk_mb=1)),
    # Comparisons reduced by the compiled kernel (compute.reduce.fused_block_terms), as long
    # CPU runs do; 20,000 columns in ragged blocks of 256 rows.
    "llama-hf-fused-reductions": Case(_hf("hf_llama_dir"),
                                      options=dict(fuse_reductions=True)),
    "wide-vocab-fused-reductions": Case(_random(seed=8, n_layers=2, d_model=16, n_heads=2,
                                                d_mlp=32, d_vocab=20_000), n_sequences=2,
                                        seq_len=32, batch_size=2,
                                        options=dict(chunk_mb=1, fuse_reductions=True)),
    "zoo-tiny-2l-s0": Case(_zoo("tiny-2l-s0"), n_sequences=2, seq_len=24),
    "zoo-tiny-4l-s0": Case(_zoo("tiny-4l-s0"), n_sequences=2, seq_len=24),
}


@dataclass
class Swept:
    lm: Any
    tokens: torch.Tensor
    opts: EngineOptions
    result: SweepResult

    @cached_property
    def inputs(self) -> str:
        """`inputs_fingerprint` of the model and tokens: made once per case, when first asked."""
        return inputs_fingerprint(self.lm, self.tokens)


@pytest.fixture(scope="module", params=list(CASES))
def swept(request: pytest.FixtureRequest, tiny_factories: dict[str, Callable[..., Any]]) -> Swept:
    case = CASES[request.param]
    lm = case.load(tiny_factories, request)
    tokens = tiny_factories["tokens"](case.n_sequences, case.seq_len, lm.d_vocab_real,
                                      lm.bos_token_id, seed=11)
    opts = EngineOptions(batch_size=case.batch_size, **{**OPTS, **case.options})
    return Swept(lm, tokens, opts, sweep(lm, tokens, FAMILIES, opts))


# --------------------------------------------------------------------------- comparison


def _key(row: dict[str, Any]) -> Key:
    return (row["metric"], row["layer"], row["component"], row["head"], row["neuron"])


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(b))


def mismatches(engine_rows: list[dict[str, Any]], reference_rows: pl.DataFrame) -> list[str]:
    """Every difference between two record sets, described (empty when they agree)."""
    engine = {_key(r): r for r in engine_rows}
    ref = {_key(r): r for r in reference_rows.iter_rows(named=True)}
    problems = [f"engine only: {k}" for k in sorted(set(engine) - set(ref), key=str)]
    problems += [f"reference only: {k}" for k in sorted(set(ref) - set(engine), key=str)]
    for k in sorted(set(engine) & set(ref), key=str):
        e, r = engine[k], ref[k]
        if not _close(e["value"], r["value"]):
            problems.append(f"{k}: value engine={e['value']!r} reference={r['value']!r}")
        if (e["stderr"] is None) != (r["stderr"] is None) or (
                e["stderr"] is not None and not _close(e["stderr"], r["stderr"])):
            problems.append(f"{k}: stderr engine={e['stderr']!r} reference={r['stderr']!r}")
        if e["n"] != r["n"]:
            problems.append(f"{k}: n engine={e['n']} reference={r['n']}")
        if e["unit"] != r["unit"]:
            problems.append(f"{k}: unit engine={e['unit']} reference={r['unit']}")
    return problems


def _engine_rows(result: SweepResult, family: str) -> list[dict[str, Any]]:
    return [asdict(r) for r in result.records if r.metric.startswith(f"{family}.")]


def assert_same(engine_rows: list[dict[str, Any]], reference_rows: pl.DataFrame) -> None:
    problems = mismatches(engine_rows, reference_rows)
    assert not problems, f"{len(problems)} differences:\n" + "\n".join(problems[:40])


SequenceKey = tuple[str, int | None, str | None, int | None, int]


def assert_same_sequence_means(result: SweepResult, family: str,
                               expected: pl.DataFrame) -> None:
    """The engine's per-sequence means of one family against the reference's: the same
    (metric, layer, component, head, sequence) keys, values within the tolerance."""
    def keyed(frame: pl.DataFrame) -> dict[SequenceKey, float]:
        return {(r["metric"], r["layer"], r["component"], r["head"], r["sequence"]): r["value"]
                for r in frame.iter_rows(named=True) if r["metric"].startswith(f"{family}.")}

    got, want = keyed(pl.from_arrow(result.sequence_means)), keyed(expected)  # type: ignore[arg-type]
    assert sorted(got, key=str) == sorted(want, key=str)
    bad = [(k, got[k], want[k]) for k in want if not _close(got[k], want[k])]
    assert not bad, bad[:20]


# --------------------------------------------------------------------------- the tests


# The reference's rows are a function of the weights, the tokens, the family and the knobs it
# reads (`reference.ReferenceOptions`) alone. Cases that differ only in how the engine computes
# (llama-hf and its fused reductions, the wide vocabulary chunked and fused) hold their engine
# to the same reference rows, computed once per process.
_REFERENCE_ROWS: dict[tuple[str, str, str], list[dict[str, Any]]] = {}


def inputs_fingerprint(lm: Any, tokens: torch.Tensor) -> str:
    """What the reference reads of a case, hashed: the model's config, every weight as loaded
    and processed, and the token windows (`windows_fingerprint`)."""
    digest = hashlib.sha256(repr(lm.model.cfg).encode())
    for name, tensor in sorted(lm.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8)
                      .numpy().tobytes())
    digest.update(windows_fingerprint(tokens).encode())
    return digest.hexdigest()


def reference_rows_once(swept: Swept, family: str) -> list[dict[str, Any]]:
    """The reference's rows of one family for a case, made once per process for the same
    inputs, family and reference knobs."""
    knobs = repr([getattr(swept.opts, f.name) for f in fields(reference.ReferenceOptions)])
    key = (swept.inputs, family, knobs)
    if key not in _REFERENCE_ROWS:
        _REFERENCE_ROWS[key] = reference.reference_rows(swept.lm, swept.tokens, [family],
                                                        swept.opts)
    return _REFERENCE_ROWS[key]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_reference(swept: Swept, family: str) -> None:
    """Records (value, stderr over sequences, n = sequences) and the per-sequence means."""
    rows = reference_rows_once(swept, family)
    expected = reference.to_frame(rows)
    assert expected.height > 0 or (family == "neurons" and not swept.lm.has_mlp)
    assert_same(_engine_rows(swept.result, family), expected)
    assert_same_sequence_means(swept.result, family, reference.sequence_frame(rows))


def test_neuron_tokens_match_reference(swept: Swept) -> None:
    """The same top neurons per class and the same top tokens (row order is not a contract)."""
    fields = ("layer", "neuron_class", "neuron", "direction", "rank", "token_id")
    expected = {tuple(e[f] for f in fields): e["cosine"]
                for e in reference.neuron_token_rows(swept.lm, swept.opts)}
    got = {tuple(getattr(t, f) for f in fields): t.cosine for t in swept.result.neuron_tokens}
    assert sorted(got) == sorted(expected)
    assert all(_close(got[k], expected[k]) for k in expected)


def test_tokens_evaluated(swept: Swept) -> None:
    n, t = swept.tokens.shape
    assert swept.result.tokens_evaluated == n * (t - 2)


@pytest.mark.parametrize("seq_len", [3, 4, 17, 18])
def test_attention_near_the_shortest_sequences(
        seq_len: int, tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """prev_k with k close to seq_len: only k <= seq_len-3 has an evaluated query q > k.

    seq_len 3 is the shortest the engine accepts; 17 and 18 sit just above the default k = 16.
    """
    lm = tiny_factories["random"](seed=9, n_layers=2)
    tokens = tiny_factories["tokens"](2, seq_len, lm.d_vocab_real, lm.bos_token_id, seed=3)
    opts = EngineOptions(batch_size=2)
    result = sweep(lm, tokens, ["attention"], opts)
    assert_same(_engine_rows(result, "attention"),
                reference.reference_sweep(lm, tokens, ["attention"], opts))


def test_head_ablation_in_groups_of_heads(tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Wide activations make the engine ablate heads a few at a time (here groups of 2, 2, 1
    for the first batch of 4 sequences, one group for the last, single-sequence batch)."""
    lm = tiny_factories["random"](seed=12, n_layers=1, d_model=512, n_heads=5, d_head=64,
                                  d_mlp=64)
    tokens = tiny_factories["tokens"](5, 64, lm.d_vocab_real, lm.bos_token_id, seed=5)
    opts = EngineOptions(batch_size=4, logits_budget_mb=8, **OPTS)
    per_variant = 4 * 64 * lm.d_model * 4 * 8
    assert opts.logits_budget_mb * 2**20 // per_variant == 2  # what heads.py computes
    result = sweep(lm, tokens, ["heads"], opts)
    assert_same(_engine_rows(result, "heads"),
                reference.reference_sweep(lm, tokens, ["heads"], opts))


def test_weights_edited_after_a_sweep_are_the_weights_analysed(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """Interpretability code edits weights in place, often through `.data` (which bumps no
    autograd version counter). The next sweep must analyse the edited model, not a cache."""
    lm = tiny_factories["random"](seed=13, n_layers=2)
    tokens = tiny_factories["tokens"](2, 12, lm.d_vocab_real, lm.bos_token_id, seed=6)
    opts = EngineOptions(batch_size=2, **OPTS)
    families = ["intervention", "logit_lens"]
    sweep(lm, tokens, families, opts)
    with torch.no_grad():
        lm.model.unembed.W_U.data.mul_(3.0)
        lm.model.blocks[1].mlp.W_out.data.mul_(2.0)
    result = sweep(lm, tokens, families, opts)
    assert_same([asdict(r) for r in result.records],
                reference.reference_sweep(lm, tokens, families, opts))


def test_single_sequence_has_no_stderr(
        tiny_factories: dict[str, Callable[..., Any]]) -> None:
    """One sequence (of length 3: one token) is one unit of uncertainty: n = 1 and stderr is
    null, not 0 or NaN."""
    lm = tiny_factories["random"](seed=10, n_layers=2)
    tokens = tiny_factories["tokens"](1, 3, lm.d_vocab_real, lm.bos_token_id, seed=4)
    families = ["intervention", "logit_lens", "similarity", "norms"]
    opts = EngineOptions(**OPTS)
    result = sweep(lm, tokens, families, opts)
    expected = reference.reference_sweep(lm, tokens, families, opts)
    assert_same([asdict(r) for r in result.records], expected)
    assert all(r.n == 1 and r.stderr is None for r in result.records)


def test_reference_is_independent_of_the_engine() -> None:
    """The reference must not share code with what it checks."""
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    shared = {m for m in imported if m.startswith(("compute.metrics", "compute.reduce",
                                                   "compute.engine"))}
    assert not shared
