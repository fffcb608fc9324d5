"""`strata compute` end to end: outputs in every format, and bad input refused cleanly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from compute.models import zoo_names
from compute.records import RECORD_COLUMNS
from service.cli import main
from tests import launcher
from tests.serving import run_strata

MODEL = "zoo:tiny-2l-s0"
pytestmark = pytest.mark.skipif("tiny-2l-s0" not in zoo_names(), reason="zoo model not built")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return launcher.run(args, env, timeout=600)


def test_compute_writes_every_format_with_the_same_rows(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    proc = run_cli("compute", "--model", MODEL, "--n-sequences", "3", "--seq-len", "24",
                   "--metrics", "intervention,logit_lens,norms,neurons", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "tok/s" in proc.stderr  # the progress bar reports throughput
    frame = pl.read_parquet(out)
    assert tuple(frame.columns) == RECORD_COLUMNS
    kl = frame.filter((pl.col("metric") == "intervention.kl") & (pl.col("component") == "drop"))
    assert kl["layer"].to_list() == [0, 1]
    assert (kl["value"] > 0).all()
    # n counts sequences (the unit of uncertainty); the token count travels with the run
    assert (frame.filter(pl.col("metric") == "intervention.kl")["n"] == 3).all()
    meta = json.loads(pq.read_schema(out).metadata[b"strata"])
    assert meta["tokens_evaluated"] == 3 * 22
    assert meta["stderr_basis"] == "sequence"
    # where the run's time went: the load, the clean passes and each family, within its wall
    timings = meta["timings_s"]
    assert set(timings) == {"load", "clean_pass", "intervention", "logit_lens", "norms",
                            "neurons"}
    assert all(t >= 0 for t in timings.values())
    assert timings["intervention"] > 0
    assert timings["load"] > 0
    assert sum(timings.values()) <= meta["wall_s"] + 1e-3
    # and the peak memory it reached: the process held torch and the model's weights at least
    memory = meta["memory"]
    assert memory["host_peak_scope"] == "run"
    assert memory["host_peak_rss_mib"] > 100
    assert memory["device_peak_allocated_mib"] is None
    side = tmp_path / "r.neuron_tokens.parquet"
    assert side.exists()
    assert pl.read_parquet(side).height > 0
    per_sequence = pl.read_parquet(tmp_path / "r.sequence_means.parquet")
    drop = per_sequence.filter((pl.col("metric") == "intervention.kl")
                               & (pl.col("component") == "drop") & (pl.col("layer") == 0))
    assert drop["sequence"].sort().to_list() == [0, 1, 2]
    assert drop["value"].mean() == pytest.approx(kl["value"][0], rel=1e-9)

    runner = CliRunner()
    for suffix in (".json", ".csv"):
        other = tmp_path / f"r{suffix}"
        result = runner.invoke(main, ["compute", "--model", MODEL, "--n-sequences", "3",
                                      "--seq-len", "24", "--metrics",
                                      "intervention,logit_lens,norms,neurons", "--quiet",
                                      "--out", str(other)])
        assert result.exit_code == 0, result.output
        if suffix == ".json":
            body = json.loads(other.read_text())
            assert body["run"]["config"]["model"]["name"] == "tiny-2l-s0"
            got = pl.DataFrame(body["records"])
        else:
            got = pl.read_csv(other)
        assert got.height == frame.height
        got = got.cast({c: frame.schema[c] for c in frame.columns})
        joined = frame.join(got, on=["metric", "layer", "component", "head", "neuron"],
                            nulls_equal=True, suffix="_o")
        assert joined.height == frame.height
        assert ((joined["value"] - joined["value_o"]).abs() < 1e-9).all()


def test_compute_store_keeps_the_per_sequence_means(tmp_path: Path) -> None:
    """`strata compute --store`: the run's per-sequence means land in the store beside its
    records (what a bootstrap over sequences reads back)."""
    from service.store import Store
    from service.store import repositories as repo

    db = tmp_path / "s.duckdb"
    env = {"STRATA_DATABASE": str(db), "STRATA_DATA_DIR": str(tmp_path / "state")}
    result = run_strata(["compute", "--model", MODEL, "--n-sequences", "4", "--seq-len", "16",
                         "--metrics", "intervention", "--store", "--quiet"], env)
    assert result.exit_code == 0, result.output
    with Store.open(db, threads=1) as store, store.read() as conn:
        [run] = repo.list_runs(conn)
        means = repo.sequence_means(conn, run.id, ["intervention.swap_minus_drop_kl"])
        records = repo.rows_of_runs(conn, [run.id], ["intervention.swap_minus_drop_kl"])
    assert run.metric_version == "2"
    assert means.height == 4  # one swap (layers 0, 1) of a 2-layer model x 4 sequences
    assert records["n"].to_list() == [4]
    assert means["value"].mean() == pytest.approx(records["value"][0], rel=1e-9)


def _npy(tmp_path: Path, array: np.ndarray) -> str:
    path = tmp_path / "t.npy"
    np.save(path, array)
    return str(path)


@pytest.mark.parametrize(("case", "expected"), [
    ("unknown_model", "unknown model"),
    ("missing_tokens", "t-missing.npy"),
    ("garbage_tokens", "cannot"),
    ("ids_too_large", "vocab"),
    ("seq_len_too_long", "n_ctx"),
    ("unknown_metric", "unknown metric famil"),
    ("bad_out_suffix", "unknown format"),
    ("zero_tokens_per_batch", "--tokens-per-batch"),
    ("tiny_memory_budget", "--memory-budget-mb"),
])
def test_bad_input_exits_nonzero_with_a_message_and_no_output(
        tmp_path: Path, case: str, expected: str) -> None:
    out = tmp_path / "out.parquet"
    args = ["compute", "--model", MODEL, "--n-sequences", "2", "--seq-len", "16", "--quiet"]
    if case == "unknown_model":
        args[2] = "no-such-model-anywhere"
    elif case == "missing_tokens":
        args += ["--tokens", str(tmp_path / "t-missing.npy")]
    elif case == "garbage_tokens":
        bad = tmp_path / "bad.npy"
        bad.write_bytes(b"not a numpy file")
        args += ["--tokens", str(bad)]
    elif case == "ids_too_large":
        args += ["--tokens", _npy(tmp_path, np.full((2, 16), 10**6, dtype=np.int64))]
    elif case == "seq_len_too_long":
        args[args.index("--seq-len") + 1] = "100000"
    elif case == "unknown_metric":
        args += ["--metrics", "intervention,telepathy"]
    elif case == "bad_out_suffix":
        out = tmp_path / "out.xlsx"
    elif case == "zero_tokens_per_batch":
        args += ["--tokens-per-batch", "0"]
    elif case == "tiny_memory_budget":
        args += ["--memory-budget-mb", "1"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert expected in result.output.lower() or expected in str(result.stderr_bytes or b"")
    assert list(tmp_path.glob("out*")) == []


def test_npy_tokens_are_used_exactly_as_given(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 4000, (2, 12))
    tokens[:, 0] = 0
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["compute", "--model", MODEL, "--tokens",
                                       _npy(tmp_path, tokens), "--metrics", "logit_lens",
                                       "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    body = json.loads(out.read_text())
    assert body["run"]["tokens_evaluated"] == 2 * 10
    assert body["run"]["config"]["tokens"]["n_sequences"] == 2
    assert body["run"]["config"]["tokens"]["seq_len"] == 12


def test_performance_flags_change_batches_not_numbers_nor_the_run_identity(tmp_path: Path) -> None:
    """--tokens-per-batch 24 makes one sequence per batch (seq_len 24) instead of all three in
    one; the records and the run's configuration stay the same."""
    frames, configs = [], []
    for extra in ([], ["--tokens-per-batch", "24", "--memory-budget-mb", "256"]):
        out = tmp_path / f"r{len(extra)}.json"
        result = CliRunner().invoke(main, ["compute", "--model", MODEL, "--n-sequences", "3",
                                           "--seq-len", "24", "--metrics", "intervention,heads",
                                           "--quiet", "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        body = json.loads(out.read_text())
        frames.append(pl.DataFrame(body["records"]).sort(["metric", "layer", "component",
                                                          "head"], nulls_last=True))
        configs.append(body["run"]["config"])
    assert configs[0] == configs[1]
    assert frames[0].height == frames[1].height > 0
    assert frames[0].drop("value", "stderr").equals(frames[1].drop("value", "stderr"))
    assert (frames[0]["value"] - frames[1]["value"]).abs().max() < 1e-5


def test_a_command_forked_by_the_zygote_is_the_command_run_by_exec(tmp_path: Path) -> None:
    """`tests.launcher.write_command`'s `strata` (the docs test's, forked by the zygote) gives
    what the installed `.venv/bin/strata` gives: the same exit code, standard output and error,
    through the caller's own streams (pipes here, passed over the zygote's socket), also as a
    step of a shell pipeline."""
    if not launcher.forking():
        pytest.skip("PYTEST_STRATA_LAUNCH=exec: no zygote")
    command = launcher.write_command(tmp_path / "strata")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "STRATA_DATABASE": str(tmp_path / "s.duckdb")}
    tokens = _npy(tmp_path, np.full((2, 16), 10**6, dtype=np.int64))
    for args in (["--help"], ["compute", "--model", MODEL, "--tokens", tokens, "--quiet",
                              "--out", str(tmp_path / "never.parquet")]):
        forked = subprocess.run([str(command), *args], capture_output=True, text=True, env=env,
                                timeout=120)
        execed = subprocess.run([str(launcher.ROOT / ".venv" / "bin" / "strata"), *args],
                                capture_output=True, text=True, env=env, timeout=120)
        # (standard error's last line: the lines before it are a progress bar with its rate)
        assert (forked.returncode, forked.stdout, forked.stderr.splitlines()[-1:]) == \
            (execed.returncode, execed.stdout, execed.stderr.splitlines()[-1:]), args
    assert forked.returncode == 2
    assert "vocabulary" in forked.stderr.lower(), forked.stderr
    piped = subprocess.run(["bash", "-c", f"printf 'a\\nb\\n' | {command} --help >/dev/null "
                            f"&& {command} compute --model {MODEL} --tokens {tokens}"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode == 2, piped.stderr
