"""The head screen (`heads_atp`) against exact head ablation: how well it ranks, and its cost.

Validation, from a running service's stored runs (both families on the same tokens):

    .venv/bin/python benchmarks/head_screen.py validate --url http://127.0.0.1:8000 \
        --model SmolLM2-135M-Instruct.Q4_1 \
        [--exact-from results/smollm2/default-run-float32.parquet]

prints, over all heads: Spearman and Pearson of `heads_atp.loss_delta` against
`heads.ablation_loss_delta` (the number it estimates) and Spearman of |estimate| against
`heads.ablation_kl`; the overlap of the ten heads the exact ablation finds most costly with
the screen's ten; and the heads where the screen is most wrong (by rank and by nats), with
their layer. `--exact-from` reads the exact numbers from an exported run instead (its tokens
must be the screen's: the default 32 x 128 of the built-in corpus).

Cost, whole process, default settings but the sequences (the FLOP ratio is in
docs/performance.md; this measures it):

    .venv/bin/python benchmarks/head_screen.py time --model <ref> --n-sequences 2

times `strata compute --metrics heads` and `--metrics heads_atp` as subprocesses, one after the
other, on the same tokens. Figures and the machine they were measured on: docs/performance.md,
"The head screen".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import scipy.stats  # noqa: E402

TOP = 10


def _heads(frame: pl.DataFrame, metric: str) -> pl.DataFrame:
    return frame.filter(pl.col("metric") == metric).select("layer", "head", "value")


def compare(
    exact_loss: pl.DataFrame, exact_kl: pl.DataFrame, screen: pl.DataFrame
) -> dict[str, Any]:
    joined = (
        exact_loss.rename({"value": "exact"})
        .join(screen.rename({"value": "atp"}), on=["layer", "head"])
        .join(exact_kl.rename({"value": "kl"}), on=["layer", "head"])
        .sort(["layer", "head"])
    )
    exact, atp, kl = (joined[c].to_numpy() for c in ("exact", "atp", "kl"))
    rank_exact = scipy.stats.rankdata(-exact)
    rank_atp = scipy.stats.rankdata(-atp)
    top_exact = set(np.argsort(-exact)[:TOP].tolist())
    top_atp = set(np.argsort(-atp)[:TOP].tolist())
    top_kl = set(np.argsort(-kl)[:TOP].tolist())
    top_abs = set(np.argsort(-np.abs(atp))[:TOP].tolist())
    names = [f"{layer}.{head}" for layer, head in zip(joined["layer"], joined["head"], strict=True)]
    by_rank = np.argsort(-np.abs(rank_exact - rank_atp))[:5]
    by_nats = np.argsort(-np.abs(exact - atp))[:5]
    return {
        "heads": len(joined),
        "spearman_loss": float(scipy.stats.spearmanr(exact, atp).statistic),
        "pearson_loss": float(scipy.stats.pearsonr(exact, atp).statistic),
        "spearman_abs_vs_kl": float(scipy.stats.spearmanr(kl, np.abs(atp)).statistic),
        "top10_overlap_loss": len(top_exact & top_atp),
        "top10_overlap_kl": len(top_kl & top_abs),
        "top10_exact": sorted(names[i] for i in top_exact),
        "top10_screen": sorted(names[i] for i in top_atp),
        "worst_by_rank": [
            {"head": names[i], "exact": float(exact[i]), "atp": float(atp[i]),
             "rank_exact": int(rank_exact[i]), "rank_atp": int(rank_atp[i])} for i in by_rank
        ],
        "worst_by_nats": [
            {"head": names[i], "exact": float(exact[i]), "atp": float(atp[i])} for i in by_nats
        ],
    }


def validate(args: argparse.Namespace) -> None:
    from service.client import Client

    with Client(args.url) as client:
        screen = client.heads(args.model, "heads_atp.loss_delta")
        if args.exact_from:
            exported = pl.read_parquet(args.exact_from)
            loss = _heads(exported, "heads.ablation_loss_delta")
            kl = _heads(exported, "heads.ablation_kl")
        else:
            loss = client.heads(args.model, "heads.ablation_loss_delta")
            kl = client.heads(args.model, "heads.ablation_kl")
    result = compare(
        loss.select("layer", "head", "value").with_columns(pl.col("layer", "head").cast(pl.Int64)),
        kl.select("layer", "head", "value").with_columns(pl.col("layer", "head").cast(pl.Int64)),
        screen.select("layer", "head", "value").with_columns(
            pl.col("layer", "head").cast(pl.Int64)
        ),
    )
    print(json.dumps(result, indent=1))


def time_families(args: argparse.Namespace) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("heads_atp", "heads"):
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "service.cli", "compute", "--model", args.model,
                 "--metrics", family, "--n-sequences", str(args.n_sequences), "--seq-len",
                 str(args.seq_len), "--out", str(Path(tmp) / f"{family}.parquet"), "--quiet"],
                check=True, env=env, cwd=ROOT,
            )
            out[family] = time.perf_counter() - start
    out["ratio"] = out["heads_atp"] / out["heads"]
    print(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate")
    v.add_argument("--url", default="http://127.0.0.1:8000")
    v.add_argument("--model", required=True)
    v.add_argument("--exact-from", type=Path, default=None)
    t = sub.add_parser("time")
    t.add_argument("--model", required=True)
    t.add_argument("--n-sequences", type=int, default=2)
    t.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    validate(args) if args.command == "validate" else time_families(args)


if __name__ == "__main__":
    main()
