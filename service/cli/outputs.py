"""The `--out` file of `strata compute`, `stability` and `stages`: its format, or exit 2."""

from __future__ import annotations

from pathlib import Path

import click

from compute.errors import SpecError
from service.cli.errors import EXIT_BAD_INPUT, fail
from service.exports import ExportFormat, require_format

NO_OUTPUT = "give --out FILE (.parquet, .json, .csv, .arrow) and/or --store"
# The `--out` option of every command that writes results to a file.
out_option = click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    help="output file: .parquet, .json, .csv or .arrow",
)


def out_format(out: Path) -> ExportFormat:
    """The export format of an --out path, or exit 2 naming the choices."""
    try:
        return require_format(out)
    except SpecError as exc:
        fail(f"--out {exc}", EXIT_BAD_INPUT)


def format_rate(tokens_per_s: float) -> str:
    """Throughput as a person reads it: to three significant figures however slow (a real
    model on a CPU sweeps well under one token per second with every family), so a bar never
    says '0 tok/s' while it works.

    >>> format_rate(1234.5), format_rate(12.34), format_rate(0.4567), format_rate(0.0)
    ('1,234 tok/s', '12.3 tok/s', '0.457 tok/s', '0 tok/s')
    """
    if tokens_per_s >= 100 or tokens_per_s == 0:
        return f"{tokens_per_s:,.0f} tok/s"
    return f"{tokens_per_s:.3g} tok/s"
