"""API benchmark: the real server under load on loopback.

    .venv/bin/python benchmarks/api.py            # ~100 models, a few minutes on 2 CPU cores
    .venv/bin/python benchmarks/api.py --quick    # 12 models, short runs: a smoke check
    .venv/bin/python benchmarks/api.py --limiter-only   # only step 5: the rate limiter's cost

1. Seed a fresh store through the real ingest path (`ingest_result`): --models models (default
   100) of 6 to 48 layers, 8 heads, 1,024 neurons per layer, every metric family (all the record
   shapes a real sweep writes: interventions, logit lens, neurons with top tokens, similarity,
   attention per layer and head, norms, heads).
2. Start `strata serve` as it runs in production (its own process, one uvicorn worker, defaults,
   no access log), on a free loopback port.
3. Drive it from a closed-loop load generator in this process (asyncio, raw HTTP/1.1 keep-alive,
   --connections connections), bounded: --seconds per scenario and at most --max-requests
   requests, after a warm-up (every URL of the scenario requested once, then 1 s of load: the
   figures are the steady state of a server whose answers have all been asked for before).
   Each scenario draws its URLs at random from a fixed set; no If-None-Match is sent, so every
   answer carries its body:
     trivial     GET /api/v1/health
     per-layer   GET /api/v1/models/{m}/metrics?metric=..&component=..   (700 URLs: 100 models x
                 7 metrics, 6-48 rows each)
     compare-10  GET /api/v1/compare?metric=intervention.kl&component=drop&models=<10>&bins=20
     neuron-top  GET /api/v1/models/{m}/neurons?class=prediction&top=20&layer={l}
4. Report req/s, p50 and p99 latency per scenario, and the two targets: per-layer req/s >= 50 %
   of trivial req/s; compare-10 p99 <= 10 x per-layer p99.
Steps 2-4 run twice: with the production settings (the in-memory caches of run rows and
encoded answers on: URLs repeat, as dashboards repeat them), then with both caches off
(STRATA_API__ROW_CACHE_ROWS=0, STRATA_API__RESPONSE_CACHE_MB=0: every request reads DuckDB).
In both the rate limiter counts every request against a budget the load never reaches (the
default budget, 12,000 reads a minute per address, would refuse most of this one client's
load).
5. The rate limiter's cost on the per-layer query: two servers side by side on copies of the store,
   one with the limiter on (a budget never reached, so every request is counted and checked)
   and one with it off (STRATA_API__READ_RATE_LIMIT= and STRATA_API__WRITE_RATE_LIMIT=
   empty), measured in alternating rounds (--rounds x --round-seconds each), so the machine's
   background load falls on both alike; the cost is 1 - (req/s on) / (req/s off), median of
   the rounds (target < 10 %). Then the same in one process, without HTTP: the per-layer
   query's ASGI call (routing, middleware, handler, the cached answer) on two apps over one
   store, limiter on and off, alternating every request (--asgi-requests each), so background
   load on a shared machine falls on both alike; the cost is the extra time per request.
Prints a JSON summary as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.store import synthetic_result  # noqa: E402
from compute.run import METRIC_VERSION  # noqa: E402
from service.store import Store  # noqa: E402
from service.store.ingest import ingest_result  # noqa: E402
from service.store.migrate import upgrade  # noqa: E402
from tests.serving import free_port, start_service  # noqa: E402

PER_LAYER = [("intervention.kl", "drop"), ("intervention.loss_delta", "swap"),
             ("logit_lens.kl_to_final", None), ("attention.prev_5", None), ("norms.resid", None),
             ("similarity.self", "attn"), ("neurons.frac_prediction", None)]


def seed(db: Path, n_models: int, d_mlp: int) -> tuple[list[tuple[str, int]], float]:
    """Models (name, layers) stored through `ingest_result`, and the seconds it took."""
    models = [(f"model-{i:03d}", 6 + (42 * i) // max(n_models - 1, 1)) for i in range(n_models)]
    start = time.perf_counter()
    with Store.open(db) as store:
        upgrade(store)
        for i, (name, n_layers) in enumerate(models):
            ingest_result(store, synthetic_result(n_layers, d_mlp, 8, name=name, seed=i,
                                                  metric_version=METRIC_VERSION,
                                                  all_families=True, top_tokens=True))
    return models, time.perf_counter() - start


# A read budget this benchmark's load never reaches: every request is counted and checked.
UNREACHED = {"STRATA_API__READ_RATE_LIMIT": "1000000000/minute",
             "STRATA_API__WRITE_RATE_LIMIT": "1000000000/minute"}
NO_LIMITS = {"STRATA_API__READ_RATE_LIMIT": "", "STRATA_API__WRITE_RATE_LIMIT": ""}


def start_server(db: Path, port: int, log: Path, *, caches: bool = True,
                 limits: dict[str, str] = UNREACHED) -> subprocess.Popen[bytes]:
    env = {**os.environ, "STRATA_DATABASE": str(db), "HF_HUB_OFFLINE": "1",
           "STRATA_DATA_DIR": str(log.parent / f"state-{port}"), **limits}
    if not caches:
        env |= {"STRATA_API__ROW_CACHE_ROWS": "0", "STRATA_API__RESPONSE_CACHE_MB": "0"}
    return start_service(env, log=log, port=port, args=["--log-level", "warning"],
                         inherit=False).proc


async def _worker(port: int, urls: list[str], rng: random.Random | None, until: float,
                  budget: list[int], latencies: list[float], errors: list[str]) -> None:
    """Requests on one keep-alive connection: random URLs until `until` (or the budget runs
    out); with no `rng`, each URL of `urls` once, in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sequence = iter(urls)
    try:
        while time.perf_counter() < until and budget[0] > 0:
            if rng is None:
                url = next(sequence, None)
                if url is None:
                    break
            else:
                url = urls[rng.randrange(len(urls))]
            budget[0] -= 1
            start = time.perf_counter()
            writer.write(f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                errors.append(f"{status} {url}")
    finally:
        writer.close()


async def _load(port: int, urls: list[str], connections: int, seconds: float,
                max_requests: int) -> tuple[list[float], list[str], float]:
    latencies: list[float] = []
    errors: list[str] = []
    budget = [max_requests]
    start = time.perf_counter()
    await asyncio.gather(*(_worker(port, urls, random.Random(i), start + seconds, budget,
                                   latencies, errors) for i in range(connections)))
    return latencies, errors, time.perf_counter() - start


async def _each_once(port: int, urls: list[str], connections: int, max_requests: int) -> None:
    budget, latencies, errors = [max_requests], [], []  # type: ignore[var-annotated]
    await asyncio.gather(*(_worker(port, urls[i::connections], None, float("inf"), budget,
                                   latencies, errors) for i in range(connections)))
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[:3]}")


def scenario(port: int, urls: list[str], connections: int, seconds: float,
             max_requests: int) -> dict[str, float]:
    # Warm-up: every URL once (so the measured window is the steady state), then 1 s of load.
    asyncio.run(_each_once(port, urls, connections, max_requests))
    asyncio.run(_load(port, urls, connections, 1.0, max_requests))
    latencies, errors, elapsed = asyncio.run(_load(port, urls, connections, seconds,
                                                   max_requests))
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[:3]}")
    latencies.sort()
    return {"requests": len(latencies), "seconds": round(elapsed, 2),
            "req_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(1000 * statistics.median(latencies), 2),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2)}


def limiter_cost(db: Path, folder: Path, urls: list[str], connections: int, rounds: int,
                 seconds: float, max_requests: int) -> dict[str, object]:
    """Step 5: per-layer req/s and p50 with the limiter on and off, in alternating rounds."""
    ports = {"on": free_port(), "off": free_port()}
    copy = folder / "limiter-off.duckdb"  # DuckDB: one process per file, so a copy each
    shutil.copyfile(db, copy)
    procs = {}
    try:
        for label, limits, file in (("on", UNREACHED, db), ("off", NO_LIMITS, copy)):
            procs[label] = start_server(file, ports[label], folder / f"serve-{label}.log",
                                        limits=limits)
            asyncio.run(_each_once(ports[label], urls, connections, max_requests))
            asyncio.run(_load(ports[label], urls, connections, 1.0, max_requests))
        runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
        for r in range(rounds):
            for label in (("on", "off") if r % 2 == 0 else ("off", "on")):
                latencies, errors, elapsed = asyncio.run(_load(
                    ports[label], urls, connections, seconds, max_requests))
                if errors:
                    raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[:3]}")
                runs[label].append({"req_per_s": len(latencies) / elapsed,
                                    "p50_ms": 1000 * statistics.median(latencies)})
                print(f"round {r + 1} limiter {label:3s} {runs[label][-1]['req_per_s']:8.1f} "
                      f"req/s   p50 {runs[label][-1]['p50_ms']:6.2f} ms", file=sys.stderr)
    finally:
        for proc in procs.values():
            stop(proc)
    costs = [1 - on["req_per_s"] / off["req_per_s"] for on, off in zip(runs["on"], runs["off"],
                                                                       strict=True)]
    cost = statistics.median(costs)
    summary = {label: {"req_per_s": round(statistics.median(r["req_per_s"] for r in rs), 1),
                       "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 3)}
               for label, rs in runs.items()}
    print(f"rate limiter on the per-layer query: {100 * cost:.1f} % fewer req/s (median of "
          f"{rounds} alternating rounds; rounds {', '.join(f'{100 * c:.1f}' for c in costs)} "
          "%; target < 10 %)", file=sys.stderr)
    return {**summary, "cost": round(cost, 4), "round_costs": [round(c, 4) for c in costs],
            "target_met": cost < 0.10}


def limiter_cost_asgi(db: Path, urls: list[str], n_requests: int) -> dict[str, object]:
    """Step 5, in process: the per-layer query's ASGI call with the limiter on and off,
    alternating request by request; medians of the time per request."""
    from service.api.app import create_app
    from service.settings import ApiSettings, Settings

    def app_with(limits: dict[str, str]) -> object:
        api = ApiSettings(read_rate_limit=limits["STRATA_API__READ_RATE_LIMIT"],
                          write_rate_limit=limits["STRATA_API__WRITE_RATE_LIMIT"])
        return create_app(Settings(database=db, api=api), store)

    async def call(app: object, url: str) -> float:
        path, _, query = url.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "root_path": "", "query_string": query.encode(), "headers": [
                     (b"host", b"127.0.0.1")], "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8000)}
        status = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        start = time.perf_counter()
        await app(scope, receive, send)  # type: ignore[operator]
        elapsed = time.perf_counter() - start
        if status != [200]:
            raise RuntimeError(f"{status} {url}")
        return elapsed

    async def run(apps: dict[str, object]) -> dict[str, list[float]]:
        for url in urls:  # warm both: every answer cached, as in the steady state
            for app in apps.values():
                await call(app, url)
        rng = random.Random(0)
        times: dict[str, list[float]] = {label: [] for label in apps}
        for i in range(n_requests):
            url = urls[rng.randrange(len(urls))]
            for label in (("on", "off") if i % 2 == 0 else ("off", "on")):
                times[label].append(await call(apps[label], url))
        return times

    with Store.open(db) as store:
        times = asyncio.run(run({"on": app_with(UNREACHED), "off": app_with(NO_LIMITS)}))
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"in process (ASGI, {n_requests} requests each, alternating): per-layer query "
          f"{1e6 * on:.0f} us with the limiter, {1e6 * off:.0f} us without: "
          f"+{1e6 * (on - off):.1f} us ({100 * (on / off - 1):.1f} %)", file=sys.stderr)
    return {"on_us": round(1e6 * on, 1), "off_us": round(1e6 * off, 1),
            "cost": round(on / off - 1, 4), "target_met": on / off - 1 < 0.10}


def url_sets(models: list[tuple[str, int]], rng: random.Random) -> dict[str, list[str]]:
    names = [name for name, _ in models]
    per_layer = [f"/api/v1/models/{name}/metrics?metric={metric}"
                 + (f"&component={component}" if component else "")
                 for name in names for metric, component in PER_LAYER]
    compare = ["/api/v1/compare?metric=intervention.kl&component=drop&bins=20&models="
               + ",".join(rng.sample(names, min(10, len(names)))) for _ in range(200)]
    neurons = [f"/api/v1/models/{name}/neurons?class=prediction&top=20&layer={layer}"
               for name, n_layers in models for layer in rng.sample(range(n_layers), 5)]
    return {"trivial": ["/api/v1/health"], "per-layer": per_layer, "compare-10": compare,
            "neuron-top": neurons}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--d-mlp", type=int, default=1024)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--limiter-only", action="store_true",
                        help="only step 5, the rate limiter's cost")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-seconds", type=float, default=4.0)
    parser.add_argument("--asgi-requests", type=int, default=20_000)
    args = parser.parse_args()
    if args.quick:
        args.models, args.d_mlp, args.seconds = 12, 256, 2.0
        args.rounds, args.round_seconds, args.asgi_requests = 2, 2.0, 2000
    folder = Path(tempfile.mkdtemp(prefix="strata-api-bench-"))
    proc = None
    try:
        db = folder / "strata.duckdb"
        models, seed_s = seed(db, args.models, args.d_mlp)
        print(f"seeded {len(models)} models ({models[0][1]}-{models[-1][1]} layers, "
              f"{args.d_mlp} neurons/layer, all families) in {seed_s:.1f} s; "
              f"{db.stat().st_size / 2**20:.0f} MiB", file=sys.stderr)
        summary: dict[str, object] = {"models": len(models), "d_mlp": args.d_mlp,
                                      "seed_s": round(seed_s, 1),
                                      "connections": args.connections}
        for label, caches in (() if args.limiter_only else (("production", True),
                                                             ("caches off", False))):
            port = free_port()
            proc = start_server(db, port, folder / "serve.log", caches=caches)
            print(f"-- strata serve, {label}", file=sys.stderr)
            results = {}
            for name, urls in url_sets(models, random.Random(0)).items():
                results[name] = scenario(port, urls, args.connections, args.seconds,
                                         args.max_requests)
                r = results[name]
                print(f"{name:11s} {r['req_per_s']:8.1f} req/s   p50 {r['p50_ms']:7.2f} ms   "
                      f"p99 {r['p99_ms']:7.2f} ms   ({r['requests']} requests)",
                      file=sys.stderr)
            stop(proc)
            ratio = results["per-layer"]["req_per_s"] / results["trivial"]["req_per_s"]
            tail = results["compare-10"]["p99_ms"] / results["per-layer"]["p99_ms"]
            summary[label] = {
                "scenarios": results, "per_layer_vs_trivial_req_per_s": round(ratio, 3),
                "compare10_p99_vs_per_layer_p99": round(tail, 2),
                "targets_met": {"per_layer >= 0.5 x trivial": ratio >= 0.5,
                                "compare10 p99 <= 10 x per_layer p99": tail <= 10}}
            print(f"per-layer / trivial req/s = {ratio:.2f} (target >= 0.5); compare-10 p99 / "
                  f"per-layer p99 = {tail:.2f} (target <= 10)", file=sys.stderr)
        print("-- the rate limiter's cost (per-layer query)", file=sys.stderr)
        summary["rate limiter"] = limiter_cost(
            db, folder, url_sets(models, random.Random(0))["per-layer"], args.connections,
            args.rounds, args.round_seconds, args.max_requests)
        summary["rate limiter in process"] = limiter_cost_asgi(
            db, url_sets(models, random.Random(0))["per-layer"], args.asgi_requests)
        print(json.dumps(summary))
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
