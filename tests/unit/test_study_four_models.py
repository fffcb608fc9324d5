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


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    # the registration: supported if all three out-of-sample models are, not supported if any
    # is not, inconclusive otherwise (undecided while one is untested and none is "not")
    [
        (("supported", "supported", "supported"), "supported"),
        (("supported", "not supported", "not tested"), "not supported"),
        (("inconclusive", "supported", "supported"), "inconclusive"),
        (("inconclusive", "supported", "not tested"), "not tested"),
    ],
)
def test_universality_is_the_registered_rule(study, verdicts, expected):
    models = ("Gemma 3 270M", "Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct")
    per_model = {
        m: {"stages": {"verdict": v}} if v != "not tested" else {}
        for m, v in zip(models, verdicts, strict=True)
    }
    per_model["SmolLM2-135M-Instruct"] = {"stages": {"verdict": "not supported"}}  # in sample
    got = study.universality(per_model)
    assert got["verdict"] == expected
    assert got["tested"] == sum(v != "not tested" for v in verdicts)


def test_a_neurons_run_of_another_checkpoint_is_refused(study, tmp_path, monkeypatch):
    """The stage rule may read a run's neuron counts from a run of the neurons family alone,
    only if it is of the same checkpoint, dtype and weight processing."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path, revision, metric):
        model = {"revision": revision, "dtype": "float32", "processing": {}, "quantization": "Q",
                 "source": "gguf"}
        table = pa.table({"metric": [metric], "layer": [0], "value": [1.0]})
        table = table.replace_schema_metadata({"strata": json.dumps({"config": {"model": model}})})
        pq.write_table(table, path)

    folder = tmp_path / "results" / "m"
    folder.mkdir(parents=True)
    write(folder / "run.parquet", "sha256:a", "intervention.kl")
    write(folder / "run.sequence_means.parquet", "sha256:a", "intervention.kl")
    write(folder / "neurons-float32.parquet", "sha256:b", "neurons.n_prediction_cal")
    monkeypatch.setattr(study, "ROOT", tmp_path)
    model = study.Model("M", "m", "run", 4, "Q", "confirmatory")
    with pytest.raises(SystemExit, match="not the model"):
        study.load_run(model)
    write(folder / "neurons-float32.parquet", "sha256:a", "neurons.n_prediction_cal")
    records, _ = study.load_run(model)
    assert sorted(records["metric"].to_list()) == ["intervention.kl", "neurons.n_prediction_cal"]
