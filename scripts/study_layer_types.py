"""Layer type (sliding-window or global attention) as an explanatory variable, from the API.

    .venv/bin/python scripts/study_layer_types.py --url http://127.0.0.1:8000 \
        --model gemma-3-270m-q4_k_m --config <checkpoint>/config.json \
        [--long-run RUN_ID] --out docs/study-gemma3
    .venv/bin/python scripts/study_layer_types.py --rescore --out docs/study-gemma3  # no service

Gemma 3 interleaves five sliding-window layers (window 512) with one global layer; the
checkpoint's `config.json` (`layer_types`) says which is which. For each per-layer signal the
script compares the global layers with the sliding-window ones — every block but the first and
the last, which are special for other reasons — as the difference of their means, with a 90%
seeded bootstrap interval over the run's sequences (`Client.sequences`), and an exact
permutation p-value over the layers (every way of choosing which inner layers are "global"),
Holm-adjusted over every test of the table; per-head numbers (which have no per-sequence means)
get the permutation p-value of their layer means only. With `--long-run`, the attention run
past the window: each layer's locality and sink against its own chance level
(`compute.metrics.attention.chance_levels`, with the window for a sliding layer). Writes
`layer_types.md`, `layer_types.json` and `layer_types.png`.
Nothing is recomputed but the bootstrap and the p-values; `--rescore` recomputes the p-values
alone from the stored `layer_types.json`.
"""

from __future__ import annotations

import argparse
import itertools
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

from compute.metrics.attention import chance_levels  # noqa: E402
from service.client import ApiError, Client  # noqa: E402

RESAMPLES = 2000
SEED = 0
LEVEL = 0.90
SIGNALS: list[tuple[str, str | None]] = [
    ("intervention.kl", "drop"),
    ("intervention.kl", "swap"),
    ("intervention.kl", "drop_attn"),
    ("intervention.kl", "drop_mlp"),
    ("intervention.top1_agreement", "drop"),
    ("attention.prev_1", None),
    ("attention.prev_5", None),
    ("attention.bos", None),
    ("attention.entropy", None),
    ("norms.attn_out", "attn"),
    ("norms.mlp_out", "mlp"),
    ("similarity.self", "attn"),
]
PER_HEAD = ["heads.ablation_kl", "heads.ablation_loss_delta", "heads_atp.loss_delta",
            "heads.induction"]


def layer_types(config: Path) -> list[str]:
    cfg = json.loads(config.read_text())
    if "layer_types" in cfg:
        return ["global" if t == "full_attention" else "local" for t in cfg["layer_types"]]
    pattern = int(cfg["sliding_window_pattern"])
    return ["global" if (i + 1) % pattern == 0 else "local"
            for i in range(int(cfg["num_hidden_layers"]))]


def wide(client: Client, model: str, metric: str, component: str | None,
         run_id: int | None = None) -> np.ndarray:
    frame = client.sequences(model, metric, component, run_id=run_id)
    frame = frame.filter(pl.col("head").is_null())
    table = frame.pivot(index="sequence", on="layer", values="value").sort("sequence")
    layers = sorted(int(c) for c in table.columns if c != "sequence")
    return table.select([str(layer) for layer in layers]).to_numpy()


def contrast(values: np.ndarray, types: list[str]) -> dict[str, Any]:
    """Mean over the global layers minus mean over the sliding ones (first and last block out),
    with a bootstrap over sequences."""
    n_layers = values.shape[1]
    inner = range(1, min(n_layers, len(types)) - 1)
    glob = [i for i in inner if types[i] == "global"]
    loc = [i for i in inner if types[i] == "local"]
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, values.shape[0], size=(RESAMPLES, values.shape[0]))
    means = values.mean(axis=0)
    boot = values[picks].mean(axis=1)  # [resample, layer]
    diff = boot[:, glob].mean(axis=1) - boot[:, loc].mean(axis=1)
    low, high = np.quantile(diff, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {
        "global_layers": glob,
        "global_mean": float(means[glob].mean()),
        "local_mean": float(means[loc].mean()),
        "difference": float(means[glob].mean() - means[loc].mean()),
        "interval": (float(low), float(high)),
        "per_layer": [float(v) for v in means],
    }


def permutation_p(means: np.ndarray, types: list[str]) -> tuple[float, int]:
    """Exact two-sided permutation p-value of global − sliding over the inner layers: the share
    of all C(n, k) ways of calling k of the n inner layers "global" (the observed one included)
    whose |difference| is at least the observed one; what the sequences' bootstrap cannot say
    (it holds the layers fixed, and with two global inner layers a difference may be one
    layer's, not the type's). Returns (p, number of arrangements): the smallest attainable p is
    1 / that number (1/120 for 2 of 16 inner layers, 1/105 for 2 of 15)."""
    inner = list(range(1, len(means) - 1))
    is_global = np.asarray([types[i] == "global" for i in inner])
    values = means[inner]
    observed = values[is_global].mean() - values[~is_global].mean()
    null = []
    for chosen in itertools.combinations(range(len(inner)), int(is_global.sum())):
        mask = np.zeros(len(inner), bool)
        mask[list(chosen)] = True
        null.append(values[mask].mean() - values[~mask].mean())
    arrangements = len(null)
    hits = int((np.abs(np.asarray(null)) >= abs(observed) - 1e-12).sum())
    return hits / arrangements, arrangements


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over all of them)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def add_holm(results: dict[str, Any]) -> None:
    """Each signal's exact p-value again from its stored per-layer means, and Holm's adjustment
    over every test of the table (`p_holm`)."""
    rows = [*results["signals"].values(), *results["heads"].values()]
    for r in rows:
        r["p_value"], r["arrangements"] = permutation_p(np.asarray(r["per_layer"]),
                                                        results["types"])
    for r, adjusted in zip(rows, holm([r["p_value"] for r in rows]), strict=True):
        r["p_holm"] = adjusted


def head_contrast(client: Client, model: str, metric: str, types: list[str]) -> dict[str, Any]:
    frame = client.heads(model, metric)
    per_layer = frame.group_by("layer").agg(pl.col("value").mean()).sort("layer")
    means = np.asarray(per_layer["value"].to_list())
    inner = list(range(1, len(means) - 1))
    is_global = np.asarray([types[i] == "global" for i in inner])
    return {
        "global_mean": float(means[inner][is_global].mean()),
        "local_mean": float(means[inner][~is_global].mean()),
        "difference": float(means[inner][is_global].mean() - means[inner][~is_global].mean()),
        "per_layer": [float(v) for v in means],
    }


def long_attention(client: Client, model: str, run_id: int, types: list[str],
                   window: int) -> dict[str, Any]:
    seq_len = int(client.run(run_id).config["tokens"]["seq_len"])
    out: dict[str, Any] = {"seq_len": seq_len, "layers": []}
    levels = {"global": chance_levels(seq_len, (1, 5)),
              "local": chance_levels(seq_len, (1, 5), window)}
    for metric in ("prev_1", "prev_5", "bos", "entropy"):
        values = wide(client, model, f"attention.{metric}", None, run_id).mean(axis=0)
        for layer, value in enumerate(values):
            kind = types[layer]
            out["layers"].append({"layer": layer, "type": kind, "metric": metric,
                                  "value": float(value), "chance": levels[kind][metric],
                                  "ratio": float(value / levels[kind][metric])
                                  if levels[kind][metric] else None})
    return out


def markdown(results: dict[str, Any], types: list[str]) -> str:
    lines = [f"Layer types: {', '.join(f'{i}:{t[0]}' for i, t in enumerate(types))} "
             "(g = global, l = sliding window); first and last block left out of both means.",
             "",
             "| signal | global mean | sliding mean | global − sliding "
             "| 90% interval (sequences) | exact permutation p (layers) | Holm-adjusted p |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def p_cells(r: dict[str, Any]) -> str:
        hits = round(r["p_value"] * r["arrangements"])
        return f"{r['p_value']:.3f} ({hits}/{r['arrangements']}) | {r['p_holm']:.3f}"

    for name, r in results["signals"].items():
        where = f"[{r['interval'][0]:.3g}, {r['interval'][1]:.3g}]"
        lines.append(f"| {name} | {r['global_mean']:.4g} | {r['local_mean']:.4g} | "
                     f"{r['difference']:+.4g} | {where} | {p_cells(r)} |")
    for name, r in results["heads"].items():
        lines.append(f"| {name} (per-layer mean of heads) | {r['global_mean']:.4g} | "
                     f"{r['local_mean']:.4g} | {r['difference']:+.4g} | — | {p_cells(r)} |")
    long = results.get("long")
    if long:
        lines += ["", f"Attention at {long['seq_len']} tokens, each layer against the chance "
                  "level of its own type (uniform over the visible keys):", "",
                  "| layer | type | prev_1 (chance) | prev_5 (chance) | bos (chance) "
                  "| entropy, bits (chance) |", "| --- | --- | --- | --- | --- | --- |"]
        rows: dict[int, dict[str, Any]] = {}
        for r in long["layers"]:
            rows.setdefault(r["layer"], {"type": r["type"]})[r["metric"]] = r
        for layer, r in sorted(rows.items()):
            cells = [f"{r[m]['value']:.3f} ({r[m]['chance']:.3f})"
                     for m in ("prev_1", "prev_5", "bos", "entropy")]
            lines.append(f"| {layer} | {r['type']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def draw(results: dict[str, Any], types: list[str], path: Path) -> None:
    names = list(results["signals"])[:8]
    fig, axes = plt.subplots(len(names), 1, figsize=(7, 1.9 * len(names)), sharex=True)
    for ax, name in zip(axes, names, strict=True):
        values = results["signals"][name]["per_layer"]
        colors = ["tab:red" if types[i] == "global" else "tab:blue" for i in range(len(values))]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_title(f"{name} (red: global layers)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("layer")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="the registered model (not with --rescore)")
    parser.add_argument("--config", type=Path, help="the checkpoint's config.json (not with "
                        "--rescore)")
    parser.add_argument("--long-run", type=int, default=None,
                        help="run id of an attention run past the window")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rescore", action="store_true",
                        help="no service: the p-values again from OUT/layer_types.json's "
                        "stored per-layer means (exact, Holm), rewriting its .json and .md")
    args = parser.parse_args()
    if args.rescore:
        stored: dict[str, Any] = json.loads((args.out / "layer_types.json").read_text())
        add_holm(stored)
        (args.out / "layer_types.md").write_text(markdown(stored, stored["types"]))
        (args.out / "layer_types.json").write_text(json.dumps(stored, indent=1))
        print((args.out / "layer_types.md").read_text())
        return
    if args.config is None or args.model is None:
        parser.error("--model and --config are required (except with --rescore)")
    types = layer_types(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"types": types, "signals": {}, "heads": {}}
    with Client(args.url) as client:
        runs = client.current_runs(args.model)
        for metric, component in SIGNALS:
            family = metric.split(".")[0]
            run_id = runs.get(family)
            # the default run's 128-token attention, not the long run (which may be current)
            if family == "attention" and args.long_run is not None:
                run_id = min(r for r in _runs_of(client, args.model, "attention")
                             if r != args.long_run)
            try:
                values = wide(client, args.model, metric, component, run_id)
            except ApiError as exc:
                print(f"skipped {metric}: {exc}", file=sys.stderr)
                continue
            results["signals"][f"{metric} {component or ''}".strip()] = contrast(values, types)
        for metric in PER_HEAD:
            try:
                results["heads"][metric] = head_contrast(client, args.model, metric, types)
            except ApiError as exc:
                print(f"skipped {metric}: {exc}", file=sys.stderr)
        if args.long_run is not None:
            results["long"] = long_attention(client, args.model, args.long_run, types,
                                             args.window)
    add_holm(results)
    (args.out / "layer_types.md").write_text(markdown(results, types))
    (args.out / "layer_types.json").write_text(json.dumps(results, indent=1))
    draw(results, types, args.out / "layer_types.png")
    print((args.out / "layer_types.md").read_text())


def _runs_of(client: Client, model: str, family: str) -> list[int]:
    frame = client.runs(model=model, status="succeeded", family=family)
    return [int(i) for i in frame["id"].to_list()]


if __name__ == "__main__":
    main()
