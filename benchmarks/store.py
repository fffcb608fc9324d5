"""Results-store benchmark: ingest rate, and query times as the number of stored runs grows.

    .venv/bin/python benchmarks/store.py            # full (a few minutes on 2 CPU cores)
    .venv/bin/python benchmarks/store.py --quick    # smaller, for a smoke check

(a) Ingest: all neurons of a 48-layer x 6400-neuron model (307,200 neurons = 1,228,800
    `neurons.vocab_*` records, plus the per-layer counts) through `ingest_result` -- validation,
    pivot to one row per neuron, classification, one transaction -- next to DuckDB's own bulk
    insert of the same Arrow table (`INSERT INTO t SELECT * FROM arrow_table`, one transaction)
    in the same database file. Best of --repeat for each.
(b) Queries, with 10 and then 1,000 runs stored (10 models of GPT-2-small shape: 12 layers,
    12 heads, 3,072 neurons; every run has the record rows of all families, ~3.3k, and 36,864
    neuron rows; the 990 extra runs are other configurations and an older metric version, and the
    current run of each model sits at a random place among them): a per-layer query (the top 20
    prediction neurons of layer 6, with tokens, of a model's current run; and one metric at one
    layer) and a cross-model query (intervention.kl/drop of every model's current run). Median
    of --repeat, warm.
(c) Backup (`--backup`, only this part): a store of --models models (GPT-2-small shape, one
    run each with every family, as in (b)) backed up with `service.store.backup.backup` -- the
    code behind `strata db backup` and POST /api/v1/admin/backup -- into a new file (best of
    --repeat), its size beside the database's, and `restore` of it into a new path.

    .venv/bin/python benchmarks/store.py --backup --models 100
Prints a JSON summary as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from compute.models import ModelSpec  # noqa: E402
from compute.records import RECORD_SCHEMA, unit_of  # noqa: E402
from compute.run import NEURON_TOKENS_SCHEMA, RunConfig, RunResult  # noqa: E402
from compute.tokens import TokenSpec  # noqa: E402
from service.api.queries.index import StoreIndex  # noqa: E402
from service.store import Store  # noqa: E402
from service.store import repositories as repo  # noqa: E402
from service.store.db import raw_connection  # noqa: E402
from service.store.ingest import ingest_result  # noqa: E402
from service.store.migrate import upgrade  # noqa: E402

MOMENTS = ("vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt")
ALL_FAMILIES = ("attention", "heads", "intervention", "logit_lens", "neurons", "norms",
                "similarity")


def _rows(rows: list[tuple[str, int | None, str | None, int | None]], rng: np.random.Generator
          ) -> dict[str, list[object]]:
    metric, layer, component, head = (list(c) for c in zip(*rows, strict=True)) if rows else \
        ([], [], [], [])
    n = len(metric)
    return {"metric": metric, "layer": layer, "component": component, "head": head,
            "neuron": [None] * n, "value": rng.uniform(0, 1, n).tolist(),
            "stderr": rng.uniform(0, 0.01, n).tolist(), "n": [4096] * n,
            "unit": [unit_of(m) for m in metric]}


def synthetic_result(n_layers: int, d_mlp: int, n_heads: int, *, name: str, seed: int = 0,
                     options_seed: int = 0, metric_version: str = "1",
                     all_families: bool = False, top_tokens: bool = False) -> RunResult:
    """A run's worth of records without computing it (values random, shapes real)."""
    rng = np.random.default_rng(seed)
    count = n_layers * d_mlp
    moments = np.stack([rng.normal(0, 0.01, count), rng.uniform(0.001, 0.01, count),
                        rng.normal(0, 1, count), 3 + rng.exponential(3, count)])
    metric = np.repeat(np.array([f"neurons.{m}" for m in MOMENTS]), count)
    neurons = pa.table({
        "metric": metric,
        "layer": np.tile(np.repeat(np.arange(n_layers, dtype=np.int32), d_mlp), 4),
        "component": pa.nulls(4 * count, pa.string()), "head": pa.nulls(4 * count, pa.int32()),
        "neuron": np.tile(np.arange(d_mlp, dtype=np.int32), 4 * n_layers),
        "value": moments.reshape(-1), "stderr": pa.nulls(4 * count, pa.float64()),
        "n": np.full(4 * count, 50_000),
        "unit": np.array([unit_of(f"neurons.{m}") for m in MOMENTS]).repeat(count),
    }, schema=RECORD_SCHEMA)
    layers = range(n_layers)
    rows: list[tuple[str, int | None, str | None, int | None]] = [
        (f"neurons.{k}_{c}", layer, None, None) for layer in layers for k in ("n", "frac")
        for c in ("prediction", "suppression", "partition")]
    if all_families:
        kinds = {"drop": layers, "drop_attn": layers, "drop_mlp": layers,
                 "swap": range(n_layers - 1)}
        for m in ("kl", "top1_agreement", "entropy", "entropy_delta", "loss", "loss_delta",
                  "accuracy"):
            rows += [(f"intervention.{m}", 0, "none", None)]
            rows += [(f"intervention.{m}", layer, kind, None) for kind, ls in kinds.items()
                     for layer in ls]
        rows += [(f"logit_lens.{m}", i, None, None) for m in
                 ("kl_to_final", "entropy", "top1_agreement", "loss") for i in range(n_layers + 1)]
        attention = ["attention.bos", "attention.entropy",
                     *(f"attention.prev_{k}{s}" for k in (1, 2, 4, 5, 8, 16)
                       for s in ("", "_mean"))]
        rows += [(m, layer, None, h) for m in attention for layer in layers
                 for h in (None, *range(n_heads))]
        rows += [(f"heads.{m}", layer, None, h) for m in ("ablation_kl", "ablation_loss_delta",
                                                           "induction")
                 for layer in layers for h in range(n_heads)]
        rows += [(f"norms.{m}", layer, None, None) for m in ("attn_out", "mlp_out",
                                                              "attn_mlp_ratio", "resid")
                 for layer in layers]
        rows += [(f"similarity.{m}", layer, c, None) for m in ("self", "index", "adjacent")
                 for c in ("attn", "mlp") for layer in range(n_layers - 1)]
    records = pa.concat_tables([pa.table(_rows(rows, rng), schema=RECORD_SCHEMA), neurons])
    tokens = NEURON_TOKENS_SCHEMA.empty_table()
    if top_tokens:  # 20 neurons per layer, 10 tokens each way
        picks = [(layer, int(n)) for layer in layers for n in rng.choice(d_mlp, 20, replace=False)]
        tokens = pa.table({
            "layer": [p[0] for p in picks for _ in range(20)],
            "neuron": [p[1] for p in picks for _ in range(20)],
            "neuron_class": ["prediction"] * 20 * len(picks),
            "direction": (["promoted"] * 10 + ["suppressed"] * 10) * len(picks),
            "rank": list(range(10)) * 2 * len(picks),
            "token_id": rng.integers(0, 50_000, 20 * len(picks)).tolist(),
            "token": [f"t{i}" for i in range(20 * len(picks))],
            "cosine": rng.uniform(-0.3, 0.3, 20 * len(picks)).tolist(),
        }, schema=NEURON_TOKENS_SCHEMA)
    from compute.metrics.base import EngineOptions

    spec = ModelSpec(source="random", name=name,
                     architecture=dict(n_layers=n_layers, d_mlp=d_mlp, n_heads=n_heads))
    config = RunConfig(model=spec,
                       tokens=TokenSpec(source="npy", path="bench.npy", n_sequences=1,
                                        seq_len=3, fingerprint="0"),
                       families=ALL_FAMILIES if all_families else ("neurons",),
                       options=EngineOptions(induction_seed=options_seed),
                       metric_version=metric_version)
    info = dict(architecture="synthetic", n_layers=n_layers, d_model=768, n_heads=n_heads,
                d_mlp=d_mlp, d_vocab=50_000, d_vocab_real=50_000, n_ctx=1024, n_params=1,
                normalization_type="LN", parallel_attn_mlp=False,
                processing=dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                                fold_value_biases=True, notes=[]))
    return RunResult(config=config, config_hash=config.config_hash(), records=records,
                     neuron_tokens=tokens, model_info=info, tokens_evaluated=1, device="cpu",
                     wall_s=1.0)


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _median(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_ingest(folder: Path, n_layers: int, d_mlp: int, repeat: int) -> dict[str, float]:
    runs = [synthetic_result(n_layers, d_mlp, 16, name=f"big-{i}", seed=i)
            for i in range(repeat)]
    records = runs[0].records.num_rows
    with Store.open(folder / "ingest.duckdb") as store:
        upgrade(store)
        queue = iter(runs)
        ingest_s = _best(lambda: ingest_result(store, next(queue)), repeat)
        replace_s = _best(lambda: ingest_result(store, runs[0]), repeat)
        with store.write() as conn:
            raw_connection(conn).execute(
                    "CREATE TABLE raw_records (run_id BIGINT, metric VARCHAR, layer INTEGER, "
                    "component VARCHAR, head INTEGER, neuron INTEGER, value DOUBLE, "
                    "stderr DOUBLE, n BIGINT, unit VARCHAR)")
        table = runs[0].records

        def duckdb_insert() -> None:
            with store.write() as conn:
                raw = raw_connection(conn)
                raw.register("bench_arrow", table)
                raw.execute("INSERT INTO raw_records SELECT 1, * FROM bench_arrow")
                raw.unregister("bench_arrow")

        duckdb_s = _best(duckdb_insert, repeat)
    return {"records": records, "neurons": n_layers * d_mlp,
            "ingest_s": ingest_s, "ingest_records_per_s": records / ingest_s,
            "ingest_neurons_per_s": n_layers * d_mlp / ingest_s,
            "replace_s": replace_s,
            "duckdb_insert_s": duckdb_s, "duckdb_records_per_s": records / duckdb_s,
            "ingest_vs_duckdb": duckdb_s / ingest_s}


def bench_queries(folder: Path, total_runs: int, n_models: int, repeat: int,
                  shape: tuple[int, int, int]) -> dict[str, dict[str, float]]:
    n_layers, d_mlp, n_heads = shape
    names = [f"gpt2-like-{m}" for m in range(n_models)]
    rng = np.random.default_rng(0)
    rounds = total_runs // n_models
    # Round in which each model's current run (metric version "1") is stored; every other round
    # stores a run under the older version "0" -- so the current runs are scattered.
    current_round = rng.integers(0, rounds, n_models)
    out: dict[str, dict[str, float]] = {}
    layer = n_layers // 2
    with Store.open(folder / "queries.duckdb") as store:
        upgrade(store)

        def measure() -> dict[str, float]:
            # runs picked as the API picks them: its in-memory index (built once per write)
            snap = StoreIndex(store).snapshot()
            with store.read() as conn:
                model_id = snap.model(names[0]).id

                def per_layer_neurons() -> object:
                    run = snap.current_run(model_id, family="neurons", metric_version="1")
                    return repo.neurons(conn, run.id, layer=layer, neuron_class="prediction",
                                        top_k=20)

                def per_layer_metric() -> object:
                    run = snap.current_run(model_id, family="intervention",
                                           metric_version="1")
                    return repo.rows_of_runs(conn, [run.id], ["intervention.kl"],
                                             layer_min=layer, layer_max=layer)

                def cross_model() -> object:
                    runs = [snap.current_run(m, family="intervention", metric_version="1")
                            for m in snap.models]
                    return repo.rows_of_runs(conn, [r.id for r in runs if r],
                                             ["intervention.kl"], component="drop")

                assert cross_model().height == n_models * n_layers  # type: ignore[attr-defined]
                return {"per_layer_neurons_ms": 1e3 * _median(per_layer_neurons, repeat),
                        "per_layer_metric_ms": 1e3 * _median(per_layer_metric, repeat),
                        "cross_model_ms": 1e3 * _median(cross_model, repeat)}

        def store_round(r: int, current_only: bool) -> None:
            for m, name in enumerate(names):
                is_current = current_round[m] == r
                if current_only != is_current:
                    continue
                ingest_result(store, synthetic_result(
                    n_layers, d_mlp, n_heads, name=name, seed=r * n_models + m, options_seed=r,
                    metric_version="1" if is_current else "0", all_families=True,
                    top_tokens=True))

        for r in range(rounds):  # the 10 current runs first
            store_round(r, current_only=True)
        out["10_runs"] = measure()
        start = time.perf_counter()
        for r in range(rounds):
            store_round(r, current_only=False)
        fill_s = time.perf_counter() - start
        with store.read() as conn:
            stored = conn.exec_driver_sql("SELECT count(*) FROM runs").scalar()
            sizes = conn.exec_driver_sql(
                "SELECT (SELECT count(*) FROM results), (SELECT count(*) FROM neurons)").one()
        out[f"{stored}_runs"] = measure()
        out["fill"] = {"runs": stored, "results_rows": sizes[0], "neuron_rows": sizes[1],
                       "seconds": fill_s, "file_mb": (folder / "queries.duckdb").stat().st_size
                       / 2**20}
    return out


def bench_backup(folder: Path, n_models: int, repeat: int, shape: tuple[int, int, int]
                 ) -> dict[str, float]:
    from service.store.backup import backup, restore

    n_layers, d_mlp, n_heads = shape
    db = folder / "backup-source.duckdb"
    start = time.perf_counter()
    with Store.open(db) as store:
        upgrade(store)
        for m in range(n_models):
            ingest_result(store, synthetic_result(n_layers, d_mlp, n_heads, name=f"model-{m}",
                                                  seed=m, all_families=True, top_tokens=True))
        fill_s = time.perf_counter() - start
        with store.write() as conn:
            conn.exec_driver_sql("CHECKPOINT")
        db_bytes = db.stat().st_size
        times, size, runs = [], 0, 0
        for i in range(repeat):
            summary = backup(store, folder / f"copy-{i}.duckdb")
            times.append(summary.seconds)
            size, runs = summary.bytes, summary.runs
    start = time.perf_counter()
    restore(folder / "copy-0.duckdb", folder / "restored.duckdb")
    restore_s = time.perf_counter() - start
    return {"models": n_models, "runs": runs, "fill_s": fill_s, "database_mb": db_bytes / 2**20,
            "backup_mb": size / 2**20, "backup_s": min(times),
            "backup_mb_per_s": size / 2**20 / min(times), "restore_s": restore_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke check")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backup", action="store_true", help="only (c), the backup benchmark")
    parser.add_argument("--models", type=int, default=100, help="models in (c)'s store")
    args = parser.parse_args()
    if args.backup:
        shape = (6, 512, 8) if args.quick else (12, 3072, 12)
        with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
            result = bench_backup(Path(tmp), args.models, min(args.repeat, 3), shape)
        print(f"{result['models']} models ({result['runs']} runs) stored in "
              f"{result['fill_s']:.0f} s; database {result['database_mb']:.1f} MiB")
        print(f"backup: {result['backup_s']:.2f} s (best of {min(args.repeat, 3)}), "
              f"{result['backup_mb']:.1f} MiB = {result['backup_mb_per_s']:.0f} MiB/s; "
              f"restore {result['restore_s']:.2f} s")
        print(json.dumps({"backup": result}))
        return
    ingest_shape = (8, 1600) if args.quick else (48, 6400)
    runs = 100 if args.quick else args.runs
    query_shape = (6, 512, 8) if args.quick else (12, 3072, 12)
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        ingest = bench_ingest(Path(tmp), *ingest_shape, repeat=3)
        print(f"ingest {ingest['records']:,} records ({ingest['neurons']:,} neurons): "
              f"{ingest['ingest_s']:.3f} s = {ingest['ingest_records_per_s']:,.0f} records/s "
              f"({ingest['ingest_neurons_per_s']:,.0f} neurons/s); replacing the run "
              f"{ingest['replace_s']:.3f} s")
        print(f"DuckDB INSERT of the same Arrow table: {ingest['duckdb_insert_s']:.3f} s = "
              f"{ingest['duckdb_records_per_s']:,.0f} records/s -> ingest at "
              f"{100 * ingest['ingest_vs_duckdb']:.0f}% of it (target >= 50%)")
        queries = bench_queries(Path(tmp), runs, 10, args.repeat, query_shape)
    few, many = queries["10_runs"], next(v for k, v in queries.items()
                                         if k not in ("10_runs", "fill"))
    fill = queries["fill"]
    print(f"stored {fill['runs']} runs: {fill['results_rows']:,} result rows, "
          f"{fill['neuron_rows']:,} neuron rows, {fill['file_mb']:.0f} MiB "
          f"(filled in {fill['seconds']:.0f} s)")
    for key in few:
        print(f"{key}: 10 runs {few[key]:.2f} ms, {fill['runs']} runs {many[key]:.2f} ms "
              f"(x{many[key] / few[key]:.2f}; target <= 3)")
    print(json.dumps({"ingest": ingest, "queries": queries}))


if __name__ == "__main__":
    main()
