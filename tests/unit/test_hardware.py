"""The dtype speed check (compute.hardware): a low-precision dtype slower than float32 on this
machine is reported before a run, with the measured rates; a native one is not."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from compute import hardware
from service.cli import main


def test_a_dtype_slower_than_float32_is_reported_with_its_rates() -> None:
    note = hardware.slow_dtype_message("bfloat16", "cpu", rate=1.3, float32_rate=115.0)
    assert note is not None
    assert "1.3 GFLOP/s" in note
    assert "115.0" in note
    assert "88x slower" in note
    assert "float32" in note


@pytest.mark.parametrize(("dtype", "rate"), [("bfloat16", 1007.0), ("bfloat16", 115.0),
                                             ("float32", 1.0)])
def test_a_native_dtype_or_float32_is_not_reported(dtype: str, rate: float) -> None:
    assert hardware.slow_dtype_message(dtype, "cpu", rate=rate, float32_rate=115.0) is None


def test_the_probe_measures_each_dtype_on_this_machine() -> None:
    rates = {dt: hardware.matmul_gflops("cpu", dt) for dt in ("float32", "bfloat16")}
    assert all(math.isfinite(r) and r > 0 for r in rates.values()), rates
    expected = hardware.slow_dtype_message("bfloat16", "cpu", rates["bfloat16"],
                                           rates["float32"])
    assert hardware.dtype_speed_warning("bfloat16", "cpu") == expected
    assert hardware.dtype_speed_warning("float32", "cpu") is None
    assert hardware.dtype_speed_warning("bfloat16", "cuda:7") is None  # no such device here


def _bfloat16_compute() -> str:
    """A tiny `strata compute --dtype bfloat16` in this process: its output."""
    with CliRunner().isolated_filesystem():
        result = CliRunner().invoke(main, ["compute", "--model", "zoo:tiny-2l-s0", "--quiet",
                                           "--n-sequences", "1", "--seq-len", "8",
                                           "--metrics", "norms", "--dtype", "bfloat16",
                                           "--out", "r.parquet"])
    assert result.exit_code == 0, result.output
    return str(result.output)


def test_strata_compute_warns_before_a_slow_dtype_run(monkeypatch: pytest.MonkeyPatch) -> None:
    rates = {"float32": 100.0, "bfloat16": 2.0}
    monkeypatch.setattr(hardware, "matmul_gflops", lambda device, dtype: rates[dtype])
    output = _bfloat16_compute()
    assert "warning: bfloat16 is emulated on this cpu" in output
    assert "50x slower" in output
    rates["bfloat16"] = 500.0  # native: nothing said
    assert "warning" not in _bfloat16_compute()
