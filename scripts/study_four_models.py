"""Lad et al.'s claims on four real models, scored exactly as docs/preregistration.md fixes.

    .venv/bin/python scripts/study_four_models.py --out results/four-models

Reads each model's stored run from `results/<slug>/` (the records and per-sequence means a
service exported, as results/smollm2/README.md shows), so everything here reproduces from
committed files with no service. A model whose run is not there is "not tested" and still
counts in the Holm family, as the registration says.

Per model (L blocks; A_k(l) = `intervention.top1_agreement` of component k at layer l; f =
`logit_lens.top1_agreement` at point 0, the model with every block removed; m = (1 + f) / 2):
the eight claims D-first, D-mid, D-last, S-first, S-mid, S-last (T = A - m), P1, P2 (T = A -
0.72); for the Qwen pair the two depth claims (T = mean over all blocks, 1.5B - 0.5B), paired
over the common sequences. Each T gets `compute.bootstrap.bootstrap_over_sequences` with
10,000 resamples, seed 0, a 95% percentile interval and the registered two-sided p-value
p = min(1, 2 min(1 + #{T* <= 0}, 1 + #{T* >= 0}) / (B + 1)); Holm over all 34 tests at 0.05.
All of a model's statistics are read off the same resamples (one bootstrap pass per model with
seed 0: exactly the draws a separate call per statistic would make).

Reported beside, without verdicts: retained accuracy of each deciding set, the share (A - f) /
(1 - f), the sensitivity middle (blocks 1..L-2), the depth pair's differences over the middle
sets and normalised, and ten relative-depth bins of the drop and swap curves
(`service.api.queries.compare.bin_weights`, what `GET /compare?bins=10` weights layers by)
with per-bin paired intervals. The four-stage verdicts use `compute.stages.infer_stages` as
registered (file SHA-256 checked).

Writes OUT/claims.json, OUT/claims.md, OUT/depth.md, OUT/stages.md and OUT/curves.png.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from compute.bootstrap import KEY, bootstrap_over_sequences, sequence_matrix  # noqa: E402
from compute.stages import infer_stages  # noqa: E402

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
ALPHA = 0.05
PAPER_FLOOR = 0.72
N_TESTS = 34  # 8 claims x 4 models + 2 depth claims
STAGES_SHA256 = "d476282c7a780f34de0f502c133e3d7ff8501d8c325aa9d8b8068546f53895cd"
BINS = 10


@dataclass(frozen=True)
class Model:
    label: str
    slug: str  # results/<slug>/
    run: str  # <run>.parquet and <run>.sequence_means.parquet
    n_layers: int
    quantization: str
    scoring: str  # "re-scored" (results known before registration) or "confirmatory"


MODELS = (
    Model("SmolLM2-135M-Instruct", "smollm2", "default-run-float32", 30, "Q4_1", "re-scored"),
    Model("Gemma 3 270M", "gemma3", "run-float32-n32", 18, "Q4_K_M", "re-scored"),
    Model(  # its default run: the registered 32 sequences (its 4-sequence run-float32 before)
        "Qwen2.5-Coder-0.5B-Instruct",
        "qwen2.5-coder-0.5b",
        "default-run-float32",
        24,
        "Q4_K_M from AWQ (quantized twice)",
        "confirmatory",
    ),
    Model(
        "Qwen2.5-Coder-1.5B-Instruct",
        "qwen2.5-coder-1.5b",
        "run-float32",
        28,
        "Q4_K_M",
        "confirmatory",
    ),
)
PAIR = ("Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct")

CLAIMS = (  # id, what it says, claimed sign of T
    ("D-first", "dropping the first block is critical", -1),
    ("D-mid", "dropping a middle block is robust", +1),
    ("D-last", "dropping the last block is critical", -1),
    ("S-first", "swapping the first pair is critical", -1),
    ("S-mid", "swapping a middle pair is robust", +1),
    ("S-last", "swapping the last pair is critical", -1),
    ("P1", "middle drops keep >= 72% of predictions", +1),
    ("P2", "middle swaps keep >= 72% of predictions", +1),
)
DEPTH_CLAIMS = (
    ("Depth-drop", "the deeper Qwen is more robust to drops (all blocks)", +1),
    ("Depth-swap", "the deeper Qwen is more robust to swaps (all pairs)", +1),
)


def middle(n_layers: int) -> tuple[list[int], list[int]]:
    """The registered middle: blocks with 0.2 <= l / (L - 1) <= 0.8 (drop), and swap indices
    l with both l and l + 1 in it."""
    drop = [b for b in range(n_layers) if 0.2 <= b / (n_layers - 1) <= 0.8]
    swap = [b for b in drop if b + 1 in drop]
    return drop, swap


def sensitivity_middle(n_layers: int) -> tuple[list[int], list[int]]:
    """docs/study-two-families.md's middle (blocks 1..L-2), reported without a verdict."""
    drop = list(range(1, n_layers - 1))
    return drop, [b for b in drop if b + 1 in drop]


NEURONS_RUN = "neurons-float32"  # results/<slug>/<this>.parquet: the neurons family alone


def run_model(path: Path) -> dict[str, Any]:
    """The model a `strata compute --out` file was computed from (its checkpoint's checksum,
    dtype and weight processing), from the file's own metadata."""
    meta = pq.read_schema(path).metadata or {}
    model = json.loads(meta[b"strata"])["config"]["model"]
    return {k: model[k] for k in ("revision", "dtype", "processing", "quantization", "source")}


def load_run(model: Model) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The model's stored run: its records and per-sequence means. A run without `neurons`
    takes them from `results/<slug>/neurons-float32.parquet` when that is there: a run of the
    neurons family alone on the same checkpoint and dtype. The family reads only the weights
    (every neuron's output row against the unembedding; docs/metrics.md, neurons.*), so its
    records do not depend on the tokens, and the stage rule reads them as counts per layer."""
    base = ROOT / "results" / model.slug / model.run
    records, means = Path(f"{base}.parquet"), Path(f"{base}.sequence_means.parquet")
    if not (records.is_file() and means.is_file()):
        return None
    frame = pl.read_parquet(records)
    extra = ROOT / "results" / model.slug / f"{NEURONS_RUN}.parquet"
    if frame.filter(pl.col("metric").str.starts_with("neurons.")).is_empty() and extra.is_file():
        ours, theirs = (run_model(path) for path in (records, extra))
        if ours != theirs:
            raise SystemExit(f"{extra}: not the model of {records} ({theirs} != {ours})")
        neurons = pl.read_parquet(extra).filter(pl.col("metric").str.starts_with("neurons."))
        frame = pl.concat([frame, neurons.select(frame.columns)], how="vertical_relaxed")
    return frame, pl.read_parquet(means)


class Reader:
    """Index of a per-sequence table's keys, so a statistic reads values out of each
    resample's curves by position (every key has every sequence: the rows line up)."""

    def __init__(self, seq: pl.DataFrame) -> None:
        keys, self.means, has, _ids = sequence_matrix(seq)
        if not has.all():
            raise SystemExit("a key lacks some sequence: the runs' tables are incomplete")
        self.index = {
            (r["metric"], r["layer"], r["component"]): i
            for i, r in enumerate(keys.select(KEY).to_dicts())
        }
        self.n_keys = keys.height

    def values(self, curves: pl.DataFrame) -> np.ndarray:
        if curves.height != self.n_keys:
            raise SystemExit("a resample's curves lost a key")
        return curves["value"].to_numpy()

    def at(self, metric: str, component: str | None, layers: list[int | None]) -> np.ndarray:
        return np.array([self.index[(metric, layer, component)] for layer in layers])


Stat = Callable[[np.ndarray], dict[str, float]]


def model_statistics(reader: Reader, prefix: str, n_layers: int) -> Stat:
    """Every registered and reported number of one model, as a function of a curve vector."""
    agree, acc = f"{prefix}intervention.top1_agreement", f"{prefix}intervention.accuracy"
    lens = f"{prefix}logit_lens.top1_agreement"
    blocks, pairs = list(range(n_layers)), list(range(n_layers - 1))
    a_drop, a_swap = reader.at(agree, "drop", blocks), reader.at(agree, "swap", pairs)
    r_drop, r_swap = reader.at(acc, "drop", blocks), reader.at(acc, "swap", pairs)
    r_none = reader.at(acc, "none", [None])[0]
    f_at = reader.at(lens, None, [0])[0]
    mid_d, mid_s = middle(n_layers)
    sen_d, sen_s = sensitivity_middle(n_layers)
    sets = {
        "drop": {"first": [0], "mid": mid_d, "last": [n_layers - 1], "all": blocks, "sens": sen_d},
        "swap": {"first": [0], "mid": mid_s, "last": [n_layers - 2], "all": pairs, "sens": sen_s},
    }

    def stat(v: np.ndarray) -> dict[str, float]:
        f = float(v[f_at])
        m = (1.0 + f) / 2.0
        out = {"f": f, "m": m}
        for kind, a_idx, r_idx in (("drop", a_drop, r_drop), ("swap", a_swap, r_swap)):
            for name, layers in sets[kind].items():
                a = float(v[a_idx[layers]].mean())
                out[f"A_{kind}_{name}"] = a
                out[f"share_{kind}_{name}"] = (a - f) / (1.0 - f)
                out[f"R_{kind}_{name}"] = float(v[r_idx[layers]].mean()) / float(v[r_none])
        out["D-first"] = out["A_drop_first"] - m
        out["D-mid"] = out["A_drop_mid"] - m
        out["D-last"] = out["A_drop_last"] - m
        out["S-first"] = out["A_swap_first"] - m
        out["S-mid"] = out["A_swap_mid"] - m
        out["S-last"] = out["A_swap_last"] - m
        out["P1"] = out["A_drop_mid"] - PAPER_FLOOR
        out["P2"] = out["A_swap_mid"] - PAPER_FLOOR
        out["D-sens-mid"] = out["A_drop_sens"] - m
        out["S-sens-mid"] = out["A_swap_sens"] - m
        return out

    return stat


def bootstrap_all(
    seq: pl.DataFrame, stat_of: Callable[[Reader], Stat]
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Point values and the B resampled values of every statistic, from one registered
    bootstrap pass (`bootstrap_over_sequences`, 10,000 resamples, seed 0)."""
    reader = Reader(seq)
    stat = stat_of(reader)
    point = stat(reader.means.mean(axis=1))
    samples: dict[str, list[float]] = {k: [] for k in point}

    def record(curves: pl.DataFrame) -> float:
        values = stat(reader.values(curves))
        for k, x in values.items():
            samples[k].append(x)
        return 0.0

    bootstrap_over_sequences(seq, record, n_resamples=RESAMPLES, seed=SEED, ci=LEVEL)
    return point, {k: np.asarray(v) for k, v in samples.items()}


def p_value(samples: np.ndarray) -> float:
    """The registered two-sided bootstrap p-value of T = 0."""
    b = samples.size
    below, above = int((samples <= 0).sum()), int((samples >= 0).sum())
    return min(1.0, 2.0 * min(1 + below, 1 + above) / (b + 1))


def interval(samples: np.ndarray) -> list[float]:
    low, high = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(low), float(high)]


def holm(tests: list[dict[str, Any]]) -> None:
    """Holm's step-down over the whole family (untested entries count, never rejected)."""
    order = sorted(
        range(len(tests)),
        key=lambda i: tests[i]["p"] if tests[i]["p"] is not None else 2.0,
    )
    running, rejecting = 0.0, True
    for rank, i in enumerate(order):
        t = tests[i]
        if t["p"] is None:
            t["p_holm"], t["rejected"] = None, False
            continue
        adjusted = min(1.0, (N_TESTS - rank) * t["p"])
        running = max(running, adjusted)
        t["p_holm"] = running
        rejecting = rejecting and t["p"] <= ALPHA / (N_TESTS - rank)
        t["rejected"] = rejecting


def verdict(t: dict[str, Any]) -> str:
    if t["p"] is None:
        return "not tested"
    if not t["rejected"]:
        return "inconclusive"
    return "supported" if np.sign(t["estimate"]) == t["sign"] else "not supported"


def test_row(
    model: str,
    claim: tuple[str, str, int],
    point: dict[str, float] | None,
    samples: dict[str, np.ndarray] | None,
) -> dict[str, Any]:
    cid, text, sign = claim
    row: dict[str, Any] = {"model": model, "claim": cid, "text": text, "sign": sign}
    if point is None or samples is None:
        row.update(estimate=None, interval=None, p=None)
        return row
    row.update(estimate=point[cid], interval=interval(samples[cid]), p=p_value(samples[cid]))
    return row


def stage_verdict(records: pl.DataFrame, seq: pl.DataFrame, n_layers: int) -> dict[str, Any]:
    """The registered stage verdict: a boundary counts if clear on the full run and clear in
    at least half of the rule's bootstrap resamples."""
    bounds = infer_stages(records, n_layers, seq)
    rows, counted = [], 0
    for b in bounds:
        boot = b.evidence.get("bootstrap", {})
        frac = boot.get("clear_fraction")
        counts = b.clear and frac is not None and frac >= 0.5
        counted += int(counts)
        rows.append(
            {
                "boundary": b.index,
                "clear": b.clear,
                "layer": b.layer,
                "estimate": b.estimate,
                "relative_depth": b.relative_depth,
                "clear_fraction": frac,
                "interval": list(b.interval) if b.interval else None,
                "counts": counts,
                "rule": b.rule,
            }
        )
    v = "supported" if counted == 3 else "not supported" if counted == 0 else "inconclusive"
    return {"boundaries": rows, "counted": counted, "verdict": v}


def binned(values: np.ndarray, n_layers: int) -> np.ndarray:
    """A block curve (one value per layer, on l / (L - 1)) read into BINS relative-depth bins
    with `/compare`'s own weights (interpolate). Shape [..., BINS] (NaN where none)."""
    matrix = bin_matrix(values.shape[-1], n_layers)
    out = values @ matrix
    out[..., matrix.sum(axis=0) == 0] = np.nan
    return out


@functools.cache
def bin_matrix(n: int, n_layers: int) -> np.ndarray:
    """[n layers, BINS] weights of `GET /compare`'s interpolation for a curve of n layers."""
    from service.api.queries.compare import bin_weights

    rows = pl.DataFrame(
        {
            "run_id": [0] * n,
            "layer": list(range(n)),
            "relative_depth": [b / (n_layers - 1) for b in range(n)],
        }
    )
    w = bin_weights(rows, BINS, "interpolate")
    matrix = np.zeros((n, BINS))
    for r in w.iter_rows(named=True):
        matrix[r["layer"], r["bin"]] += r["w"]
    return matrix


def depth_analysis(runs: dict[str, tuple[pl.DataFrame, pl.DataFrame]]) -> dict[str, Any]:
    small, large = PAIR
    specs = {m.label: m for m in MODELS}
    seqs = {}
    for label in PAIR:
        seq = runs[label][1]
        seqs[label] = seq.filter(
            pl.col("metric").is_in(
                [
                    "intervention.top1_agreement",
                    "intervention.accuracy",
                    "logit_lens.top1_agreement",
                    "intervention.kl",
                ]
            )
        )
    common = sorted(
        set(seqs[small]["sequence"].unique().to_list())
        & set(seqs[large]["sequence"].unique().to_list())
    )
    stacked = pl.concat(
        [
            seqs[label]
            .filter(pl.col("sequence").is_in(common))
            .with_columns((pl.lit(f"{label}:") + pl.col("metric")).alias("metric"))
            for label in PAIR
        ]
    )
    l_small, l_large = specs[small].n_layers, specs[large].n_layers

    def stat_of(reader: Reader) -> Stat:
        s = model_statistics(reader, f"{small}:", l_small)
        g = model_statistics(reader, f"{large}:", l_large)
        curves = {}
        for label, n in ((small, l_small), (large, l_large)):
            for kind, count in (("drop", n), ("swap", n - 1)):
                for metric in ("intervention.top1_agreement", "intervention.kl"):
                    curves[(label, kind, metric)] = reader.at(
                        f"{label}:{metric}", kind, list(range(count))
                    )

        def stat(v: np.ndarray) -> dict[str, float]:
            a, b = s(v), g(v)
            out = {
                "Depth-drop": b["A_drop_all"] - a["A_drop_all"],
                "Depth-swap": b["A_swap_all"] - a["A_swap_all"],
                "mid-drop": b["A_drop_mid"] - a["A_drop_mid"],
                "mid-swap": b["A_swap_mid"] - a["A_swap_mid"],
                "share-drop": b["share_drop_all"] - a["share_drop_all"],
                "share-swap": b["share_swap_all"] - a["share_swap_all"],
            }
            for kind in ("drop", "swap"):
                for metric in ("intervention.top1_agreement", "intervention.kl"):
                    short = metric.split(".")[1]
                    bins_a = binned(v[curves[(small, kind, metric)]], l_small)
                    bins_b = binned(v[curves[(large, kind, metric)]], l_large)
                    for i in range(BINS):
                        out[f"bin{i}:{kind}:{short}:small"] = float(bins_a[i])
                        out[f"bin{i}:{kind}:{short}:large"] = float(bins_b[i])
                        out[f"bin{i}:{kind}:{short}:diff"] = float(bins_b[i] - bins_a[i])
            return out

        return stat

    point, samples = bootstrap_all(stacked, stat_of)
    return {"common_sequences": len(common), "point": point, "samples": samples}


def windows_check(gguf_cache: Path) -> dict[str, Any]:
    """The registered pairing check: the 1.5B run's windows (its first n) against the 0.5B
    run's first n windows, by `compute.tokens.windows_fingerprint`, each model's own tokenizer
    on the built-in corpus (seed 0, 128 tokens). Needs both GGUFs dequantized in `gguf_cache`
    (what the service that ran them used: STRATA_DATA_DIR/gguf)."""
    from transformers import AutoTokenizer

    from compute import gguf
    from compute.tokens import TokenSpec, load_tokens, windows_fingerprint

    gguf.set_cache_dir(gguf_cache)
    shas = {
        PAIR[0]: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        PAIR[1]: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    }
    n_of = {
        label: int(
            pl.read_parquet(
                ROOT / "results" / m.slug / f"{m.run}.sequence_means.parquet", columns=["sequence"]
            )["sequence"].n_unique()
        )
        for m in MODELS
        if (label := m.label) in PAIR
    }
    n = min(n_of.values())
    prints = {}
    for label, sha in shas.items():
        folder = gguf.cached_checkpoint(sha)
        if folder is None:
            raise SystemExit(f"{label}'s dequantized checkpoint is not in {gguf_cache}")
        tok = AutoTokenizer.from_pretrained(folder)
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        tokens = load_tokens(
            TokenSpec(source="builtin", n_sequences=n_of[label], seq_len=128),
            tok,
            bos_token_id=int(bos),
            d_vocab=len(tok),
            n_ctx=32768,
        )
        prints[label] = windows_fingerprint(tokens[:n])
    return {"common": n, "fingerprints": prints, "paired": len(set(prints.values())) == 1}


def fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "four-models")
    parser.add_argument(
        "--check-windows",
        type=Path,
        metavar="GGUF_CACHE",
        help="also check the Qwen pair's windows (STRATA_DATA_DIR/gguf)",
    )
    args = parser.parse_args()
    digest = hashlib.sha256((ROOT / "compute" / "stages.py").read_bytes()).hexdigest()
    if digest != STAGES_SHA256:
        raise SystemExit(
            f"compute/stages.py changed since the registration ({digest[:12]} != "
            f"{STAGES_SHA256[:12]}): score the stages with the registered version"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, tuple[pl.DataFrame, pl.DataFrame]] = {}
    tests: list[dict[str, Any]] = []
    per_model: dict[str, Any] = {}
    for model in MODELS:
        run = load_run(model)
        point = samples = None
        entry: dict[str, Any] = {
            "quantization": model.quantization,
            "scoring": model.scoring,
            "n_layers": model.n_layers,
            "stored": run is not None,
        }
        if run is not None:
            runs[model.label] = run
            records, seq = run
            entry["n_sequences"] = int(seq["sequence"].n_unique())
            wanted = seq.filter(
                pl.col("metric").is_in(
                    [
                        "intervention.top1_agreement",
                        "intervention.accuracy",
                        "logit_lens.top1_agreement",
                    ]
                )
            )
            point, samples = bootstrap_all(
                wanted, lambda r, n=model.n_layers: model_statistics(r, "", n)
            )
            entry["point"] = point
            entry["interval"] = {k: interval(v) for k, v in samples.items()}
            if records.filter(pl.col("metric").str.starts_with("neurons.")).is_empty():
                # the stage rule reads neuron counts (boundary 3): without them its verdict
                # would be scored on a rule it cannot apply, so it is not tested
                entry["stages"] = {"boundaries": [], "counted": 0, "verdict": "not tested"}
            else:
                entry["stages"] = stage_verdict(records, seq, model.n_layers)
            print(f"{model.label}: bootstrap done", flush=True)
        per_model[model.label] = entry
        tests += [test_row(model.label, c, point, samples) for c in CLAIMS]
    depth = None
    if all(label in runs for label in PAIR):
        if args.check_windows is not None:
            check = windows_check(args.check_windows)
            print(f"windows: {check}", flush=True)
            if not check["paired"]:
                raise SystemExit(
                    "the Qwen runs' windows differ: the registration then tests "
                    "the depth claims unpaired, which this script does not do"
                )
            (args.out / "windows.json").write_text(json.dumps(check, indent=1))
        depth = depth_analysis(runs)
        tests += [test_row("Qwen pair", c, depth["point"], depth["samples"]) for c in DEPTH_CLAIMS]
    else:
        tests += [test_row("Qwen pair", c, None, None) for c in DEPTH_CLAIMS]
    assert len(tests) == N_TESTS
    holm(tests)
    for t in tests:
        t["verdict"] = verdict(t)
    out = {"tests": tests, "models": per_model, "universality": universality(per_model)}
    if depth is not None:
        out["depth"] = {
            "common_sequences": depth["common_sequences"],
            "point": depth["point"],
            "interval": {k: interval(v) for k, v in depth["samples"].items()},
        }
    (args.out / "claims.json").write_text(json.dumps(out, indent=1))
    (args.out / "claims.md").write_text(claims_markdown(out))
    (args.out / "stages.md").write_text(stages_markdown(out))
    if depth is not None:
        (args.out / "depth.md").write_text(depth_markdown(out))
    if runs:
        draw_curves(runs, out, args.out / "curves.png")
    print((args.out / "claims.md").read_text())


def claims_markdown(out: dict[str, Any]) -> str:
    lines = [
        "| model | claim | T (point) | 95% interval | p | Holm p | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in out["tests"]:
        iv = t["interval"]
        lines.append(
            f"| {t['model']} | {t['claim']}: {t['text']} | {fmt(t['estimate'])} | "
            + (f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "—")
            + f" | {fmt_p(t['p'])} | {fmt_p(t.get('p_holm'))} | **{t['verdict']}** |"
        )
    lines += [
        "",
        "Beside the verdicts (no verdict of their own):",
        "",
        "| model | n seq | f (no blocks) | m | A drop: first / middle / last | "
        "A swap: first / middle / last | share (A-f)/(1-f), middle drop / swap | "
        "retained accuracy, middle drop / swap | sensitivity middle (1..L-2), drop / swap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, e in out["models"].items():
        if not e["stored"]:
            lines.append(f"| {label} | — | (no stored run: not tested) | | | | | | |")
            continue
        p, iv = e["point"], e["interval"]

        def w(key: str, p: dict[str, float] = p, iv: dict[str, list[float]] = iv) -> str:
            return f"{p[key]:.3f} [{iv[key][0]:.3f}, {iv[key][1]:.3f}]"

        lines.append(
            f"| {label} ({e['quantization']}) | {e['n_sequences']} | {w('f')} | {p['m']:.3f} | "
            f"{p['A_drop_first']:.3f} / {p['A_drop_mid']:.3f} / {p['A_drop_last']:.3f} | "
            f"{p['A_swap_first']:.3f} / {p['A_swap_mid']:.3f} / {p['A_swap_last']:.3f} | "
            f"{w('share_drop_mid')} / {w('share_swap_mid')} | "
            f"{w('R_drop_mid')} / {w('R_swap_mid')} | "
            f"{w('A_drop_sens')} / {w('A_swap_sens')} |"
        )
    return "\n".join(lines) + "\n"


OUT_OF_SAMPLE = ("Gemma 3 270M", "Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct")


def universality(per_model: dict[str, Any]) -> dict[str, Any]:
    """The registered universality verdict over the three out-of-sample models: supported if
    all three are supported, not supported if any is not supported, inconclusive otherwise;
    while a model is untested and none is "not supported", it is not decided ("not tested")."""
    verdicts = {
        m: (per_model.get(m, {}).get("stages") or {}).get("verdict", "not tested")
        for m in OUT_OF_SAMPLE
    }
    found = list(verdicts.values())
    if "not supported" in found:
        verdict = "not supported"
    elif all(v == "supported" for v in found):
        verdict = "supported"
    elif "not tested" in found:
        verdict = "not tested"
    else:
        verdict = "inconclusive"
    tested = sum(v != "not tested" for v in found)
    return {"verdict": verdict, "models": verdicts, "tested": tested}


def stages_markdown(out: dict[str, Any]) -> str:
    lines = [
        "| model | scoring | boundary | clear | block | relative depth | clear in "
        "resamples | 90% interval (blocks) | counts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, e in out["models"].items():
        if not e["stored"]:
            lines.append(f"| {label} | {e['scoring']} | — | not tested | | | | | |")
            continue
        if e["stages"]["verdict"] == "not tested":
            lines.append(
                f"| {label} | {e['scoring']} | — | no `neurons` in the run: not tested | | | | | |"
            )
            continue
        for b in e["stages"]["boundaries"]:
            lines.append(
                f"| {label} | {e['scoring']} | {b['boundary']} | {b['clear']} | "
                f"{b['layer'] if b['layer'] is not None else '—'} | {fmt(b['relative_depth'], 2)} "
                f"| {fmt(b['clear_fraction'], 2)} | {b['interval'] or '—'} | {b['counts']} |"
            )
        lines.append(
            f"| {label} | | **verdict** | | | | | | **{e['stages']['verdict']}** "
            f"({e['stages']['counted']} of 3) |"
        )
    u = out["universality"]
    lines += [
        "",
        f"**Universality** (the registered rule over the three out-of-sample models, "
        f"{u['tested']} of 3 tested): **{u['verdict']}**.",
    ]
    return "\n".join(lines) + "\n"


def depth_markdown(out: dict[str, Any]) -> str:
    d = out["depth"]
    p, iv = d["point"], d["interval"]
    lines = [
        f"Common sequences: {d['common_sequences']} (paired bootstrap).",
        "",
        "| statistic (1.5B - 0.5B) | point | 95% interval |",
        "| --- | --- | --- |",
    ]
    for key, text in (
        ("Depth-drop", "agreement under drop, all blocks (registered)"),
        ("Depth-swap", "agreement under swap, all pairs (registered)"),
        ("mid-drop", "agreement under drop, middle sets"),
        ("mid-swap", "agreement under swap, middle sets"),
        ("share-drop", "(A - f)/(1 - f) under drop, all blocks"),
        ("share-swap", "(A - f)/(1 - f) under swap, all pairs"),
    ):
        lines.append(f"| {text} | {p[key]:.4f} | [{iv[key][0]:.4f}, {iv[key][1]:.4f}] |")
    for kind in ("drop", "swap"):
        for short in ("top1_agreement", "kl"):
            lines += [
                "",
                f"`intervention.{short}` under {kind}, ten relative-depth bins "
                "(`/compare` interpolate weights), paired:",
                "",
                "| bin | depth | 0.5B | 1.5B | 1.5B - 0.5B [95%] |",
                "| --- | --- | --- | --- | --- |",
            ]
            for i in range(BINS):
                k = f"bin{i}:{kind}:{short}"
                lo, hi = iv[f"{k}:diff"]
                lines.append(
                    f"| {i} | {(i + 0.5) / BINS:.2f} | {fmt(p[k + ':small'])} | "
                    f"{fmt(p[k + ':large'])} | {fmt(p[k + ':diff'])} [{fmt(lo)}, {fmt(hi)}] |"
                )
    return "\n".join(lines) + "\n"


def draw_curves(
    runs: dict[str, tuple[pl.DataFrame, pl.DataFrame]], out: dict[str, Any], path: Path
) -> None:
    """Agreement under drop and swap by relative depth, every stored model, with each
    model's m (the registered threshold) dashed and its middle shaded."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, kind in zip(axes, ("drop", "swap"), strict=True):
        for i, model in enumerate(m for m in MODELS if m.label in runs):
            records = runs[model.label][0]
            rows = records.filter(
                (pl.col("metric") == "intervention.top1_agreement") & (pl.col("component") == kind)
            ).sort("layer")
            depth = rows["layer"].to_numpy() / (model.n_layers - 1)
            color = f"C{i}"
            ax.errorbar(
                depth,
                rows["value"].to_numpy(),
                yerr=rows["stderr"].to_numpy(),
                label=f"{model.label} ({model.quantization})",
                color=color,
                marker="o",
                markersize=2,
                linewidth=1,
                capsize=1.5,
            )
            ax.axhline(
                out["models"][model.label]["point"]["m"], color=color, linestyle="--", linewidth=0.8
            )
        ax.axvspan(0.2, 0.8, color="grey", alpha=0.08)
        ax.set_title(f"top-1 agreement with the intact model under {kind}")
        ax.set_xlabel(
            "relative depth l / (L - 1)" + (" of the pair's first block" if kind == "swap" else "")
        )
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("intervention.top1_agreement (fraction of positions)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.text(
        0.5,
        0.005,
        "shaded: the registered middle (0.2-0.8); dashed: each model's m = (1 + f)/2",
        ha="center",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
