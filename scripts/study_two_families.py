"""Two real models' layers side by side: Lad et al.'s claims tested on each, from the API.

    .venv/bin/python scripts/study_two_families.py --url http://127.0.0.1:8000 \
        --models SmolLM2-135M-Instruct.Q4_1,gemma-3-270m-q4_k_m --out docs/study-two-families
    .venv/bin/python scripts/study_two_families.py --rescore --out docs/study-two-families

Every number comes from a running Strata service through the project's client; nothing is
recomputed but the bootstrap of the claim statistics, over the sequences of the stored runs
(`Client.sequences`: the per-sequence means behind every per-layer mean), seeded. Writes
`claims.md` (a verdict table per claim and model), `compare.md` (every stage signal on relative
depth, both models, with the API's standard errors), `claims.json`, and `compare.png`.

The claims and their deciding numbers. **Not fixed before the results were read**: the first
version of this script (2026-12-04 02:33) computed both measures at once and decided by retained
accuracy, after docs/study-smollm2.md (2026-12-01) had read SmolLM2's middle by top-1 agreement
("the paper's relative accuracy") and a review had called the paper's measure retained accuracy.
Lad et al. (section 4.1) define relative accuracy as "the fraction of predictions that are the
same between the intervened model and the baseline model": top-1 agreement. Since 2026-12-06
(docs/preregistration.md) agreement decides and retained accuracy is reported beside it with
the verdict it gave; the thresholds and the middle below are this study's own, chosen with
SmolLM2's numbers known (docs/study-two-families.md labels them so).

1. **The middle is robust to drop and swap** (the paper: 72-95% of predictions kept). Deciding
   number: the mean top-1 agreement with the unmodified model over the middle (the fraction of
   positions whose argmax is unchanged), with its 90% bootstrap interval; holds if the interval
   lies above 0.72, does not hold if below, else cannot tell. The middle is every block but the
   first and the last (drop: blocks 1..L-2; swap: pairs (l, l+1) with 1 <= l and l+1 <= L-2).
   Beside it: retained accuracy = the intervention's accuracy / the unmodified model's
   accuracy, a ratio of means over sequences, read against the same 0.72.
2. **The first and the last layers are critical.** Deciding number: the top-1 agreement when
   dropping block 0 (block L-1); holds if its 90% interval lies below 0.72 (the paper's floor
   for a robust layer), does not hold if above, else cannot tell. Retained accuracy beside.
3. **Four stages in order.** Deciding number: how many of the three boundaries the stage rule
   finds clear, in order (1 <= 2 <= 3): holds with three, does not hold with none, cannot tell
   with one or two (the rule names the ones it could not place).

`--rescore` writes claims.md again from the stored claims.json, with no service.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from service.client import ApiError, Client  # noqa: E402

FLOOR = 0.72  # the paper's lowest relative accuracy (top-1 agreement), middle layers
LEVEL = 0.90
RESAMPLES = 2000
SEED = 0
# Every stage signal of the stage rule (docs/metrics.md, stages.*), on relative depth.
SIGNALS: list[tuple[str, str | None]] = [
    ("intervention.kl", "drop"),
    ("intervention.kl", "swap"),
    ("intervention.kl", "drop_attn"),
    ("intervention.kl", "drop_mlp"),
    ("intervention.top1_agreement", "drop"),
    ("intervention.accuracy", "drop"),
    ("logit_lens.kl_to_final", None),
    ("logit_lens.top1_agreement", None),
    ("neurons.frac_prediction_cal", None),
    ("neurons.frac_suppression_cal", None),
    ("neurons.frac_prediction", None),
    ("neurons.frac_suppression", None),
    ("attention.prev_5", None),
    ("attention.bos", None),
]


def per_sequence(client: Client, model: str, metric: str, component: str) -> np.ndarray:
    """[sequence, layer] per-sequence means of one metric and component (layer None: column
    0), from the API."""
    frame = client.sequences(model, metric, component)
    frame = frame.with_columns(pl.col("layer").fill_null(0))
    wide = frame.pivot(index="sequence", on="layer", values="value").sort("sequence")
    layers = sorted(int(c) for c in wide.columns if c != "sequence")
    return wide.select([str(layer) for layer in layers]).to_numpy()


def interval(samples: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


def verdict(low: float, high: float, *, above: bool) -> str:
    """`above`: the claim holds when the interval lies above FLOOR (else below it)."""
    if (low > FLOOR) if above else (high < FLOOR):
        return "holds"
    if (high < FLOOR) if above else (low > FLOOR):
        return "does not hold"
    return "cannot tell"


def retained(client: Client, model: str, metric: str) -> dict[str, Any]:
    """Retained `metric` (accuracy or agreement) of drop and swap, bootstrapped over sequences."""
    base = per_sequence(client, model, "intervention.accuracy", "none")[:, 0]
    drop = per_sequence(client, model, metric, "drop")
    swap = per_sequence(client, model, metric, "swap")
    n_seq, n_layers = drop.shape
    # agreement of the unmodified model with itself is 1: the ratio is the agreement
    denominator = base if metric == "intervention.accuracy" else np.ones(n_seq)
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, n_seq, size=(RESAMPLES, n_seq))

    def ratio(values: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
        return values[rows].mean(axis=-2) / denominator[rows].mean(axis=-1)[..., None]

    middle_drop = slice(1, n_layers - 1)
    middle_swap = slice(1, n_layers - 2)  # pairs (l, l+1) within blocks 1..L-2
    out: dict[str, Any] = {"n_sequences": n_seq, "n_layers": n_layers}
    for kind, values, middle in (("drop", drop, middle_drop), ("swap", swap, middle_swap)):
        point = ratio(values, slice(None))
        boot = ratio(values, picks)  # [resample, layer]
        mean_boot = boot[:, middle].mean(axis=1)
        out[kind] = {
            "middle_mean": float(point[middle].mean()),
            "middle_interval": interval(mean_boot),
            "middle_range": (float(point[middle].min()), float(point[middle].max())),
            "per_layer": [float(v) for v in point],
        }
        if kind == "drop":
            for name, layer in (("first", 0), ("last", n_layers - 1)):
                out[kind][name] = float(point[layer])
                out[kind][f"{name}_interval"] = interval(boot[:, layer])
    out["baseline"] = float(base.mean())
    return out


def stages(client: Client, model: str) -> dict[str, Any]:
    rows = client.stages(model).boundaries.sort("boundary")
    found = rows.filter(pl.col("found"))
    layers = [b for b in found["layer"].to_list() if b is not None]
    ordered = layers == sorted(layers)
    n_clear = len(layers) if ordered else 0
    return {
        "boundaries": rows.select(
            "boundary", "ends_stage", "found", "layer", "relative_depth", "interval_low",
            "interval_high", "sharpness", "rule"
        ).to_dicts(),
        "clear_in_order": n_clear,
        "verdict": "holds" if n_clear == 3 else "does not hold" if n_clear == 0 else "cannot tell",
    }


def fmt_interval(pair: tuple[float, float]) -> str:
    return f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def claims_markdown(results: dict[str, dict[str, Any]]) -> str:
    """The verdict table: top-1 agreement decides; retained accuracy beside it, with the verdict
    it gave as the first version's deciding number."""
    lines = [
        "| claim | model | deciding number: top-1 agreement | 90% interval | verdict "
        "| beside: retained accuracy [90% interval] | verdict by retained accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, r in results.items():
        acc, agree = r["accuracy"], r["agreement"]
        for kind in ("drop", "swap"):
            g, a = agree[kind], acc[kind]
            lines.append(
                f"| 1. middle robust to {kind} | {model} | mean over the middle "
                f"{g['middle_mean']:.3f} (layers {g['middle_range'][0]:.3f}-"
                f"{g['middle_range'][1]:.3f}) | {fmt_interval(g['middle_interval'])} | "
                f"{verdict(*g['middle_interval'], above=True)} | {a['middle_mean']:.3f} "
                f"{fmt_interval(a['middle_interval'])} | "
                f"{verdict(*a['middle_interval'], above=True)} |"
            )
        for name in ("first", "last"):
            g, a = agree["drop"], acc["drop"]
            lines.append(
                f"| 2. {name} layer critical | {model} | dropping it {g[name]:.3f} | "
                f"{fmt_interval(g[f'{name}_interval'])} | "
                f"{verdict(*g[f'{name}_interval'], above=False)} | {a[name]:.3f} "
                f"{fmt_interval(a[f'{name}_interval'])} | "
                f"{verdict(*a[f'{name}_interval'], above=False)} |"
            )
        s = r["stages"]
        placed = ", ".join(
            f"{b['boundary']}: block {b['layer']} [{b['interval_low']}, {b['interval_high']}]"
            if b["found"] else f"{b['boundary']}: not clear"
            for b in s["boundaries"]
        )
        lines.append(
            f"| 3. four stages in order | {model} | boundaries clear in order: "
            f"{s['clear_in_order']} of 3 ({placed}) | (bootstrap intervals per boundary) | "
            f"{s['verdict']} | — | (same) |"
        )
    return "\n".join(lines) + "\n"


def compare_markdown(client: Client, models: list[str], bins: int) -> tuple[str, pl.DataFrame]:
    frames = []
    for metric, component in SIGNALS:
        try:
            frame = client.compare(models, metric, component, bins=bins)
        except ApiError as exc:
            print(f"skipped {metric} {component}: {exc}", file=sys.stderr)
            continue
        signal = f"{metric} {component or ''}".strip()
        frames.append(frame.with_columns(pl.lit(signal).alias("signal")))
    table = pl.concat(frames, how="diagonal_relaxed")
    value_cols = [c for c in ("value", "stderr") if c in table.columns]
    depth = "relative_depth" if "relative_depth" in table.columns else "bin"
    lines = [f"| signal | {depth} | " + " | ".join(models) + " |",
             "| --- | --- | " + " | ".join("---" for _ in models) + " |"]
    for (signal, at), rows in table.group_by(["signal", depth], maintain_order=True):
        cells = []
        for m in models:
            row = rows.filter(pl.col("model") == m)
            if row.is_empty() or row["value"][0] is None:
                cells.append("—")
                continue
            err = row["stderr"][0] if "stderr" in value_cols else None
            cells.append(f"{row['value'][0]:.3g}" + (f" ± {err:.2g}" if err is not None else ""))
        lines.append(f"| {signal} | {float(at):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", table


def draw(table: pl.DataFrame, models: list[str], path: Path) -> None:
    signals = table["signal"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(len(signals), 1, figsize=(7, 2.2 * len(signals)), sharex=True)
    depth = "relative_depth" if "relative_depth" in table.columns else "bin"
    for ax, signal in zip(np.atleast_1d(axes), signals, strict=True):
        for m in models:
            rows = table.filter(
                (pl.col("signal") == signal)
                & (pl.col("model") == m)
                & pl.col("value").is_not_null()
            ).sort(depth)
            err = rows["stderr"].fill_null(0.0).to_list() if "stderr" in rows.columns else None
            ax.errorbar(rows[depth].to_list(), rows["value"].to_list(), yerr=err, label=m,
                        capsize=2, marker="o", markersize=2, linewidth=1)
        ax.set_title(signal, fontsize=9)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7)
    np.atleast_1d(axes)[-1].set_xlabel("relative depth")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--models", help="comma-separated registered models")
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rescore", action="store_true",
                        help="no service: claims.md again from OUT/claims.json")
    args = parser.parse_args()
    if args.rescore:
        stored = json.loads((args.out / "claims.json").read_text())
        (args.out / "claims.md").write_text(claims_markdown(stored))
        print((args.out / "claims.md").read_text())
        return
    if not args.models:
        parser.error("--models is required (except with --rescore)")
    models = [m for m in args.models.split(",") if m]
    args.out.mkdir(parents=True, exist_ok=True)
    with Client(args.url) as client:
        results = {
            m: {
                "accuracy": retained(client, m, "intervention.accuracy"),
                "agreement": retained(client, m, "intervention.top1_agreement"),
                "stages": stages(client, m),
            }
            for m in models
        }
        compare_md, table = compare_markdown(client, models, args.bins)
    (args.out / "claims.md").write_text(claims_markdown(results))
    (args.out / "compare.md").write_text(compare_md)
    (args.out / "claims.json").write_text(json.dumps(results, indent=1))
    draw(table, models, args.out / "compare.png")
    print((args.out / "claims.md").read_text())


if __name__ == "__main__":
    main()
