"""SmolLM2-135M's bfloat16 numbers held to its float32 ones within the stated bounds
(docs/metrics.md: "bfloat16 against float32"), on the real pretrained weights.

The zoo test (`tests/unit/test_bfloat16_bounds.py`) holds every family on a 4-layer model; this
one holds the token families on a 30-layer, 49,152-token model, where bfloat16's rounding has 30
blocks to accumulate through and a vocabulary twelve times the zoo's, on 2 x 32 tokens of the
built-in corpus (text, as a run reads: on uniformly random ids the model's distributions are far
from anything it was trained on, and a KL moves by up to 8% between dtypes). Neurons (weights
only) and heads (270 ablations) are left to the zoo test and to the default-run comparison of
docs/performance.md ("bfloat16: where it is fast, and the default dtype"): on SmolLM2 they cost
more than the test budget.

Where bfloat16 is emulated (a CPU without AMX or AVX512-BF16: `compute.hardware` measures it) the
test is skipped: there the bfloat16 sweep runs ~100x slower than float32's, about an hour for
these tokens on 2 cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from compute.engine import sweep
from compute.hardware import dtype_speed_warning
from compute.metrics.base import EngineOptions
from compute.models import load_model, resolve_model_spec
from compute.records import Record
from compute.tokens import TokenSpec, load_tokens, resolve_token_spec
from tests.integration.test_smollm2 import data_dir, gguf_file  # noqa: F401 (fixtures)
from tests.unit.test_bfloat16_bounds import outside_bounds

FAMILIES = ["intervention", "logit_lens", "similarity", "attention", "norms"]


def _swept(gguf: Path, dtype: str, tokens: torch.Tensor | None) -> tuple[list[Record], int, Any]:
    lm = load_model(resolve_model_spec(str(gguf), dtype=dtype))  # type: ignore[arg-type]
    if tokens is None:
        spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=2, seq_len=32))
        tokens = load_tokens(spec, lm.tokenizer, bos_token_id=lm.bos_token_id,
                             d_vocab=lm.d_vocab_real, n_ctx=lm.n_ctx)
    return sweep(lm, tokens, FAMILIES, EngineOptions()).records, lm.d_mlp, tokens


@pytest.mark.usefixtures("data_dir")
@pytest.mark.skipif(
    dtype_speed_warning("bfloat16") is not None,
    reason="bfloat16 is emulated on this CPU (compute.hardware; no AMX / AVX512-BF16): "
    "the bfloat16 half of this test would take about an hour here",
)
def test_smollm2_in_bfloat16_is_within_the_stated_bounds_of_float32(gguf_file: Path) -> None:  # noqa: F811
    full, d_mlp, tokens = _swept(gguf_file, "float32", None)
    low, _, _ = _swept(gguf_file, "bfloat16", tokens)
    problems = outside_bounds(full, low, d_mlp, tokens=2 * 30)
    assert not problems, f"{len(problems)} records outside the bounds:\n" + "\n".join(problems[:30])
