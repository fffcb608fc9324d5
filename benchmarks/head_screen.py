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
    """Whole-process wall time of each family's `strata compute` (float32, engine defaults), one
    after the other; with --keep the outputs are written there (the screen's validation reads
    them), else to a temporary folder."""
    import resource

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        for family in args.families.split(","):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "service.cli", "compute", "--model", args.model,
                 "--metrics", family, "--n-sequences", str(args.n_sequences), "--seq-len",
                 str(args.seq_len), "--dtype", "float32",
                 "--out", str(folder / f"{family}.parquet"), "--quiet"],
                check=True, env=env, cwd=ROOT,
            )
            out[family] = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            # CPU seconds of the process: on a machine shared with other work, the measure
            # that does not depend on what else ran (the processes use the threads they get)
            out[f"{family}_cpu_s"] = (after.ru_utime - before.ru_utime) + (
                after.ru_stime - before.ru_stime)
    if "heads" in out:
        for family in args.families.split(","):
            if family != "heads":
                out[f"{family}/heads wall"] = out[family] / out["heads"]
                out[f"{family}/heads cpu"] = out[f"{family}_cpu_s"] / out["heads_cpu_s"]
    print(json.dumps(out, indent=1))


def validate_files(args: argparse.Namespace) -> None:
    """A `heads_screen` run's output against exact `heads` on the same tokens (two exported
    runs): the screen alone over all heads, and whether its exact top k hold the exact top 10."""
    screen_run = pl.read_parquet(args.screen_from)
    exported = pl.read_parquet(args.exact_from)

    def heads_of(frame: pl.DataFrame, metric: str) -> pl.DataFrame:
        return _heads(frame, metric).with_columns(pl.col("layer", "head").cast(pl.Int64))

    loss = heads_of(exported, "heads.ablation_loss_delta")
    result = compare(loss, heads_of(exported, "heads.ablation_kl"),
                     heads_of(screen_run, "heads_screen.loss_delta"))
    measured = heads_of(screen_run, "heads_screen.ablation_loss_delta")
    exact_top = loss.sort("value", descending=True).head(TOP)
    held = exact_top.join(measured, on=["layer", "head"], suffix="_topk")
    result["top_k"] = len(measured)
    result["exact_top10_in_top_k"] = len(held)
    result["top_k_values_max_abs_diff"] = float(
        (held["value"] - held["value_topk"]).abs().max() or 0.0) if len(held) else None
    result["n_sequences"] = int(screen_run["n"].max())
    screen = heads_of(screen_run, "heads_screen.loss_delta").sort("value", descending=True)
    order = [f"{a}.{b}" for a, b in zip(screen["layer"], screen["head"], strict=True)]
    wanted = {f"{a}.{b}" for a, b in zip(exact_top["layer"], exact_top["head"], strict=True)}
    # the k the exact top 10 would have needed: the deepest screen rank among them
    result["k_for_exact_top10"] = max(order.index(n) for n in wanted) + 1
    result["exact_top10_in_screen_top_k"] = {
        k: len(wanted & set(order[:k])) for k in (10, 15, 20, 30)}
    print(json.dumps(result, indent=1))


def _model_and_tokens(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model in float32 (one torch thread per OMP_NUM_THREADS) and the tokens `strata
    compute` would use: the built-in corpus, seed 0, `--n-sequences` x `--seq-len`."""
    import torch

    from compute.models import Processing, load_model, resolve_model_spec
    from compute.tokens import TokenSpec, load_tokens, resolve_token_spec

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    lm = load_model(resolve_model_spec(args.model, dtype="float32", processing=Processing()))
    spec = resolve_token_spec(
        TokenSpec(source="builtin", n_sequences=args.n_sequences, seq_len=args.seq_len, seed=0)
    )
    tokens = load_tokens(
        spec, lm.tokenizer, bos_token_id=lm.bos_token_id, d_vocab=lm.d_vocab, n_ctx=lm.n_ctx
    )
    return lm, tokens


def _clean_batches(lm: Any, tokens: Any, batch: int, opts: Any) -> Any:
    """(first sequence, tokens, clean pass with z) of each batch of `batch` sequences."""
    from compute.metrics.heads_screen import clean_context

    for first in range(0, tokens.shape[0], batch):
        chunk = tokens[first : first + batch]
        yield first, chunk, clean_context(lm, chunk, opts)


def variants(args: argparse.Namespace) -> None:
    """Per sequence and head, the screen's terms at each path point and AtP, on the tokens
    `strata compute` would use (the built-in corpus, seed 0): the measurement that chose the
    default number of steps. Gradients at the points alpha = i / points (i < points) are
    computed once each; S steps of `heads_screen` average the first-order terms at alpha =
    j / S, which for S dividing `points` are among them."""
    import torch

    from compute.metrics.base import EngineOptions
    from compute.metrics.heads import ablated_block_output, head_group_size
    from compute.metrics.heads_atp import atp_loss_delta
    from compute.metrics.heads_screen import path_points, residual_gradients

    start = time.perf_counter()
    lm, tokens = _model_and_tokens(args)
    opts = EngineOptions()
    alphas = path_points(args.points)
    rows: list[dict[str, Any]] = []
    seconds = {"load": time.perf_counter() - start, "atp": 0.0, "gradients": 0.0, "deltas": 0.0}
    with torch.inference_mode():
        for first, chunk, ctx in _clean_batches(lm, tokens, args.batch, opts):
            b, t = chunk.shape
            mark = time.perf_counter()
            for layer, est in zip(lm.attention_layers, atp_loss_delta(ctx, opts), strict=True):
                for h in range(est.shape[0]):
                    for i in range(b):
                        rows.append({"estimator": "atp", "layer": layer, "head": h,
                                     "sequence": first + i, "value": float(est[h, i])})
            seconds["atp"] += time.perf_counter() - mark
            mark = time.perf_counter()
            grads = [residual_gradients(lm, chunk, ctx.resid[0], [a], opts) for a in alphas]
            seconds["gradients"] += time.perf_counter() - mark
            mark = time.perf_counter()
            for index, layer in enumerate(lm.attention_layers):
                heads = lm.layers[layer].heads
                assert heads is not None
                chunk_heads = head_group_size(lm, b, t, opts, heads.n_heads)
                for g0 in range(0, heads.n_heads, chunk_heads):
                    group = list(range(g0, min(heads.n_heads, g0 + chunk_heads)))
                    after = ablated_block_output(ctx, layer, group).unflatten(0, (len(group), b))
                    delta = after.float() - ctx.resid[layer + 1].float()[None]
                    for alpha, per_point in zip(alphas, grads, strict=True):
                        est = (delta * per_point.mean[index][None]).sum(dim=(2, 3)) / (t - 2)
                        for gi, h in enumerate(group):
                            for i in range(b):
                                rows.append({"estimator": f"alpha={alpha:.4f}", "layer": layer,
                                             "head": h, "sequence": first + i,
                                             "value": float(est[gi, i])})
            seconds["deltas"] += time.perf_counter() - mark
            print(f"batch at {first} done, {time.perf_counter() - start:.0f} s", flush=True)
    pl.DataFrame(rows).write_parquet(args.out)
    print(json.dumps({k: round(v, 1) for k, v in seconds.items()}))


def per_sequence(args: argparse.Namespace) -> None:
    """Per sequence and head, on the tokens `strata compute` would use (the built-in corpus,
    seed 0): the screen's two terms at its defaults (`first`: (r_h - r) . g; `curvature`: half
    the mean over the draws of ((r_h - r) . s)^2; each over the T-2 evaluated positions) and
    the exact `heads.ablation_loss_delta` (`exact`, nats) and `heads.ablation_kl` (`exact_kl`,
    nats), each from the implementation the families call. The data the screen's calibration
    is chosen and checked on (`calibrate`)."""
    import torch

    from compute.metrics.base import EngineOptions
    from compute.metrics.heads import ablated_block_output, head_ablations, head_groups
    from compute.metrics.heads_screen import path_points, residual_gradients

    start = time.perf_counter()
    lm, tokens = _model_and_tokens(args)
    opts = EngineOptions()
    rows: list[dict[str, Any]] = []
    seconds = {"load": time.perf_counter() - start, "screen": 0.0, "exact": 0.0}

    def emit(name: str, layer: int, group: list[int], first: int, value: Any) -> None:
        for gi, h in enumerate(group):
            for i in range(value.shape[1]):
                rows.append({"estimator": name, "layer": layer, "head": h,
                             "sequence": first + i, "value": float(value[gi, i])})

    with torch.inference_mode():
        for first, chunk, ctx in _clean_batches(lm, tokens, args.batch, opts):
            b, t = chunk.shape
            mark = time.perf_counter()
            grads = residual_gradients(lm, chunk, ctx.resid[0], path_points(1), opts,
                                       samples=opts.screen_samples, first_sequence=first)
            for index, layer in enumerate(lm.attention_layers):
                heads = lm.layers[layer].heads
                assert heads is not None
                for group in head_groups(ctx, list(range(heads.n_heads)), opts):
                    after = ablated_block_output(ctx, layer, group).unflatten(0, (len(group), b))
                    delta = after.float() - ctx.resid[layer + 1].float()[None]
                    first_order = (delta * grads.mean[index][None]).sum(dim=(2, 3)) / (t - 2)
                    along = torch.einsum("gbpd,mbpd->gmb", delta, grads.sampled[index])
                    emit("first", layer, group, first, first_order)
                    emit("curvature", layer, group, first, 0.5 * along.square().mean(1) / (t - 2))
            seconds["screen"] += time.perf_counter() - mark
            mark = time.perf_counter()
            for layer in lm.attention_layers:
                heads = lm.layers[layer].heads
                assert heads is not None
                for group in head_groups(ctx, list(range(heads.n_heads)), opts):
                    kl, loss_delta = head_ablations(ctx, layer, group)
                    emit("exact", layer, group, first, loss_delta.view(len(group), b, -1).mean(-1))
                    emit("exact_kl", layer, group, first, kl.view(len(group), b, -1).mean(-1))
            seconds["exact"] += time.perf_counter() - mark
            print(f"batch at {first} done, {time.perf_counter() - start:.0f} s", flush=True)
    pl.DataFrame(rows).write_parquet(args.out)
    print(json.dumps({k: round(v, 1) for k, v in seconds.items()}))


def _per_sequence(frame: pl.DataFrame, estimator: str) -> np.ndarray:
    """One estimator of a `per-sequence` file as a [head, sequence] matrix, heads in (layer,
    head) order."""
    rows = frame.filter(pl.col("estimator") == estimator).sort("layer", "head", "sequence")
    return rows["value"].to_numpy().reshape(-1, rows["sequence"].n_unique())


def calibration(args: argparse.Namespace) -> None:
    """The screen with and without its calibration, from a `per-sequence` file: per c, what
    `heads_screen.loss_delta` would be (the mean estimate plus the mean error on the first c
    sequences, as the family computes it) scored against the exact mean over all the file's
    sequences; then the exploratory figures of docs/performance.md ("The calibration")."""
    frame = pl.read_parquet(args.per_sequence)
    first, exact = _per_sequence(frame, "first"), _per_sequence(frame, "exact")
    screen = first + _per_sequence(frame, "curvature")
    n = exact.shape[1]
    truth = exact.mean(1)
    top = set(np.argsort(-truth)[:TOP].tolist())

    def score(estimate: np.ndarray) -> dict[str, Any]:
        order = np.argsort(-estimate).tolist()
        return {"spearman": round(float(scipy.stats.spearmanr(estimate, truth)[0]), 3),
                "pearson": round(float(scipy.stats.pearsonr(estimate, truth)[0]), 3),
                "exact_top10_in_top10": len(top & set(order[:TOP])),
                "k_for_exact_top10": max(order.index(i) for i in top) + 1}

    def calibrated(c: int) -> np.ndarray:
        return screen.mean(1) + (exact[:, :c] - screen[:, :c]).mean(1)

    out: dict[str, Any] = {"heads": exact.shape[0], "sequences": n, "c=0": score(screen.mean(1))}
    out.update({f"c={c}": score(calibrated(c)) for c in args.c if 0 < c < n})
    clear = np.abs(truth) > 2 * exact.std(1, ddof=1) / np.sqrt(n)
    out["exploratory"] = {
        "first order alone": score(first.mean(1)),
        "heads whose exact mean is more than 2 stderr from 0": int(clear.sum()),
        "spearman over those heads, per c": {
            f"c={c}": round(float(scipy.stats.spearmanr(
                (calibrated(c) if c else screen.mean(1))[clear], truth[clear])[0]), 3)
            for c in [0, *args.c] if c < n},
        "exact against itself, first half of the sequences against the second (spearman)":
            round(float(scipy.stats.spearmanr(exact[:, : n // 2].mean(1),
                                              exact[:, n // 2 :].mean(1))[0]), 3),
        "per sequence, spearman over heads of estimate and exact (median)": round(float(
            np.median([scipy.stats.spearmanr(screen[:, i], exact[:, i])[0] for i in range(n)])),
            3),
        "median over heads of the sd over sequences: exact, exact - estimate": [
            round(float(np.median(exact.std(1, ddof=1))), 4),
            round(float(np.median((exact - screen).std(1, ddof=1))), 4)],
        "sd over heads of the exact means": round(float(truth.std()), 4),
        # What the calibration trades: it removes each head's error mean_N(e - s) and adds
        # the noise of estimating it from c sequences, sd(e - s) sqrt(1/c - 1/N) per head.
        "sd over heads of the screen's error mean_N(exact - estimate): all heads, the others":
            [round(float((truth - screen.mean(1)).std()), 4),
             round(float((truth - screen.mean(1))[~clear].std()), 4)],
        "median over heads of |mean_N(exact - estimate)|: all heads, the others":
            [round(float(np.median(np.abs(truth - screen.mean(1)))), 4),
             round(float(np.median(np.abs(truth - screen.mean(1))[~clear])), 4)],
        "median over heads of the calibration's noise at c = 2, all heads, the others": [
            round(float(np.median((exact - screen).std(1, ddof=1)) * np.sqrt(1 / 2 - 1 / n)), 4),
            round(float(np.median((exact - screen)[~clear].std(1, ddof=1))
                        * np.sqrt(1 / 2 - 1 / n)), 4)],
        "sd over heads of the exact means, the others": round(float(truth[~clear].std()), 4),
    }
    print(json.dumps(out, indent=1))


def ceiling(args: argparse.Namespace) -> None:
    """Exploratory: how far each of the screen's two terms limits it, from a `per-sequence`
    file. Per head and position the loss delta is KL(P || Q) plus a part with mean zero under
    P (log P(y) - log Q(y) minus its mean over y ~ P, at the true next token y). The curvature
    term, half the Gauss-Newton form, is the second-order estimate of the first (the KL, whose
    derivative at the clean model is zero); the first-order term estimates the second. Each
    oracle puts one term's target, measured (`exact_kl`, `exact - exact_kl`), in place of its
    estimate and scores the sum as `calibration` scores the screen (Spearman over all heads of
    the mean over the file's sequences against the exact mean). Nothing here is a screen: the
    targets cost the exact ablation."""
    frame = pl.read_parquet(args.per_sequence)
    first, curvature, exact, kl = (_per_sequence(frame, n).mean(1)
                                   for n in ("first", "curvature", "exact", "exact_kl"))

    def spearman(estimate: np.ndarray) -> float:
        return round(float(scipy.stats.spearmanr(estimate, exact)[0]), 3)

    ratio = curvature / np.where(kl > 0, kl, np.nan)
    print(json.dumps({
        "heads": int(exact.shape[0]),
        "sequences": int(frame["sequence"].n_unique()),
        "spearman against the exact loss delta": {
            "the screen (first + curvature)": spearman(first + curvature),
            "first + exact KL (the curvature term exact)": spearman(first + kl),
            "exact - exact KL + curvature (the first-order term exact)":
                spearman(exact - kl + curvature),
            "first alone": spearman(first),
            "exact KL alone": spearman(kl),
        },
        "curvature / exact KL over heads: median, max": [
            round(float(np.nanmedian(ratio)), 2), round(float(np.nanmax(ratio)), 1)],
    }, indent=1))


def sequential(args: argparse.Namespace) -> None:
    """Exploratory: the sequential exact top k (proposed in the closing note of 2026-12-07, never
    a setting of the family), simulated on a `per-sequence` file. Stage 1 ablates every head
    exactly on c of the file's N sequences; stage 2 ablates the k heads with the largest stage-1
    mean exactly on the other N - c, and returns the ten largest exact means of those k. Per
    (c, k): the mean over `--draws` random choices of the c sequences (seeded; repeats allowed,
    so for c = 1 nearly the mean over every sequence) of how many of the exact top 10 over all
    N sequences the k hold (so are returned, measured), with the screen's own top k beside it
    (c = 0: no stage 1); and the cost, as a fraction of exact `heads` on the N sequences,
    counting every head's ablation of one sequence alike: c/N + (k/H)(N - c)/N (in FLOPs a
    head's ablation costs its downstream blocks, so heads of late layers are cheaper; the
    screen's own cost is not in it)."""
    frame = pl.read_parquet(args.per_sequence)
    exact = _per_sequence(frame, "exact")
    screen = (_per_sequence(frame, "first") + _per_sequence(frame, "curvature")).mean(1)
    heads, n = exact.shape
    top = set(np.argsort(-exact.mean(1))[:TOP].tolist())
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"heads": heads, "sequences": n, "by c, then k": {}}
    for c in args.c:
        if not 0 <= c < n:
            continue
        choices = [rng.choice(n, size=c, replace=False) for _ in range(args.draws)] if c else []
        row: dict[str, Any] = {}
        for k in args.k:
            if c == 0:
                held = float(len(top & set(np.argsort(-screen)[:k].tolist())))
            else:
                held = float(np.mean([len(top & set(np.argsort(-exact[:, s].mean(1))[:k].tolist()))
                                      for s in choices]))
            row[f"k={k}"] = {"exact top 10 returned": round(held, 2),
                             "cost": round(c / n + k / heads * (n - c) / n, 3)}
        out["by c, then k"][f"c={c}" if c else "the screen's top k (c = 0)"] = row
    print(json.dumps(out, indent=1))


def analyse(args: argparse.Namespace) -> None:
    """Each estimator of a `variants` file against exact per-head numbers (an exported run)."""
    terms = pl.read_parquet(args.variants)
    exported = pl.read_parquet(args.exact_from)
    loss = _heads(exported, "heads.ablation_loss_delta").with_columns(
        pl.col("layer", "head").cast(pl.Int64))
    kl = _heads(exported, "heads.ablation_kl").with_columns(pl.col("layer", "head").cast(pl.Int64))
    points = sorted(float(e.split("=")[1]) for e in terms["estimator"].unique()
                    if e.startswith("alpha="))
    estimators: dict[str, list[str]] = {"atp": ["atp"]}
    for steps in (1, 2, 4, 8, 16):
        wanted = [j / steps for j in range(steps)]
        if all(any(abs(w - p) < 1e-6 for p in points) for w in wanted):
            estimators[f"screen_steps={steps}"] = [f"alpha={w:.4f}" for w in wanted]
    out: dict[str, Any] = {}
    for name, parts in estimators.items():
        screen = (terms.filter(pl.col("estimator").is_in(parts))
                  .group_by("layer", "head", "sequence").agg(pl.col("value").mean())
                  .group_by("layer", "head").agg(pl.col("value").mean())
                  .with_columns(pl.col("layer", "head").cast(pl.Int64)))
        result = compare(loss, kl, screen)
        exact_order = loss.sort("value", descending=True)
        ranked = screen.sort("value", descending=True)
        names = [f"{a}.{b}" for a, b in zip(ranked["layer"], ranked["head"], strict=True)]
        top10 = {f"{a}.{b}" for a, b in zip(exact_order["layer"][:TOP],
                                             exact_order["head"][:TOP], strict=True)}
        # the smallest k whose screen top k holds the whole exact top 10
        result["k_for_exact_top10"] = max(names.index(n) for n in top10) + 1
        result["exact_top10_in_screen_top_k"] = {
            k: len(top10 & set(names[:k])) for k in (10, 15, 20, 30)}
        out[name] = result
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
    t.add_argument("--families", default="heads_screen,heads")
    t.add_argument("--keep", type=Path, default=None)
    f = sub.add_parser("validate-files")
    f.add_argument("--screen-from", type=Path, required=True)
    f.add_argument("--exact-from", type=Path, required=True)
    w = sub.add_parser("variants")
    w.add_argument("--model", required=True)
    w.add_argument("--n-sequences", type=int, default=32)
    w.add_argument("--seq-len", type=int, default=128)
    w.add_argument("--points", type=int, default=8)
    w.add_argument("--batch", type=int, default=4)
    w.add_argument("--out", type=Path, required=True)
    q = sub.add_parser("per-sequence")
    q.add_argument("--model", required=True)
    q.add_argument("--n-sequences", type=int, default=32)
    q.add_argument("--seq-len", type=int, default=128)
    q.add_argument("--batch", type=int, default=4)
    q.add_argument("--out", type=Path, required=True)
    k = sub.add_parser("calibration")
    k.add_argument("--per-sequence", type=Path, required=True)
    k.add_argument("--c", type=int, nargs="*", default=[1, 2, 4])
    o = sub.add_parser("ceiling")
    o.add_argument("--per-sequence", type=Path, required=True)
    s = sub.add_parser("sequential")
    s.add_argument("--per-sequence", type=Path, required=True)
    s.add_argument("--c", type=int, nargs="*", default=[0, 1, 2])
    s.add_argument("--k", type=int, nargs="*", default=[10, 15, 20, 30])
    s.add_argument("--draws", type=int, default=200)
    a = sub.add_parser("analyse")
    a.add_argument("--variants", type=Path, required=True)
    a.add_argument("--exact-from", type=Path, required=True)
    args = parser.parse_args()
    commands = {"validate": validate, "time": time_families, "variants": variants,
                "analyse": analyse, "validate-files": validate_files,
                "per-sequence": per_sequence, "calibration": calibration,
                "ceiling": ceiling, "sequential": sequential}
    commands[args.command](args)


if __name__ == "__main__":
    main()
