"""`strata stability` on shipped refits and `strata stages` on computed results, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from compute.models import zoo_names
from service.cli import main

pytestmark = pytest.mark.skipif(
    not {"tiny-4l-s0", "tiny-4l-s1", "tiny-2l-s0"} <= set(zoo_names()),
    reason="zoo models not built")


def test_stability_of_two_trained_refits(tmp_path: Path) -> None:
    out = tmp_path / "stability.json"
    result = CliRunner().invoke(main, [
        "stability", "--family", "zoo:tiny-4l-s0", "--family", "zoo:tiny-4l-s1",
        "--anchor", "tiny-4l-s0", "--n-prompts", "4", "--prompt-len", "32", "--n-null", "1",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    body = json.loads(out.read_text())
    frame = pl.DataFrame(body["records"]).cast({"layer": pl.Int32, "head": pl.Int32})
    per_layer = frame.filter(pl.col("head").is_null())
    for metric in ("heads.stability", "heads.stability_std", "heads.stability_null",
                   "heads.residual_cka.linear", "heads.residual_cka.rbf"):
        rows = per_layer.filter(pl.col("metric") == metric).sort("layer")
        assert rows["layer"].to_list() == [0, 1, 2, 3], metric
        assert rows["value"].is_between(0.0, 1.0 + 1e-9).all(), metric
    per_head = frame.filter((pl.col("metric") == "heads.stability")
                            & pl.col("head").is_not_null())
    assert per_head.height == 4 * 4
    assert body["run"]["anchor"]["name"] == "tiny-4l-s0"


def test_a_family_given_as_a_list_of_model_references(tmp_path: Path) -> None:
    """A seed suite named model by model (as PolyPythias' `EleutherAI/pythia-160m-seed1,...`
    would be with the hub): here two local checkpoint folders, comma-separated, and the same
    family as one folder of folders give the same records."""
    import shutil

    from compute.zoo.paths import zoo_path

    suite = tmp_path / "suite"
    for name in ("tiny-4l-s0", "tiny-4l-s1"):
        shutil.copytree(zoo_path(name), suite / name)
    opts = ["--n-prompts", "2", "--prompt-len", "16", "--n-null", "1"]
    listed, folder = tmp_path / "listed.json", tmp_path / "folder.json"
    refs = f"{suite / 'tiny-4l-s0'},{suite / 'tiny-4l-s1'}"
    one = CliRunner().invoke(main, ["stability", "--family", refs, *opts, "--out", str(listed)])
    assert one.exit_code == 0, one.output
    two = CliRunner().invoke(main, ["stability", "--family", str(suite), *opts,
                                    "--out", str(folder)])
    assert two.exit_code == 0, two.output
    a, b = json.loads(listed.read_text()), json.loads(folder.read_text())
    assert [m["name"] for m in a["run"]["family"]] == [str(suite / "tiny-4l-s0"),
                                                      str(suite / "tiny-4l-s1")]
    assert a["records"] == b["records"]


def test_stability_refuses_a_family_of_one_and_an_unknown_anchor(tmp_path: Path) -> None:
    runner = CliRunner()
    alone = runner.invoke(main, ["stability", "--family", "zoo:tiny-4l-s0",
                                 "--out", str(tmp_path / "a.json")])
    assert alone.exit_code == 2
    assert "at least two" in alone.output
    wrong = runner.invoke(main, ["stability", "--family", "zoo:tiny-4l-s0", "--family",
                                 "zoo:tiny-4l-s1", "--anchor", "nope",
                                 "--out", str(tmp_path / "b.json")])
    assert wrong.exit_code == 2
    assert "--anchor" in wrong.output
    mixed = runner.invoke(main, ["stability", "--family", "zoo:tiny-4l-s0", "--family",
                                 "zoo:tiny-2l-s0", "--n-prompts", "2", "--prompt-len", "16",
                                 "--out", str(tmp_path / "c.json")])
    assert mixed.exit_code == 2
    assert "architecture" in mixed.output
    assert list(tmp_path.iterdir()) == []


def test_stages_from_computed_results(tmp_path: Path) -> None:
    runner = CliRunner()
    results = tmp_path / "r.parquet"
    computed = runner.invoke(main, ["compute", "--model", "zoo:tiny-4l-s0", "--n-sequences", "4",
                                    "--seq-len", "32", "--metrics",
                                    "intervention,logit_lens,neurons", "--quiet",
                                    "--out", str(results)])
    assert computed.exit_code == 0, computed.output
    printed = runner.invoke(main, ["stages", "--results", str(results)])
    assert printed.exit_code == 0, printed.output
    body = json.loads(printed.output[printed.output.index("{"):])
    assert body["n_layers"] == 4
    assert [b["boundary"] for b in body["boundaries"]] == [1, 2, 3]
    for b in body["boundaries"]:
        assert b["clear"] == (b["layer"] is not None)
        assert b["rule"]
        assert b["evidence"]
    # The shipped 4-layer model's layer-0 drop is catastrophic: boundary 1 is placed.
    assert body["boundaries"][0]["clear"]
    # the per-sequence means beside the results give each placed boundary its interval
    assert (tmp_path / "r.sequence_means.parquet").exists()
    first = body["boundaries"][0]["evidence"]
    assert first["bootstrap"]["n_sequences"] == 4
    assert first["interval"][0] <= body["boundaries"][0]["layer"] <= first["interval"][1]
    out = tmp_path / "stages.csv"
    written = runner.invoke(main, ["stages", "--results", str(results), "--out", str(out)])
    assert written.exit_code == 0, written.output
    rows = pl.read_csv(out)
    clear = [b for b in body["boundaries"] if b["clear"]]
    assert rows.height == len(clear)
    assert set(rows["metric"]) <= {"stages.boundary_1", "stages.boundary_2", "stages.boundary_3"}
    missing = runner.invoke(main, ["stages", "--results", str(tmp_path / "none.parquet")])
    assert missing.exit_code == 2
