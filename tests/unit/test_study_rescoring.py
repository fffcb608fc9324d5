"""The earlier studies' verdict tables as their scripts re-score them from the stored results
(no service): docs/study-two-families.md decided by top-1 agreement, docs/study-gemma3.md's layer
types with exact permutation p-values and Holm's correction, docs/study-head-stability.md's
table as the script wrote it."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from math import comb
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _load(name: str) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def layer_types() -> Iterator[ModuleType]:
    yield from _load("study_layer_types")


@pytest.fixture(scope="module")
def two_families() -> Iterator[ModuleType]:
    yield from _load("study_two_families")


def test_exact_permutation_p_enumerates_every_arrangement(layer_types: ModuleType) -> None:
    types = ["local"] * 18
    types[5] = types[11] = types[17] = "global"
    means = np.arange(18, dtype=float)
    means[5], means[11] = 100.0, 99.0  # the two inner global layers above all others
    p, n = layer_types.permutation_p(means, types)
    assert n == comb(16, 2) == 120
    assert p == pytest.approx(1 / 120)  # the observed arrangement is the only one as extreme
    flat = np.ones(18)
    assert layer_types.permutation_p(flat, types)[0] == 1.0  # every arrangement ties


def test_holm_against_its_definition(layer_types: ModuleType) -> None:
    assert layer_types.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert layer_types.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_gemma3_layer_types_are_exact_and_holm_corrected_in_the_doc(
        layer_types: ModuleType) -> None:
    stored = json.loads((DOCS / "study-gemma3" / "layer_types.json").read_text())
    rows = [*stored["signals"].values(), *stored["heads"].values()]
    assert len(rows) == 15
    again = json.loads(json.dumps(stored))
    layer_types.add_holm(again)
    for before, after in zip(rows, [*again["signals"].values(), *again["heads"].values()],
                             strict=True):
        assert before["p_value"] == pytest.approx(after["p_value"])
        assert before["p_holm"] == pytest.approx(after["p_holm"])
        assert before["p_value"] >= 1 / before["arrangements"]
    # with two inner global layers no Holm-adjusted p can fall below 15/120
    assert min(r["p_holm"] for r in rows) == pytest.approx(15 / 120)
    table = layer_types.markdown(stored, stored["types"]).split("\n\n")[1].strip()
    assert table in (DOCS / "study-gemma3.md").read_text()


def test_two_families_verdicts_are_decided_by_agreement(two_families: ModuleType) -> None:
    stored = json.loads((DOCS / "study-two-families" / "claims.json").read_text())
    table = two_families.claims_markdown(stored)
    assert table == (DOCS / "study-two-families" / "claims.md").read_text()
    assert table.strip() in (DOCS / "study-two-families.md").read_text()
    smol = stored["SmolLM2-135M-Instruct.Q4_1"]["agreement"]["drop"]
    gemma = stored["gemma-3-270m-q4_k_m"]["agreement"]["drop"]
    # the three verdicts that agreement changes (issue 49): SmolLM2's middle, both last layers
    assert two_families.verdict(*smol["middle_interval"], above=True) == "does not hold"
    assert two_families.verdict(*smol["last_interval"], above=False) == "holds"
    assert two_families.verdict(*gemma["last_interval"], above=False) == "holds"
    assert "defined before the results were read" not in (
        DOCS / "study-two-families.md").read_text()


def test_head_stability_doc_quotes_the_claim_table() -> None:
    table = (ROOT / "results" / "head-stability" / "claims.md").read_text().strip()
    doc = (DOCS / "study-head-stability.md").read_text()
    assert table in doc
    assert "| 2 (no layer 0) |" in table
    assert "paper studies 26 decoder-only" not in doc  # no source for it
