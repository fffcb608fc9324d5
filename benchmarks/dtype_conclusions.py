"""Does bfloat16 change a run's conclusions? Two runs of one model on the same tokens (float32 and
bfloat16: `strata compute --out` files, e.g. from `geometry.py --default-run`) compared on what a
reader takes from them (docs/performance.md: "Choosing the default dtype").

    .venv/bin/python benchmarks/dtype_conclusions.py build/geometry/default-run-float32.parquet \\
        build/geometry/default-run-bfloat16.parquet

Printed: the stage boundaries of each (`compute.stages.infer_stages`, with the per-sequence
bootstrap when the runs carry it); per intervention kind the five most damaging layers by KL and
the rank correlation of the per-layer KL; the ten heads with the largest ablation KL and the ten
with the highest induction score, overlap and rank correlation; per layer the neuron class counts;
and per metric the largest and median |bf16 - fp32| (absolute and relative to the fp32 value).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = a.argsort().argsort(), b.argsort().argsort()
    return float(np.corrcoef(ra, rb)[0, 1])


def top(frame: pl.DataFrame, metric: str, by: list[str], k: int, **where: object) -> list[tuple]:
    rows = frame.filter(pl.col("metric") == metric)
    for col, value in where.items():
        rows = rows.filter(pl.col(col) == value)
    rows = rows.sort("value", descending=True).head(k)
    return [tuple(r[c] for c in by) for r in rows.iter_rows(named=True)]


def paired(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    keys = ["metric", "layer", "component", "head", "neuron"]
    return a.select([*keys, "value"]).join(
        b.select([*keys, pl.col("value").alias("low")]), on=keys, how="inner", nulls_equal=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("float32")
    parser.add_argument("bfloat16")
    args = parser.parse_args()
    from compute.stages import infer_stages, n_layers_of

    runs = {"float32": pl.read_parquet(args.float32), "bfloat16": pl.read_parquet(args.bfloat16)}
    full, low = runs["float32"], runs["bfloat16"]
    n_layers = n_layers_of(full)
    print("stage boundaries (layer: first block of the next stage; None = no clear boundary)")
    for name, frame in runs.items():
        path = Path(getattr(args, name))
        means = path.with_name(path.stem + ".sequence_means" + path.suffix)
        seq = pl.read_parquet(means) if means.is_file() else None
        bounds = infer_stages(frame, n_layers, seq)
        print(f"  {name:9s} " + "; ".join(
            f"b{b.index}: {b.layer} (estimate {b.estimate}, interval {b.interval})"
            for b in bounds))
    both = paired(full, low)
    for kind in ("drop", "swap", "drop_attn", "drop_mlp"):
        rows = both.filter((pl.col("metric") == "intervention.kl") & (pl.col("component") == kind))
        if rows.height == 0:
            continue
        rows = rows.sort("layer")
        a, b = rows["value"].to_numpy(), rows["low"].to_numpy()
        ta, tb = np.argsort(-a)[:5].tolist(), np.argsort(-b)[:5].tolist()
        print(f"intervention.kl {kind:9s} top-5 layers fp32 {ta} bf16 {tb}; "
              f"Spearman over layers {spearman(a, b):.4f}")
    for metric in ("heads.ablation_kl", "heads.induction"):
        rows = both.filter(pl.col("metric") == metric).sort(["layer", "head"])
        if rows.height == 0:
            continue
        a, b = rows["value"].to_numpy(), rows["low"].to_numpy()
        keys = list(zip(rows["layer"].to_list(), rows["head"].to_list(), strict=True))
        ta = [keys[i] for i in np.argsort(-a)[:10]]
        tb = [keys[i] for i in np.argsort(-b)[:10]]
        print(f"{metric}: top-10 (layer, head) fp32 {ta}\n{'':{len(metric) + 2}}bf16 {tb}; "
              f"overlap {len(set(ta) & set(tb))}/10; Spearman over {len(a)} heads "
              f"{spearman(a, b):.4f}")
    for cls in ("prediction", "suppression", "partition"):
        for suffix in ("", "_cal"):
            metric = f"neurons.n_{cls}{suffix}"
            rows = both.filter(pl.col("metric") == metric).sort("layer")
            if rows.height:
                diff = (rows["low"] - rows["value"]).abs()
                print(f"{metric:26s} per layer: fp32 total {int(rows['value'].sum())}, bf16 "
                      f"{int(rows['low'].sum())}, largest per-layer |diff| {int(diff.max())}")
    print("per metric |bf16 - fp32|: largest, median, median relative to |fp32|")
    stats = (
        both.with_columns(d=(pl.col("low") - pl.col("value")).abs())
        .with_columns(rel=pl.col("d") / pl.col("value").abs().clip(1e-12))
        .group_by("metric")
        .agg(pl.col("d").max().alias("max"), pl.col("d").median().alias("median"),
             pl.col("rel").median().alias("median_rel"), pl.len().alias("n"))
        .sort("metric")
    )
    for r in stats.iter_rows(named=True):
        print(f"  {r['metric']:38s} n {r['n']:5d}  max {r['max']:.3g}  median {r['median']:.3g}"
              f"  median rel {r['median_rel']:.3g}")


if __name__ == "__main__":
    main()
