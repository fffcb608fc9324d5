"""A run's stored records read back through the queries the API serves (not collected)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl
import pyarrow as pa

from compute.records import RECORD_COLUMNS, RECORD_SCHEMA, unit_of
from service.api.queries.index import RunEntry, StoreIndex
from service.store import Store
from service.store import repositories as repo

MOMENTS = ("vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt")


def stored_records(conn: Any, run_id: int, metrics: Iterable[str]) -> pa.Table:
    """Every record of `metrics` in a run, in the record format, sorted: the per-layer and
    per-head rows (`rows_of_runs`) and the per-neuron moments (`neurons`) as records."""
    names = sorted(set(metrics))
    rows = [repo.rows_of_runs(conn, [run_id], names, heads=heads).drop("run_id",
                                                                       "relative_depth")
            for heads in (False, True)]
    every = repo.neurons(conn, run_id, with_tokens=False)
    moments = [every.select(
        pl.lit(f"neurons.{m}").alias("metric"), "layer", pl.lit(None, pl.String).alias(
            "component"), pl.lit(None, pl.Int32).alias("head"), "neuron",
        pl.col(m).alias("value"), pl.lit(None, pl.Float64).alias("stderr"), "n",
        pl.lit(unit_of(f"neurons.{m}")).alias("unit"))
        for m in MOMENTS if f"neurons.{m}" in names]
    tables = [frame.select(list(RECORD_COLUMNS)).to_arrow().cast(RECORD_SCHEMA)
              for frame in [*rows, *moments]]
    table = pa.concat_tables(tables)
    keys = [(c, "ascending") for c in RECORD_COLUMNS]
    return table.sort_by(keys)


def current_run(store: Store, model_id: int, **how: Any) -> RunEntry | None:
    """The run the API reads for a model (`Snapshot.current_run`: the one place that decides)."""
    return StoreIndex(store).snapshot().current_run(model_id, **how)
