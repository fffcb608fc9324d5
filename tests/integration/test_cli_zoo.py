"""`strata zoo train`: one checkpoint per seed, sharing one tokenizer, loadable offline."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from compute.models import load_model, resolve_model_spec
from service.cli import main


def test_zoo_train_writes_one_loadable_refit_per_seed(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "zoo", "train", "--name", "fam-x", "--n-layers", "1", "--d-model", "16", "--n-heads",
        "2", "--n-ctx", "16", "--seeds", "0,1", "--optimizer", "adam", "--steps", "2",
        "--batch-size", "2", "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fam-x-s0", "fam-x-s1"]
    metas = [json.loads((tmp_path / n / "strata_zoo.json").read_text())
             for n in ("fam-x-s0", "fam-x-s1")]
    assert [m["config"]["seed"] for m in metas] == [0, 1]
    assert all(m["config"]["optimizer"] == "adam" for m in metas)
    tokenizers = {(tmp_path / n / "tokenizer.json").read_text() for n in ("fam-x-s0", "fam-x-s1")}
    assert len(tokenizers) == 1
    lm = load_model(resolve_model_spec(str(tmp_path / "fam-x-s1")))
    assert (lm.n_layers, lm.d_model) == (1, 16)


def test_zoo_train_refuses_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    seeds = runner.invoke(main, ["zoo", "train", "--seeds", "x", "--out-dir", str(tmp_path)])
    assert seeds.exit_code == 2
    assert "comma-separated integers" in seeds.output
    heads = runner.invoke(main, ["zoo", "train", "--d-model", "30", "--n-heads", "4",
                                 "--out-dir", str(tmp_path)])
    assert heads.exit_code == 2
    assert "not divisible" in heads.output
    assert list(tmp_path.iterdir()) == []
