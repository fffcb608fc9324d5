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
