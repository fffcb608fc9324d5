"""The head-stability study (issue 29): five claims of "Quantifying LLM Attention-Head Stability"
(arXiv 2602.16740) tested on tiny refit families through Strata's own queries.

    .venv/bin/python scripts/study_head_stability.py train      # 30 models, resumable
    .venv/bin/python scripts/study_head_stability.py store      # stability + heads runs, stored
    .venv/bin/python scripts/study_head_stability.py analyse    # serve, read back, figures, claims
    .venv/bin/python scripts/study_head_stability.py all
    .venv/bin/python scripts/study_head_stability.py rescore    # the claims from results/ alone

`train` fits refit families at depths 2, 4 and 6 (d_model 64, 4 heads, n_ctx 64), 5 seeds each,
with AdamW (weight decay 0.1) and with Adam (no weight decay): 30 models under
build/head-stability/ (not shipped). A model whose `strata_zoo.json` exists is skipped, so the
command can be stopped and started again. Every model shares one tokenizer (the shipped
demo-4l's 512-token BPE of the built-in corpus), which makes the unembedding cheap: on a shared
2-core machine a step of batch 32 costs 3x less than with the 4,096-token default. Each worker
process runs torch on one thread (two threads on a loaded 2-core machine were 3-10x slower).

`store` runs, per family, `strata stability --store` (anchor = seed 0, 3 null models) and
`strata compute --model <anchor> --metrics heads --store` (per-head ablation importance) into a
study database (build/head-stability/strata.duckdb unless STRATA_DATABASE is set).

`analyse` starts `strata serve` on that database, reads everything back through the Python
client (`service.client.Client`), writes the records to results/head-stability/ and the figures
to docs/study-head-stability/, and prints the claim table. The claim computations are plain
functions of Polars frames (`claim_*`, `bootstrap_mean`, `fisher_interval`, `verdict`), tested in
tests/unit/test_study_head_stability.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:
    import polars as pl
except ModuleNotFoundError:  # `train` runs where polars is not installed (a lent GPU machine)
    pl = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUILD = ROOT / "build" / "head-stability"
RESULTS = ROOT / "results" / "head-stability"
FIGURES = ROOT / "docs" / "study-head-stability"
TOKENIZER = ROOT / "compute" / "zoo" / "checkpoints" / "demo-4l"

DEPTHS = (2, 4, 6)
OPTIMIZERS = ("adamw", "adam")
SEEDS = (0, 1, 2, 3, 4)
ARCH = {"d_model": 128, "n_heads": 4, "n_ctx": 64, "vocab_size": 512}
TRAINING = {"lr": 3e-3, "batch_size": 64, "eval_every": 100}
DEFAULT_STEPS = 2000
# AdamW's decay shrinks a weight by exp(-sum over steps of lr_t * wd) where no gradient holds it:
# with this schedule (5% warm-up, cosine to 10%) sum lr_t ~ 0.55 lr steps = 3.3, so wd 0.5 is a
# shrink of exp(-1.65) ~ 0.19; the earlier study's 0.1 over 300 steps was exp(-0.05).
WEIGHT_DECAY = {"adamw": 0.5, "adam": 0.0}
N_NULL = 3
HEADS_RUN = {"n_sequences": 32, "seq_len": 64}  # n_ctx 64 caps seq_len at 64
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def family_name(depth: int, optimizer: str) -> str:
    return f"hs{depth}l-{optimizer}"


def model_dir(depth: int, optimizer: str, seed: int) -> Path:
    family = family_name(depth, optimizer)
    return BUILD / family / f"{family}-s{seed}"


# ---------------------------------------------------------------------------------------- train


def _train_one(depth: int, optimizer: str, seed: int, steps: int, device: str,
               corpus_json: str | None) -> dict[str, Any]:
    """Train one refit in this (worker) process on one torch thread; return its summary."""
    import torch

    from compute.corpus import BUILTIN_CORPUS_NAME
    from compute.zoo.train import ZooModelConfig, train_zoo_model

    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # training only; every metric is float32
    out = model_dir(depth, optimizer, seed)
    cfg = ZooModelConfig(
        name=out.name, n_layers=depth, seed=seed, optimizer=optimizer, steps=steps,
        weight_decay=WEIGHT_DECAY[optimizer], **ARCH, **TRAINING,  # type: ignore[arg-type]
    )
    documents = json.loads(Path(corpus_json).read_text()) if corpus_json else None
    train_zoo_model(cfg, out, tokenizer_dir=TOKENIZER, device=device, documents=documents,
                    corpus=BUILTIN_CORPUS_NAME if documents else None)
    meta = json.loads((out / "strata_zoo.json").read_text())
    return {"model": out.name, "val_loss": meta["val_loss"], "wall_time_s": meta["wall_time_s"]}


def train(steps: int, workers: int, device: str = "cpu", corpus_json: str | None = None,
          time_limit_s: float | None = None) -> None:
    """Every refit not yet trained, seed-major (every family's seed 0, then seed 1, ...), so a
    run stopped early leaves whole seeds across all six families. `corpus_json`: the built-in
    corpus as extracted by this project's Python (`export-corpus`), for a machine whose Python
    differs (its standard library would give another text). `time_limit_s`: no new model is
    started after this many seconds."""
    import multiprocessing

    jobs = [(d, o, s) for s in SEEDS for d in sorted(DEPTHS, reverse=True) for o in OPTIMIZERS]
    todo = []
    for job in jobs:
        meta = model_dir(*job) / "strata_zoo.json"
        if meta.exists():
            done = json.loads(meta.read_text())
            if done["steps"] != steps:
                raise SystemExit(f"{meta.parent.name} was trained for {done['steps']} steps, not"
                                 f" {steps}: a family must share one budget (delete it or pass"
                                 f" --steps {done['steps']})")
            continue
        todo.append(job)
    print(f"{len(jobs) - len(todo)} of {len(jobs)} models already trained; {len(todo)} to go,"
          f" {steps} steps each, {workers} worker(s) on {device}", flush=True)
    os.environ.update(ENV)
    started = time.perf_counter()
    # spawn: a CUDA device cannot be shared with forked children
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending = list(todo)
        running: dict[Any, tuple[int, str, int]] = {}
        while pending or running:
            while pending and len(running) < workers and (
                    time_limit_s is None or time.perf_counter() - started < time_limit_s):
                job = pending.pop(0)
                running[pool.submit(_train_one, *job, steps, device, corpus_json)] = job
            if not running:
                print(f"time limit: {len(pending)} model(s) not started", flush=True)
                break
            finished = next(as_completed(running))
            running.pop(finished)
            row = finished.result()
            print(f"{row['model']}: val_loss {row['val_loss']} nats/token, training"
                  f" {row['wall_time_s']} s ({time.perf_counter() - started:.0f} s elapsed)",
                  flush=True)


def export_corpus(path: Path) -> None:
    """The built-in corpus's documents as this interpreter extracts them, as JSON (for `train
    --corpus-json` on a machine with another Python)."""
    from compute.corpus import builtin_corpus_documents, documents_fingerprint

    docs = builtin_corpus_documents()
    path.write_text(json.dumps(docs))
    print(f"wrote {path}: {len(docs)} documents, fingerprint {documents_fingerprint(docs)}")


def trained_refits() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every refit of the study: ({depth, optimizer, seed}, its strata_zoo.json)."""
    for d in DEPTHS:
        for o in OPTIMIZERS:
            for s in SEEDS:
                meta = json.loads((model_dir(d, o, s) / "strata_zoo.json").read_text())
                yield {"depth": d, "optimizer": o, "seed": s}, meta


def training_table() -> pl.DataFrame:
    """One row per refit: its budget, losses and the plateau test (`plateau_change`)."""
    from compute.zoo.train import plateau_change

    rows = []
    for key, meta in trained_refits():
        curve = meta.get("val_curve", [])
        rows.append({**key, "steps": meta["steps"],
                     "weight_decay": meta["config"]["weight_decay"],
                     "val_loss": meta["val_loss"],
                     "min_val_loss": min((v for _, v in curve), default=None),
                     "plateau_change": plateau_change(curve) if len(curve) > 1 else None,
                     "final_train_loss": meta["final_train_loss"],
                     "wall_time_s": meta["wall_time_s"],
                     "device": meta.get("device", "cpu")})
    return pl.DataFrame(rows)


def curves_table() -> pl.DataFrame:
    """Every refit's training-loss and validation-loss curves, long."""
    rows = []
    for key, meta in trained_refits():
        for kind, field in (("train", "loss_curve"), ("validation", "val_curve")):
            rows += [{**key, "curve": kind, "step": int(step), "loss": float(loss)}
                     for step, loss in meta.get(field, [])]
    return pl.DataFrame(rows)


# ------------------------------------------------------------------------------- figures, output

COLOURS = {2: "tab:blue", 4: "tab:orange", 6: "tab:green"}
STYLES = {"adamw": "-", "adam": "--"}
LABEL = {"adamw": "AdamW (wd 0.5)", "adam": "Adam (no wd)"}


def figures(frames: dict[str, pl.DataFrame], out: Path) -> list[Path]:
    """The study's figures (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads, layers, corr = frames["heads"], frames["layers"], frames["stability_importance"]
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)

    def by_layer(frame: pl.DataFrame, column: str) -> pl.DataFrame:
        """Per layer: mean over anchors (and heads) and the anchors' min and max."""
        per_anchor = frame.group_by("seed", "layer", "relative_depth").agg(pl.col(column).mean())
        return (per_anchor.group_by("layer", "relative_depth")
                .agg(pl.col(column).mean().alias("mean"), pl.col(column).min().alias("lo"),
                     pl.col(column).max().alias("hi")).sort("layer"))

    # training: validation (and training) loss curves of every refit
    if "curves" in frames:
        curves = frames["curves"]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, o in zip(axes, OPTIMIZERS, strict=True):
            for d in DEPTHS:
                for s in SEEDS:
                    for kind, style in (("validation", "-"), ("train", ":")):
                        c = curves.filter((pl.col("depth") == d) & (pl.col("optimizer") == o)
                                          & (pl.col("seed") == s) & (pl.col("curve") == kind))
                        if kind == "train":  # every 10th step: thin it for the eye
                            c = c.filter(pl.col("step") % 50 == 0)
                        ax.plot(c["step"], c["loss"], style, color=COLOURS[d], linewidth=0.8,
                                alpha=0.8, label=f"{d} layers, {kind}" if s == 0 else None)
            ax.axvspan(0.8 * DEFAULT_STEPS, DEFAULT_STEPS, color="grey", alpha=0.1)
            ax.set_ylim(1.6, 4.5)
            ax.set_title(f"{LABEL[o]}, 5 seeds per depth (grey: last 20% of steps)", fontsize=9)
            ax.set_xlabel("step")
        axes[0].set_ylabel("loss (nats/token)")
        axes[1].legend(fontsize=7)
        save(fig, "training.png")

    # 1a, 2: stability by relative depth, per depth, against the null
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, o in zip(axes, OPTIMIZERS, strict=True):
        for d in DEPTHS:
            hd = heads.filter((pl.col("depth") == d) & (pl.col("optimizer") == o))
            st, nl = by_layer(hd, "stability"), by_layer(hd, "null")
            ax.scatter(hd["relative_depth"], hd["stability"], s=4, alpha=0.2, color=COLOURS[d])
            ax.errorbar(st["relative_depth"], st["mean"],
                        yerr=[st["mean"] - st["lo"], st["hi"] - st["mean"]], color=COLOURS[d],
                        marker="o", capsize=2, label=f"{d} layers (bars: anchors' range)")
            ax.plot(nl["relative_depth"], nl["mean"], color=COLOURS[d], linestyle=":",
                    label=f"{d} layers, random-init null")
        ax.axvspan(*MIDDLE, color="grey", alpha=0.1)
        ax.set_title(LABEL[o])
        ax.set_xlabel("relative depth l / (L-1)")
    axes[0].set_ylabel("heads.stability (matched cosine)")
    axes[1].legend(fontsize=7)
    save(fig, "stability.png")

    # 1b: distinctness = 1 - peer similarity
    fig, ax = plt.subplots(figsize=(6, 4))
    for d in DEPTHS:
        for o in OPTIMIZERS:
            hd = heads.filter((pl.col("depth") == d) & (pl.col("optimizer") == o)).with_columns(
                (1 - pl.col("peer_similarity")).alias("distinctness"))
            g = by_layer(hd, "distinctness")
            ax.plot(g["relative_depth"], g["mean"], color=COLOURS[d], linestyle=STYLES[o],
                    marker="o", label=f"{d} layers, {o}")
    ax.axvspan(*MIDDLE, color="grey", alpha=0.1)
    ax.set_xlabel("relative depth l / (L-1)")
    ax.set_ylabel("distinctness = 1 - heads.peer_similarity")
    ax.legend(fontsize=7)
    save(fig, "distinctness.png")

    # 3: stability vs ablation importance, per head (every anchor)
    fig, axes = plt.subplots(2, 3, figsize=(12, 7))
    for row, o in enumerate(OPTIMIZERS):
        for col, d in enumerate(DEPTHS):
            ax = axes[row][col]
            hd = heads.filter((pl.col("depth") == d) & (pl.col("optimizer") == o))
            cr = corr.filter((pl.col("depth") == d) & (pl.col("optimizer") == o))
            for layer in range(d):
                h = hd.filter(pl.col("layer") == layer)
                r = cr.filter(pl.col("layer") == layer)["pearson"].drop_nulls()
                rtxt = f"{r.mean():+.2f}" if len(r) else "n/a"
                ax.scatter(h["stability"], h["ablation_kl"], s=10,
                           color=plt.cm.viridis(layer / max(1, d - 1)),
                           label=f"L{layer} mean r={rtxt}")
            ax.set_yscale("log")
            ax.set_title(f"{d} layers, {o}", fontsize=9)
            ax.legend(fontsize=6)
            if row == 1:
                ax.set_xlabel("heads.stability")
            if col == 0:
                ax.set_ylabel("heads.ablation_kl (nats)")
    save(fig, "stability_importance.png")

    # 4: AdamW - Adam per layer, paired by seed (the same initialisation and batches)
    fig, ax = plt.subplots(figsize=(6, 4))
    for d in DEPTHS:
        per_seed = (heads.filter(pl.col("depth") == d)
                    .group_by("optimizer", "seed", "layer", "relative_depth")
                    .agg(pl.col("stability").mean())
                    .pivot(on="optimizer", index=["seed", "layer", "relative_depth"],
                           values="stability")
                    .with_columns((pl.col("adamw") - pl.col("adam")).alias("gain")))
        g = by_layer(per_seed, "gain")
        ax.errorbar(g["relative_depth"], g["mean"], yerr=[g["mean"] - g["lo"],
                    g["hi"] - g["mean"]], color=COLOURS[d], marker="o", capsize=2,
                    label=f"{d} layers")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("relative depth l / (L-1)")
    ax.set_ylabel("stability, AdamW - Adam (same seed)")
    ax.set_title("per layer: mean over the 5 seed pairs, bars their range", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, "weight_decay.png")

    # 5: residual CKA and head stability, each with its null
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, o in zip(axes, OPTIMIZERS, strict=True):
        for d in DEPTHS:
            ly = layers.filter((pl.col("depth") == d) & (pl.col("optimizer") == o))
            lay = (ly.group_by("layer", "relative_depth")
                   .agg(pl.col("cka_linear", "cka_null_linear", "stability", "null").mean())
                   .sort("layer"))
            ax.plot(lay["relative_depth"], lay["cka_linear"], color=COLOURS[d], marker="s",
                    label=f"{d}L residual CKA (linear)")
            ax.plot(lay["relative_depth"], lay["cka_null_linear"], color=COLOURS[d],
                    linestyle=":", marker="s", markersize=3, label=f"{d}L its null")
            ax.plot(lay["relative_depth"], lay["stability"], color=COLOURS[d], linestyle="--",
                    marker="o", label=f"{d}L head stability")
            ax.plot(lay["relative_depth"], lay["null"], color=COLOURS[d], linestyle="-.",
                    marker="o", markersize=3, label=f"{d}L its null")
        ax.set_title(LABEL[o])
        ax.set_xlabel("relative depth l / (L-1)")
    axes[0].set_ylabel("similarity across refits (mean over anchors)")
    axes[1].legend(fontsize=6, ncol=2)
    save(fig, "residual.png")
    return paths


def write_outputs(frames: dict[str, pl.DataFrame], results: list[Claim]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        frame.write_parquet(RESULTS / f"{name}.parquet")
    (RESULTS / "claims.json").write_text(json.dumps(
        {"definitions": {"middle_band_relative_depth": list(MIDDLE), "deeper_from": DEEPER,
                         "bootstrap_resamples": N_BOOT, "level": LEVEL, "bootstrap_seed": 0},
         "claims": [asdict(c) for c in results]}, indent=2) + "\n")
    (RESULTS / "claims.md").write_text(claims_markdown(results))


def claims_markdown(results: list[Claim]) -> str:
    """The claim table as Markdown (results/head-stability/claims.md; the study doc quotes it)."""
    lines = ["| claim | statistic | estimate | 95% interval | one anchor at a time (min to max) "
             "| predicted | interval over | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in results:
        spread = list(c.per_anchor.values())
        lines.append(f"| {c.claim} | {c.statistic} | {c.estimate:+.3f} | [{c.low:+.3f}, "
                     f"{c.high:+.3f}] | {min(spread):+.3f} to {max(spread):+.3f} "
                     f"| {c.predicted} | {c.interval} | **{c.verdict}** |")
    return "\n".join(lines) + "\n"


def print_claims(results: list[Claim]) -> None:
    for c in results:
        parts = ", ".join(f"{k} {v:+.3f}" for k, v in c.parts.items())
        anchors = ", ".join(f"{k} {v:+.3f}" for k, v in c.per_anchor.items())
        print(f"claim {c.claim}: {c.statistic} = {c.estimate:+.4f} [{c.low:+.4f}, {c.high:+.4f}]"
              f" (predicted {c.predicted}; {c.interval}) -> {c.verdict}\n    {parts}\n"
              f"    {anchors}")


def analyse() -> None:
    started = time.perf_counter()
    frames = serve_and_fetch()
    frames["training"] = training_table()
    frames["curves"] = curves_table()
    results = claims(frames)
    write_outputs(frames, results)
    for path in figures(frames, FIGURES):
        print(f"wrote {path.relative_to(ROOT)}")
    print_claims(results)
    print(f"analysis took {time.perf_counter() - started:.0f} s")


def rescore() -> None:
    """The claims again from the stored frames (results/head-stability/*.parquet, what
    `analyse` read from the service), without a service or the checkpoints: rewrites
    claims.json and claims.md only."""
    started = time.perf_counter()
    frames = {name: pl.read_parquet(RESULTS / f"{name}.parquet")
              for name in ("heads", "layers", "stability_importance")}
    results = claims(frames)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "claims.json").write_text(json.dumps(
        {"definitions": {"middle_band_relative_depth": list(MIDDLE), "deeper_from": DEEPER,
                         "bootstrap_resamples": N_BOOT, "level": LEVEL, "bootstrap_seed": 0},
         "claims": [asdict(c) for c in results]}, indent=2) + "\n")
    (RESULTS / "claims.md").write_text(claims_markdown(results))
    print_claims(results)
    print(f"rescoring took {time.perf_counter() - started:.0f} s")


# ---------------------------------------------------------------------------------------- store


def _strata(*args: str) -> None:
    """One `strata` command, niced, on one torch thread (see the module docstring)."""
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1", "STRATA_DATABASE": str(database())}
    # niced to 10 in all: a caller already under `nice -n 10` adds nothing
    cmd = ["nice", "-n", str(max(0, 10 - os.nice(0))), str(ROOT / ".venv" / "bin" / "strata"),
           *args]
    print("$ strata " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def database() -> Path:
    return Path(os.environ.get("STRATA_DATABASE", BUILD / "strata.duckdb"))


def anchored_name(depth: int, optimizer: str, seed: int) -> str:
    """The stored family of one anchor: every seed is the anchor once (`<family>-a<seed>`)."""
    return f"{family_name(depth, optimizer)}-a{seed}"


def store() -> None:
    """Per family and per anchor seed: the stability run (that seed against the others, with
    the null models) and the anchor's heads run, stored (skipped when done, and while a refit
    is still training: run it again, alongside `train`, until every family is)."""
    for d in DEPTHS:
        for o in OPTIMIZERS:
            family = family_name(d, o)
            if not all((model_dir(d, o, s) / "strata_zoo.json").exists() for s in SEEDS):
                print(f"{family}: not all refits trained yet, skipped", flush=True)
                continue
            for seed in SEEDS:
                name = anchored_name(d, o, seed)
                done = BUILD / f".stored-{name}"
                if done.exists():
                    continue
                anchor = model_dir(d, o, seed)
                started = time.perf_counter()
                _strata("stability", "--family", str(BUILD / family), "--anchor", anchor.name,
                        "--n-null", str(N_NULL), "--store", "--name", name, "--out",
                        str(BUILD / f"stability-{name}.parquet"))
                _strata("compute", "--model", str(anchor), "--metrics", "heads",
                        "--n-sequences", str(HEADS_RUN["n_sequences"]), "--seq-len",
                        str(HEADS_RUN["seq_len"]), "--store", "--quiet")
                done.write_text(f"{time.perf_counter() - started:.1f}\n")
                print(f"{name}: stored in {done.read_text().strip()} s", flush=True)


# ------------------------------------------------------------------------------- read back (API)


def fetch(url: str, families: Sequence[tuple[str, int, str, int]] | None = None
          ) -> dict[str, pl.DataFrame]:
    """Everything the claims need, read through the Python client from a running service.
    `families`: (stored name, depth, optimizer, anchor seed), by default the study's six
    families with each seed as the anchor once."""
    from service.client import Client

    if families is None:
        families = [(anchored_name(d, o, s), d, o, s)
                    for d in DEPTHS for o in OPTIMIZERS for s in SEEDS]
    heads, layers, corr = [], [], []
    renames = {
        "heads.stability": "stability", "heads.stability_std": "stability_std",
        "heads.stability_null": "null", "heads.stability_null_std": "null_std",
        "heads.residual_cka.linear": "cka_linear", "heads.residual_cka.rbf": "cka_rbf",
        "heads.residual_cka_null.linear": "cka_null_linear",
        "heads.residual_cka_null.rbf": "cka_null_rbf",
        "heads.peer_similarity": "peer_similarity",
    }
    with Client(url) as client:
        anchors = {f.name: f.anchor.name for f in client.families()}
        for stored, d, o, seed in families:
            tag = [pl.lit(family_name(d, o)).alias("family"), pl.lit(d).alias("depth"),
                   pl.lit(o).alias("optimizer"), pl.lit(seed).alias("seed")]
            rows = client.stability(stored, per_head=True)
            per_layer = rows.filter(pl.col("head").is_null())
            wide = per_layer.pivot(on="metric", index=["layer", "relative_depth"],
                                   values="value")
            cka_se = per_layer.filter(pl.col("metric") == "heads.residual_cka.linear").select(
                "layer", pl.col("stderr").alias("cka_linear_stderr"))
            layers.append(wide.rename({k: v for k, v in renames.items() if k in wide.columns})
                          .join(cka_se, on="layer").with_columns(tag))
            per_head = rows.filter(pl.col("head").is_not_null())

            def column(metric: str, alias: str, frame: pl.DataFrame = per_head) -> pl.DataFrame:
                return frame.filter(pl.col("metric") == metric).select(
                    "layer", "head", pl.col("value").alias(alias))

            stab = per_head.filter(pl.col("metric") == "heads.stability").select(
                "layer", "head", "relative_depth", pl.col("value").alias("stability"),
                pl.col("stderr").alias("stability_stderr"))
            anchor = anchors[stored]
            kl = client.heads(anchor, "heads.ablation_kl").select(
                "layer", "head", pl.col("value").alias("ablation_kl"))
            dloss = client.heads(anchor, "heads.ablation_loss_delta").select(
                "layer", "head", pl.col("value").alias("ablation_loss_delta"))
            heads.append(stab.join(column("heads.stability_null", "null"), on=["layer", "head"])
                         .join(column("heads.peer_similarity", "peer_similarity"),
                               on=["layer", "head"])
                         .join(kl, on=["layer", "head"])
                         .join(dloss, on=["layer", "head"]).with_columns(tag))
            corr.append(client.stability_importance(stored).with_columns(tag))
    return {"heads": pl.concat(heads).sort("depth", "optimizer", "seed", "layer", "head"),
            "layers": pl.concat(layers, how="diagonal").sort("depth", "optimizer", "seed",
                                                              "layer"),
            "stability_importance": pl.concat(corr).sort("depth", "optimizer", "seed", "layer")}


def serve_and_fetch(families: Sequence[tuple[str, int, str, int]] | None = None
                    ) -> dict[str, pl.DataFrame]:
    """Start `strata serve` on the study database, read everything back, stop it."""
    import httpx

    port = int(os.environ.get("STUDY_PORT", "8731"))
    url = f"http://127.0.0.1:{port}"
    # A private state folder (broker, logs) and no reconciliation: the service only reads; it
    # must neither queue default runs nor publish them where another checkout's worker listens.
    env = {**os.environ, **ENV, "STRATA_DATABASE": str(database()),
           "STRATA_DATA_DIR": str(BUILD / "state"), "STRATA_JOBS__RECONCILE": "false"}
    cmd = [str(ROOT / ".venv" / "bin" / "strata"), "serve", "--port", str(port),
           "--no-local-worker", "--log-level", "warning"]
    server = subprocess.Popen(cmd, env=env, cwd=ROOT)
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"strata serve exited with {server.returncode}")
            time.sleep(0.5)
        return fetch(url, families)
    finally:
        server.terminate()
        server.wait(timeout=30)


# -------------------------------------------------------------------------------------- claims

MIDDLE = (0.25, 0.75)  # relative depth l / (L-1) of a "middle" layer, bounds included
DEEPER = 0.5  # claim 3's "deeper layers": relative depth >= 0.5
N_BOOT = 10_000
LEVEL = 0.95
HEAD_COLUMNS = ("stability", "null", "peer_similarity", "ablation_kl")
LAYER_COLUMNS = ("stability", "null", "cka_linear", "cka_null_linear")


@dataclass(frozen=True)
class Claim:
    """One claim's deciding number: estimate, its interval, the direction the claim predicts
    and the verdict that follows (`verdict`); `parts` breaks it down (per family or depth) and
    `per_anchor` is the same statistic with each seed as the only anchor (the spread an
    analysis with one anchor would not show)."""

    claim: str
    statistic: str
    estimate: float
    low: float
    high: float
    predicted: str  # "<0" or ">0"
    interval: str  # what the interval is over
    verdict: str
    parts: dict[str, float]
    per_anchor: dict[str, float]


def verdict(low: float, high: float, predicted: str) -> str:
    """`holds` when the whole interval lies on the predicted side of zero, `does not hold` when
    it lies wholly on the other side, else `cannot tell`."""
    if predicted not in ("<0", ">0"):
        raise ValueError(f"predicted must be '<0' or '>0', not {predicted!r}")
    sign = -1.0 if predicted == "<0" else 1.0
    if sign * low > 0 and sign * high > 0:
        return "holds"
    if sign * low < 0 and sign * high < 0:
        return "does not hold"
    return "cannot tell"


def bootstrap(groups: Sequence[np.ndarray], stat: Any, *, n_boot: int = N_BOOT, seed: int = 0,
              level: float = LEVEL) -> tuple[float, float, float]:
    """`stat(*groups)` and its percentile interval, resampling each group (a stratum) with
    replacement independently. Returns (estimate, low, high)."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if any(len(a) == 0 for a in arrays):
        raise ValueError("every stratum needs at least one value")
    draws = np.empty(n_boot)
    for i in range(n_boot):
        draws[i] = stat(*[a[rng.integers(0, len(a), len(a))] for a in arrays])
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return float(stat(*arrays)), float(low), float(high)


def bootstrap_mean(values: np.ndarray, **kw: Any) -> tuple[float, float, float]:
    return bootstrap([values], np.mean, **kw)


def t_pool(z: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    """Random-effects pool of per-unit Fisher z values whose sampling variances are equal (each
    unit: one layer's 4 heads, averaged over the same anchors): the pooled z is their mean and
    its interval the Student-t interval over the units, so the spread between units (the
    between-layer variance tau^2 a fixed-effect pool ignores) sets the width; back through
    tanh. Returns (r, low, high)."""
    from scipy.stats import t

    z = np.asarray(z, float)
    if len(z) < 2:
        raise ValueError("a random-effects pool needs at least two units")
    mean, se = float(z.mean()), float(z.std(ddof=1) / math.sqrt(len(z)))
    half = float(t.ppf(0.5 + level / 2, len(z) - 1)) * se
    return math.tanh(mean), math.tanh(mean - half), math.tanh(mean + half)


def cochran_q(z: np.ndarray, n: np.ndarray) -> float:
    """Cochran's Q of per-unit Fisher z with sampling variances 1 / (n - 3): how far the units
    disagree beyond sampling error (about its df = units - 1 when they agree)."""
    z, w = np.asarray(z, float), np.asarray(n, float) - 3
    pooled = float(np.sum(w * z) / w.sum())
    return float(np.sum(w * (z - pooled) ** 2))


@dataclass
class Cube:
    """One family's per-head numbers as arrays [anchor seed, layer, head] (and per layer
    [anchor seed, layer]), the unit the hierarchical bootstrap resamples."""

    depth: int
    optimizer: str
    seeds: list[int]
    relative_depth: np.ndarray  # [layer]
    heads: dict[str, np.ndarray]  # column -> [seed, layer, head]
    layers: dict[str, np.ndarray]  # column -> [seed, layer]

    def take(self, seeds: np.ndarray, head_index: np.ndarray | None) -> Cube:
        """The cube with anchors `seeds` (indices, repeats allowed) and, per (anchor, layer),
        heads `head_index` [len(seeds), layer, head] (None: all heads, as they are)."""
        heads = {}
        for name, values in self.heads.items():
            picked = values[seeds]
            if head_index is not None:
                picked = np.take_along_axis(picked, head_index, axis=2)
            heads[name] = picked
        return Cube(self.depth, self.optimizer, [self.seeds[i] for i in seeds],
                    self.relative_depth, heads, {k: v[seeds] for k, v in self.layers.items()})


def cubes_of(heads: pl.DataFrame, layers: pl.DataFrame) -> dict[str, Cube]:
    """The frames as one `Cube` per family (`family` = the six refit families; `seed` = the
    anchor)."""
    out = {}
    for (family,), hd in heads.group_by("family", maintain_order=True):
        hd = hd.sort("seed", "layer", "head")
        seeds = sorted(hd["seed"].unique().to_list())
        n_layers, n_heads = hd["layer"].max() + 1, hd["head"].max() + 1
        shape = (len(seeds), n_layers, n_heads)
        ly = layers.filter(pl.col("family") == family).sort("seed", "layer")
        rel = hd.filter((pl.col("seed") == seeds[0]) & (pl.col("head") == 0))
        out[str(family)] = Cube(
            depth=int(hd["depth"][0]), optimizer=str(hd["optimizer"][0]), seeds=seeds,
            relative_depth=rel["relative_depth"].to_numpy(),
            heads={c: hd[c].to_numpy().reshape(shape) for c in HEAD_COLUMNS if c in hd.columns},
            layers={c: ly[c].to_numpy().reshape(len(seeds), n_layers)
                    for c in LAYER_COLUMNS if c in ly.columns})
    return out


def hierarchical_bootstrap(cubes: dict[str, Cube], stat: Any, *, n_boot: int = N_BOOT,
                           seed: int = 0, level: float = LEVEL, heads: bool = True
                           ) -> tuple[float, float, float]:
    """`stat(cubes)` and its percentile interval under a two-level resample: the anchor seeds
    with replacement, one draw shared by every family (so AdamW and Adam of one seed, which
    share initialisation and batches, stay paired), then each (anchor, layer)'s heads with
    replacement (`heads=False`: the heads as they are, for layer-level statistics)."""
    rng = np.random.default_rng(seed)
    n_seeds = {len(c.seeds) for c in cubes.values()}
    if len(n_seeds) != 1:
        raise ValueError("every family needs the same anchor seeds")
    s = n_seeds.pop()
    draws = np.empty(n_boot)
    for i in range(n_boot):
        picked = rng.integers(0, s, s)
        resampled = {}
        for name, cube in cubes.items():
            shape = next(iter(cube.heads.values())).shape
            index = rng.integers(0, shape[2], shape) if heads else None
            resampled[name] = cube.take(picked, index)
        draws[i] = stat(resampled)
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return float(stat(cubes)), float(low), float(high)


def per_anchor(cubes: dict[str, Cube], stat: Any) -> dict[str, float]:
    """The statistic with each anchor seed alone."""
    seeds = next(iter(cubes.values())).seeds
    return {f"anchor s{s}": float(stat({k: c.take(np.array([i]), None)
                                        for k, c in cubes.items()}))
            for i, s in enumerate(seeds)}


def _claim(name: str, statistic: str, cubes: dict[str, Cube], stat: Any, predicted: str,
           parts: dict[str, float], *, n_boot: int, heads: bool = True) -> Claim:
    est, low, high = hierarchical_bootstrap(cubes, stat, n_boot=n_boot, heads=heads)
    over = ("anchor seeds (paired across optimizers), then heads within (anchor, layer)"
            if heads else "anchor seeds (paired across optimizers)")
    return Claim(name, statistic, est, low, high, predicted, over,
                 verdict(low, high, predicted), parts, per_anchor(cubes, stat))


def head_values(cube: Cube, column: str) -> np.ndarray:
    """[seed, layer, head] of a column, or a derived one: excess = stability - null,
    distinctness = 1 - peer_similarity."""
    if column == "excess":
        return cube.heads["stability"] - cube.heads["null"]
    if column == "distinctness":
        return 1.0 - cube.heads["peer_similarity"]
    return cube.heads[column]


def band_dip(cube: Cube, column: str, *, first_layer: bool = True) -> float:
    """Mean over middle-band heads minus mean over edge heads (all anchors pooled);
    `first_layer=False` leaves layer 0 out of the edge."""
    values = head_values(cube, column)
    rel = cube.relative_depth
    middle = (rel >= MIDDLE[0]) & (rel <= MIDDLE[1])
    edge = ~middle
    if not first_layer:
        edge = edge & (np.arange(len(rel)) > 0)
    return float(values[:, middle].mean() - values[:, edge].mean())


def _with_middle(cubes: dict[str, Cube]) -> dict[str, Cube]:
    return {k: c for k, c in sorted(cubes.items()) if c.depth >= 3}


def claim_1(cubes: dict[str, Cube], n_boot: int = N_BOOT) -> list[Claim]:
    """(1a) middle-layer heads are the least stable: mean stability of middle heads minus edge
    heads (< 0), with and without layer 0 in the edge; (1a') the same on the excess over the
    null; (1b) ... yet the most distinct: the same for distinctness = 1 - peer similarity, how
    unlike the other heads of its own layer a head attends (> 0; no refit or null enters it,
    so it is not 1a by another name). Families with a middle band (depth >= 3), averaged."""
    fams = _with_middle(cubes)
    out = []
    for name, column, predicted in (("1a", "stability", "<0"), ("1a'", "excess", "<0"),
                                    ("1b", "distinctness", ">0")):
        for first in (True, False):
            def stat(c: dict[str, Cube], column: str = column, first: bool = first) -> float:
                return float(np.mean([band_dip(x, column, first_layer=first)
                                      for x in c.values()]))

            label = name if first else f"{name} (no layer 0)"
            parts = {k: band_dip(c, column, first_layer=first) for k, c in fams.items()}
            out.append(_claim(label, f"mean {column}: middle heads - edge heads"
                              + ("" if first else ", layer 0 left out"), fams, stat, predicted,
                              parts, n_boot=n_boot))
    return out


def claim_2(cubes: dict[str, Cube], n_boot: int = N_BOOT, *, first_layer: bool = True
            ) -> Claim:
    """Deeper models diverge more at mid-depth: the middle - edge dip of the deepest family
    minus that of the shallowest family with a middle band, per optimizer, averaged (< 0);
    `first_layer=False` leaves layer 0 out of the edge ("2 (no layer 0)"): the dip of claim 1
    rests on layer 0, so claim 2 is scored both ways."""
    fams = _with_middle(cubes)
    depths = sorted({c.depth for c in fams.values()})
    shallow, deep = depths[0], depths[-1]
    optimizers = sorted({c.optimizer for c in fams.values()})

    def dip(c: dict[str, Cube], o: str) -> float:
        return (band_dip(c[f"hs{deep}l-{o}"], "stability", first_layer=first_layer)
                - band_dip(c[f"hs{shallow}l-{o}"], "stability", first_layer=first_layer))

    def stat(c: dict[str, Cube]) -> float:
        return float(np.mean([dip(c, o) for o in optimizers]))

    parts = {o: dip(fams, o) for o in optimizers}
    return _claim("2" if first_layer else "2 (no layer 0)",
                  f"mid-depth dip (middle - edge) of {deep} layers minus {shallow} layers"
                  + ("" if first_layer else ", layer 0 left out"),
                  fams, stat, "<0", parts, n_boot=n_boot)


def claim_3(corr: pl.DataFrame, *, column: str = "pearson") -> Claim:
    """Unstable heads in deeper layers matter more: the within-layer correlation between
    stability and ablation importance (heads.ablation_kl) over the layers at relative depth
    >= DEEPER. Each (family, layer) is one unit: its Fisher z averaged over the anchors (the
    anchors' correlations share the refits, so they are not independent samples); the units
    pooled by `t_pool` (random effects), so the effective n is the number of layers (< 0)."""
    deep = corr.filter((pl.col("relative_depth") >= DEEPER) & pl.col(column).is_not_null())
    units = (deep.with_columns(pl.col(column).clip(-0.999999, 0.999999).arctanh().alias("z"))
             .group_by("family", "layer", maintain_order=True)
             .agg(pl.col("z").mean(), pl.col("n_heads").first(), pl.col("seed").n_unique()))
    est, low, high = t_pool(units["z"].to_numpy())
    q = cochran_q(units["z"].to_numpy(), units["n_heads"].to_numpy())
    parts = {f"{r['family']} L{r['layer']}": math.tanh(r["z"])
             for r in units.iter_rows(named=True)}
    anchors = {}
    for (s,), g in deep.group_by("seed", maintain_order=True):
        z = np.arctanh(np.clip(g[column].to_numpy(), -0.999999, 0.999999))
        anchors[f"anchor s{s}"] = math.tanh(float(z.mean()))
    name = "3" if column == "pearson" else "3'"
    return Claim(name, f"pooled within-layer {column} r(stability, heads.ablation_kl), deeper "
                 "layers", est, low, high, "<0",
                 f"random effects (t over {units.height} layers = the effective n; Cochran's Q "
                 f"{q:.1f} on {units.height - 1} df)", verdict(low, high, "<0"), parts,
                 dict(sorted(anchors.items())))


def claim_4(cubes: dict[str, Cube], n_boot: int = N_BOOT, column: str = "stability") -> Claim:
    """Weight decay improves stability: mean head stability AdamW - Adam per depth, averaged
    over depths (> 0); `column="excess"` (stability - null) is claim 4'. The bootstrap pairs
    the two optimizers by seed."""
    depths = sorted({c.depth for c in cubes.values()})

    def gain(c: dict[str, Cube], d: int) -> float:
        return float(head_values(c[f"hs{d}l-adamw"], column).mean()
                     - head_values(c[f"hs{d}l-adam"], column).mean())

    def stat(c: dict[str, Cube]) -> float:
        return float(np.mean([gain(c, d) for d in depths]))

    parts = {f"{d} layers": gain(cubes, d) for d in depths}
    return _claim("4" if column == "stability" else "4'",
                  f"mean head {column} AdamW - Adam (mean over depths)", cubes, stat, ">0",
                  parts, n_boot=n_boot)


def claim_5(cubes: dict[str, Cube], n_boot: int = N_BOOT) -> list[Claim]:
    """The residual stream is comparatively stable. Not scored as a comparison: the residual's
    linear CKA and the heads' matched pattern cosine are different similarity measures, and no
    transformation here (not even the fraction of the way from each one's null to 1) puts them
    on one scale, so a difference between them has no meaning. What is scored is each side
    against its own null, in its own units, averaged over every (family, anchor, layer): "5
    (residual)" = linear CKA - its random-init null (> 0), "5 (heads)" = the layer's mean head
    stability - its null (> 0). The comparison the claim makes is left to the reader, in words."""
    def gap(c: Cube, side: str) -> np.ndarray:
        if side == "residual":
            return c.layers["cka_linear"] - c.layers["cka_null_linear"]
        return c.layers["stability"] - c.layers["null"]

    out = []
    for side, what in (("residual", "residual linear CKA - its null (CKA units)"),
                       ("heads", "layer mean head stability - its null (cosine units)")):
        def stat(c: dict[str, Cube], side: str = side) -> float:
            return float(np.mean(np.concatenate([gap(x, side).ravel() for x in c.values()])))

        parts = {k: float(gap(c, side).mean()) for k, c in sorted(cubes.items())}
        out.append(_claim(f"5 ({side})", f"{what}, per layer", cubes, stat, ">0", parts,
                          n_boot=n_boot, heads=False))
    return out


def claims(frames: dict[str, pl.DataFrame], n_boot: int = N_BOOT) -> list[Claim]:
    cubes = cubes_of(frames["heads"], frames["layers"])
    corr = frames["stability_importance"]
    return [*claim_1(cubes, n_boot), claim_2(cubes, n_boot),
            claim_2(cubes, n_boot, first_layer=False), claim_3(corr),
            claim_3(corr, column="spearman"), claim_4(cubes, n_boot),
            claim_4(cubes, n_boot, column="excess"), *claim_5(cubes, n_boot)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["train", "store", "analyse", "all", "export-corpus",
                                          "rescore"])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="train on this device (cuda, say)")
    parser.add_argument("--corpus-json", default=None,
                        help="train on this export of the built-in corpus (export-corpus)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="train: start no model after this many seconds")
    parser.add_argument("--out", default=None, help="export-corpus: the JSON file")
    args = parser.parse_args(argv)
    if args.stage == "export-corpus":
        export_corpus(Path(args.out or BUILD / "corpus.json"))
        return
    if args.stage in ("train", "all"):
        train(args.steps, args.workers, args.device, args.corpus_json, args.time_limit)
    if args.stage in ("store", "all"):
        store()
    if args.stage in ("analyse", "all"):
        analyse()
    if args.stage == "rescore":
        rescore()


if __name__ == "__main__":
    main()
