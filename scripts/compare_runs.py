"""Two runs' records side by side: per metric, how many rows match and the largest difference.

    .venv/bin/python scripts/compare_runs.py results/smollm2/default-run-float32.parquet new.parquet

Rows are matched on (metric, layer, component, head, neuron); a metric present in only one run
is listed as such. Used to hold a stored run against the same configuration computed again
(for instance after the move to TransformerLens 4: docs/architecture.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

KEYS = ["metric", "layer", "component", "head", "neuron"]


def compare(old: Path, new: Path) -> pl.DataFrame:
    a = pl.read_parquet(old).select([*KEYS, "value"])
    b = pl.read_parquet(new).select([*KEYS, "value"])
    shared = set(a["metric"].unique()) & set(b["metric"].unique())
    joined = a.filter(pl.col("metric").is_in(shared)).join(
        b.filter(pl.col("metric").is_in(shared)), on=KEYS, how="full", nulls_equal=True,
        suffix="_new",
    )
    diff = (pl.col("value") - pl.col("value_new")).abs()
    return (
        joined.with_columns(diff.alias("abs_diff"),
                            (diff / pl.col("value").abs().clip(lower_bound=1e-12)).alias("rel"))
        .group_by("metric")
        .agg(pl.len().alias("rows"),
             pl.col("value_new").is_null().sum().alias("only_old"),
             pl.col("value").is_null().sum().alias("only_new"),
             pl.col("abs_diff").max().alias("max_abs_diff"),
             pl.col("rel").max().alias("max_rel_diff"))
        .sort("metric")
    )


def main() -> None:
    old, new = Path(sys.argv[1]), Path(sys.argv[2])
    with pl.Config(tbl_rows=200, tbl_width_chars=140):
        print(compare(old, new))


if __name__ == "__main__":
    main()
