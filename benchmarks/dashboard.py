"""Dashboard benchmark: how responsive the page at / is with 100 models in the store.

    .venv/bin/python benchmarks/dashboard.py            # 100 models, ~2 minutes on 2 CPU cores
    .venv/bin/python benchmarks/dashboard.py --quick    # 12 models, fewer repeats

1. Seed a fresh store through the real ingest path (`ingest_result`, as benchmarks/api.py does):
   --models models (default 100) of 6 to 48 layers, 8 heads, --d-mlp neurons per layer, every
   metric family, neuron top tokens.
2. Start `strata serve` in its own process (production defaults; reconciliation off so no
   background computation competes with the page).
3. Drive headless Chromium (Debian's chromium + chromium-driver, through Selenium) and measure,
   in the page's own clock (performance.now(), 0 = navigation start):
   - time to first plot: navigation to the first panel drawn, with 2, 10 and all models
     selected through the URL (#models=...). With 2 models: the first visit of a fresh browser
     to the freshly started service (every asset downloaded and compressed for the first time,
     the server's caches empty), then the first visit of a second fresh browser (assets
     downloaded and compiled anew, the server warm); for each selection the median of
     --repeats reloads.
   - switching a metric: the drop/swap panel's metric select changed to a metric not read before
     (one uncached API request per selected model, then the redraw), until the next animation
     frame after the panel drew; median and max over the intervention metrics.
   - switching the x axis (layer <-> relative depth): every visible panel redrawn from the
     page's cache.
   - filtering the model list (typing in the search box) with every model listed.
4. Print a table and, as the last line, a JSON summary. Targets: first plot < 1 s, metric
   switch < 300 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.api import seed  # noqa: E402
from tests.serving import free_port, start_service  # noqa: E402

SWITCH_METRICS = ["intervention.top1_agreement", "intervention.entropy",
                  "intervention.entropy_delta", "intervention.loss", "intervention.loss_delta",
                  "intervention.accuracy"]

SWITCH_JS = """
const [panelId, select, value, done] = arguments;
const s = document.querySelector(`section[data-panel='${panelId}']`);
const seq = Number(s.dataset.seq);
const el = s.querySelector(select);
const t0 = performance.now();
el.value = value;
el.dispatchEvent(new Event('change'));
const check = () => {
  if (Number(s.dataset.seq) > seq) {
    requestAnimationFrame(() => done([s.dataset.state, performance.now() - t0,
                                      window.strata.lastDraw]));
  } else {
    requestAnimationFrame(check);
  }
};
check();
"""

XMODE_JS = """
const [mode, done] = arguments;
const panels = [...document.querySelectorAll('section.panel')].filter(s => {
  const r = s.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight;
});
const seqs = panels.map(s => Number(s.dataset.seq));
const t0 = performance.now();
document.getElementById(mode).click();
const check = () => {
  if (panels.every((s, i) => Number(s.dataset.seq) > seqs[i])) {
    requestAnimationFrame(() => done([panels.length, performance.now() - t0]));
  } else {
    requestAnimationFrame(check);
  }
};
check();
"""

SEARCH_JS = """
const [text, done] = arguments;
const input = document.getElementById('model-search');
const t0 = performance.now();
input.value = text;
input.dispatchEvent(new Event('input'));
requestAnimationFrame(() => done([document.querySelectorAll('#model-list li').length,
                                  performance.now() - t0]));
"""


def start_server(db: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "STRATA_DATABASE": str(db), "HF_HUB_OFFLINE": "1",
           "STRATA_JOBS__RECONCILE": "false", "STRATA_JOBS__RECONCILE_INTERVAL_S": "86400",
           "STRATA_DATA_DIR": str(db.parent / "data"),
           # one browser reloading a 100-model page many times a minute: beyond the default
           # read budget per address, which is not what this measures
           "STRATA_API__READ_RATE_LIMIT": "1000000000/minute"}
    return start_service(env, log=log, port=port, args=["--log-level", "warning"],
                         inherit=False).proc


def chrome() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-dev-shm-usage", "--window-size=1500,1100"):
        options.add_argument(arg)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("needs chromium and chromedriver (apt-get install chromium "
                         "chromium-driver)")
    options.binary_location = chromium
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_script_timeout(120)
    return driver


def first_plot(driver: Any, url: str) -> float:
    """Navigate and return the page's time (ms since navigation) of its first drawn panel."""
    driver.get("about:blank")
    driver.get(url)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        at = driver.execute_script("return window.strata && window.strata.firstPlotAt")
        if at is not None:
            return float(at)
        time.sleep(0.02)
    raise RuntimeError(f"no plot within 120 s: {url}")


def wait_ready(driver: Any) -> None:
    deadline = time.monotonic() + 120
    while not driver.execute_script("return document.body.dataset.ready === 'true'"):
        if time.monotonic() > deadline:
            raise RuntimeError("the page never became ready")
        time.sleep(0.02)
    # the top two panels drawn
    while not driver.execute_script(
            "return ['drop', 'swap'].every(p => document.querySelector("
            "`section[data-panel='${p}']`).dataset.state === 'drawn')"):
        if time.monotonic() > deadline:
            raise RuntimeError("the first panels never drew")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--d-mlp", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.models, args.repeats = 12, 2

    tmp = Path(tempfile.mkdtemp(prefix="strata-bench-dashboard-"))
    db = tmp / "strata.duckdb"
    models, seed_s = seed(db, args.models, args.d_mlp)
    print(f"seeded {len(models)} models in {seed_s:.1f} s", flush=True)
    port = free_port()
    proc = start_server(db, port, tmp / "serve.log")
    base = f"http://127.0.0.1:{port}/"
    driver = chrome()
    results: dict[str, Any] = {"models_in_store": len(models)}
    try:
        names = [name for name, _ in models]
        selections = {2: [names[0], names[-1]], 10: names[:: max(1, len(names) // 10)][:10],
                      len(names): names}
        rows = []
        for count, chosen in selections.items():
            url = base + "#models=" + ",".join(chosen)
            cold = fresh = None
            if count == 2:
                cold = first_plot(driver, url)
                other = chrome()  # a second browser, its cache empty; the server has served once
                try:
                    fresh = first_plot(other, url)
                finally:
                    other.quit()
            warm = [first_plot(driver, url) for _ in range(args.repeats)]
            wait_ready(driver)
            switches, fetches, renders = [], [], []
            for metric in SWITCH_METRICS:
                state, ms, last = driver.execute_async_script(SWITCH_JS, "swap",
                                                              "select.metric", metric)
                if state != "drawn":
                    raise RuntimeError(f"switching to {metric} ended {state}")
                switches.append(ms)
                fetches.append(last["fetch_ms"])
                renders.append(last["render_ms"])
            components = []
            for component in ("drop_attn", "drop_mlp", "drop"):
                state, ms, _ = driver.execute_async_script(SWITCH_JS, "swap",
                                                           "select.component", component)
                components.append(ms)
            xmodes = []
            for mode in ("x-depth", "x-layer", "x-depth", "x-layer"):
                panels, ms = driver.execute_async_script(XMODE_JS, mode)
                xmodes.append(ms)
            search = [driver.execute_async_script(SEARCH_JS, text)[1]
                      for text in ("model-0", "model-09", "", "48", "")]
            row = {"selected": count, "first_plot_cold_ms": cold,
                   "first_plot_new_browser_ms": fresh,
                   "first_plot_warm_ms": statistics.median(warm),
                   "switch_metric_median_ms": statistics.median(switches),
                   "switch_metric_max_ms": max(switches),
                   "switch_fetch_median_ms": statistics.median(fetches),
                   "switch_render_median_ms": statistics.median(renders),
                   "switch_component_median_ms": statistics.median(components),
                   "switch_x_axis_median_ms": statistics.median(xmodes),
                   "visible_panels": panels,
                   "search_median_ms": statistics.median(search)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        results["rows"] = rows
    finally:
        driver.quit()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.0f}"

    print(f"\n{len(models)} models in the store (6-48 layers, every family)\n")
    print("| models selected | first plot: first visit after start / another new browser / "
          "reload (ms) | switch metric, median / max (ms) | of which requests / drawing (ms) | "
          "switch component (ms) | x axis, visible panels (ms) | search (ms) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in results["rows"]:
        print(f"| {row['selected']} | {cell(row['first_plot_cold_ms'])} / "
              f"{cell(row['first_plot_new_browser_ms'])} / "
              f"{cell(row['first_plot_warm_ms'])} | {cell(row['switch_metric_median_ms'])} / "
              f"{cell(row['switch_metric_max_ms'])} | {cell(row['switch_fetch_median_ms'])} / "
              f"{cell(row['switch_render_median_ms'])} | "
              f"{cell(row['switch_component_median_ms'])}"
              f" | {cell(row['switch_x_axis_median_ms'])} ({row['visible_panels']}) | "
              f"{cell(row['search_median_ms'])} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
