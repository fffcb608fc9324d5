"""The four-model study's scoring (scripts/study_four_models.py) against the registration
(docs/preregistration.md): its middle sets, its p-value and Holm's step-down, by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location(
        "study_four_models", ROOT / "scripts" / "study_four_models.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["study_four_models"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("n_layers", "drop", "swap"),
    # the registration's table: middle blocks (drop) and middle swap indices
    [
        (30, (6, 23), (6, 22)),
        (18, (4, 13), (4, 12)),
        (24, (5, 18), (5, 17)),
        (28, (6, 21), (6, 20)),
    ],
)
def test_middle_sets_are_the_registered_ones(study, n_layers, drop, swap):
    mid_drop, mid_swap = study.middle(n_layers)
    assert mid_drop == list(range(drop[0], drop[1] + 1))
    assert mid_swap == list(range(swap[0], swap[1] + 1))


def test_p_value_is_the_registered_formula(study):
    # B = 9: all positive -> 2 * (1 + 0) / 10; a tie at zero counts on both sides
    assert study.p_value(np.array([1.0] * 9)) == pytest.approx(0.2)
    assert study.p_value(np.array([-1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])) == pytest.approx(
        2 * min(1 + 2, 1 + 8) / 10
    )
    assert study.p_value(np.array([-1.0, 1.0] * 5)) == 1.0  # capped


def test_holm_steps_down_over_all_34_and_skips_untested(study):
    ps = [0.0001, 0.0015, 0.002, 0.04] + [None] * 2 + [0.5] * 28
    tests = [{"p": p, "estimate": 1.0, "sign": 1} for p in ps]
    study.holm(tests)
    # thresholds 0.05/34, 0.05/33, 0.05/32, ...: 0.0001 and 0.0015 pass, 0.002 > 0.05/32
    assert [t["rejected"] for t in tests[:4]] == [True, True, False, False]
    assert tests[0]["p_holm"] == pytest.approx(34 * 0.0001)
    assert tests[1]["p_holm"] == pytest.approx(33 * 0.0015)
    assert tests[2]["p_holm"] == pytest.approx(32 * 0.002)
    assert tests[4]["p_holm"] is None
    assert tests[4]["rejected"] is False
    assert [study.verdict(t) for t in tests[:5]] == [
        "supported",
        "supported",
        "inconclusive",
        "inconclusive",
        "not tested",
    ]
    tests[0]["estimate"] = -0.3
    assert study.verdict(tests[0]) == "not supported"
