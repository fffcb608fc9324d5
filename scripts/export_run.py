"""Export one stored run for a study: its records and per-sequence means as Parquet (the format
`strata compute --out` writes and results/*/ keep), and the run's row (configuration, device,
dtype, timings, environment) as JSON.

    .venv/bin/python scripts/export_run.py --db backup.duckdb --run 1 --out results/qwen/run-float32

Reads a database file no process holds: a service's online backup (`strata db backup`, or
`POST /admin/backup`) while it runs, or the file itself once it stopped (DuckDB lets no second
process open a file that one holds read-write).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import duckdb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the three files")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(args.db), read_only=True)
    row = con.execute("SELECT * FROM runs WHERE id = ?", [args.run]).fetchone()
    if row is None:
        raise SystemExit(f"no run {args.run} in {args.db}")
    names = [d[0] for d in con.description]
    run = dict(zip(names, row, strict=True))
    if run.get("status") != "succeeded":
        raise SystemExit(f"run {args.run} is {run.get('status')}, not succeeded")
    con.execute(
        f"COPY (SELECT metric, layer, component, head, neuron, value, stderr, n, unit "
        f"FROM results WHERE run_id = {args.run}) TO '{args.out}.parquet' (FORMAT parquet)"
    )
    con.execute(
        f"COPY (SELECT metric, layer, component, head, sequence, value FROM sequence_means "
        f"WHERE run_id = {args.run}) TO '{args.out}.sequence_means.parquet' (FORMAT parquet)"
    )
    model = con.execute(
        "SELECT name, source, checkpoint FROM models WHERE id = ?", [run["model_id"]]
    ).fetchone()
    run["model"] = list(model) if model else None
    Path(f"{args.out}.run.json").write_text(json.dumps(run, indent=1, default=str))
    print(f"{args.out}: run {args.run} ({run.get('status')}), wall {run.get('wall_s')} s")


if __name__ == "__main__":
    main()
