"""The dashboard at `/`, end to end (over ~500 lines: one browser session serves every panel's
test): a real `strata serve` seeded through the real ingest path
with results that compute produced for two zoo models of different depths (tiny-2l-s0: 2
layers, tiny-4l-s0: 4 layers) and a refit family's stability, driven by headless Chromium
(Debian's chromium + chromium-driver) through Selenium.

Screenshots land in build/screenshots/ (gitignored). The browser's console must stay free of
errors in every test (a failed request shows there too).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest

from compute.run import RunResult
from tests.integration.web_harness import KEY, MODELS, Service

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "screenshots"
MEDIA = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet",
         "json": "application/json"}
JAVASCRIPT = {"text/javascript", "application/javascript"}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The browser and the polling wait are the screenshot script's (scripts/dashboard_screenshot.py).
_spec = importlib.util.spec_from_file_location(
    "dashboard_screenshot", ROOT / "scripts" / "dashboard_screenshot.py")
assert _spec is not None
assert _spec.loader is not None
SCREENSHOT = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SCREENSHOT)
CHROMEDRIVER = shutil.which("chromedriver")

BROWSER_MISSING = "needs Debian's chromium and chromium-driver (.ci/run installs them)"


def require_browser() -> None:
    """Skip without the browser and its driver, or fail under CI, whose .ci/run installs
    both: a missing prerequisite there is a broken CI, not a reason to skip."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        if os.environ.get("CI"):
            pytest.fail(BROWSER_MISSING)
        pytest.skip(BROWSER_MISSING)


@pytest.fixture(autouse=True, scope="module")
def _browser() -> None:
    """First of the module's fixtures: before a service or a browser is started."""
    require_browser()


@pytest.fixture(scope="module")
def service(web: Service) -> Service:
    return web


def chrome() -> Any:
    return SCREENSHOT.browser(1500, 1100)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chrome()
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture
def page(browser: Any, service: Service) -> Iterator[Any]:
    """The browser on a freshly loaded dashboard; no console error may appear."""
    browser.get("about:blank")
    browser.get_log("browser")  # drop what earlier tests left
    browser.get(service.base + "/")
    wait_for(browser, lambda: browser.execute_script("return document.body.dataset.ready"))
    yield browser
    errors = console_errors(browser)
    assert not errors, errors


def timed_out(driver: Any) -> Callable[[str], None]:
    """What a wait that ran out does in a test: keep a screenshot of the page, then fail."""
    def fail(what: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SCREENSHOTS / "timeout.png"))
        raise AssertionError(f"timed out waiting for {what}")

    return fail


def wait_for(driver: Any, check: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    return SCREENSHOT.wait_for(check, what or str(check), timeout, on_timeout=timed_out(driver))


def screenshot(driver: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def click(driver: Any, selector: str, what: str) -> None:
    """Click the element `selector`, found again if the page redrew it under the click (the
    job list is rebuilt on every poll)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def clicked() -> bool:
        try:
            found = driver.find_elements(By.CSS_SELECTOR, selector)
            if found:
                found[0].click()
            return bool(found)
        except StaleElementReferenceException:
            return False

    wait_for(driver, clicked, what=what)


def select_models(driver: Any, names: list[str]) -> None:
    """Pick models the way a user does: search, tick (the screenshot script's `tick`)."""
    for name in names:
        SCREENSHOT.tick(driver, name, on_timeout=timed_out(driver))


def panel_ids(driver: Any) -> list[str]:
    return list(driver.execute_script(
        "return [...document.querySelectorAll('section.panel')].map(s => s.dataset.panel)"))


def drawn(driver: Any, panel: str, after: int = 0) -> dict[str, Any]:
    """Scroll a panel into view, wait until it has drawn (after draw number `after`), and
    return what it drew: per trace its name, x, y and number of heat-map cells."""
    driver.execute_script(
        "document.querySelector(`section[data-panel='${arguments[0]}']`).scrollIntoView()",
        panel)

    def state() -> Any:
        got = driver.execute_script(
            "const s = document.querySelector(`section[data-panel='${arguments[0]}']`);"
            "return [s.dataset.state, Number(s.dataset.seq)];", panel)
        return got if got[0] in ("drawn", "empty", "error") and got[1] > after else None

    status, seq = wait_for(driver, state, what=f"panel {panel}")
    assert status == "drawn", (panel, status, driver.execute_script(
        "return document.querySelector(`section[data-panel='${arguments[0]}'] .note`)"
        ".textContent", panel))
    traces = driver.execute_script("""
        const s = document.querySelector(`section[data-panel='${arguments[0]}']`);
        const gd = s.querySelector('.plot');
        return ((gd && gd.data) || []).filter(t => t.meta !== 'boundary').map(t => ({
          name: t.name, type: t.type, x: t.x, y: t.y,
          cells: t.z ? t.z.flat().filter(v => v !== null).length : null}));""", panel)
    return {"seq": seq, "traces": traces}


def expected_points(result: RunResult, metric: str, component: str | None = None) -> int:
    table = result.records.to_pylist()
    return sum(1 for r in table if r["metric"] == metric and r["layer"] is not None
               and r["head"] is None and r["neuron"] is None
               and (component is None or r["component"] == component))


# Line panels: (panel, metric, component) as the page draws them by default.
LINES = [("drop", "intervention.kl", "drop"), ("swap", "intervention.kl", "swap"),
         ("top1", "intervention.top1_agreement", "drop"),
         ("entropy-delta", "intervention.entropy_delta", "drop"),
         ("drop-attn", "intervention.kl", "drop_attn"),
         ("drop-mlp", "intervention.kl", "drop_mlp"),
         ("lens-kl", "logit_lens.kl_to_final", None), ("lens-entropy", "logit_lens.entropy", None),
         ("n-prediction", "neurons.n_prediction_cal", None),
         ("n-suppression", "neurons.n_suppression_cal", None),
         ("n-partition", "neurons.n_partition_cal", None), ("prev-k", "attention.prev_5", None),
         ("sink", "attention.bos", None), ("norm-ratio", "norms.attn_mlp_ratio", None),
         ("sim-self", "similarity.self", "attn"), ("sim-index", "similarity.index", "attn"),
         ("sim-adjacent", "similarity.adjacent", "attn")]
HEATMAPS = [("heads-ablation", "heads.ablation_kl"), ("heads-induction", "heads.induction")]


def test_page_loads_from_this_service_alone(page: Any, service: Service) -> None:
    """No console error, every model listed, and every resource from this origin."""
    names = page.execute_script(
        "return [...document.querySelectorAll('#model-list li')].map(l => l.dataset.modelName)")
    assert set(MODELS) <= set(names)
    # each model's parity report in a word: a zoo checkpoint matched the Hugging Face forward
    badges = page.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#model-list li')]"
        ".map(l => [l.dataset.modelName, l.querySelector('.parity')?.textContent]))")
    assert badges["tiny-2l-s0"] == "HF \u2713", badges
    resources = page.execute_script(
        "return performance.getEntriesByType('resource').map(r => r.name)")
    assert resources, "the page loaded nothing"
    assert all(r.startswith(service.base + "/") for r in resources), resources
    html = service.client.get("/").text
    assert "http://" not in html
    assert "https://" not in html
    # the page's ES modules (main.js and the imports it preloads): a browser runs a module only
    # when it is served with a JavaScript media type
    modules = re.findall(r'"(/static/web/[\w-]+\.js)"', html)
    assert "/static/web/main.js" in modules, modules
    for module in modules:
        answer = service.client.get(module)
        assert answer.status_code == 200, module
        assert answer.headers["content-type"].split(";")[0] in JAVASCRIPT, (module, answer.headers)
    assert service.client.get("/static/vendor/LICENSE.plotly.js.txt").status_code == 200
    plotly = service.client.get("/static/vendor/plotly-cartesian-4.1.1.min.js")
    assert plotly.status_code == 200
    assert "immutable" in plotly.headers["cache-control"]
    screenshot(page, "empty")


def test_two_models_draw_every_plot(page: Any, service: Service) -> None:
    select_models(page, list(MODELS))
    for panel, metric, component in LINES:
        traces = drawn(page, panel)["traces"]
        assert [t["name"] for t in traces] == list(MODELS), (panel, traces)
        for trace, name in zip(traces, MODELS, strict=True):
            want = expected_points(service.results[name], metric, component)
            assert want > 0, (panel, name)
            assert len(trace["x"]) == len(trace["y"]) == want, (panel, name, trace["x"])
            assert trace["x"] == sorted(trace["x"])
    for panel, metric in HEATMAPS:
        traces = drawn(page, panel)["traces"]
        assert [t["name"] for t in traces] == list(MODELS)
        for trace, name in zip(traces, MODELS, strict=True):
            heads = [r for r in service.results[name].records.to_pylist()
                     if r["metric"] == metric and r["head"] is not None]
            assert trace["cells"] == len(heads) > 0
    page.execute_script("document.querySelector('#panels').scrollIntoView()")
    screenshot(page, "two-models-by-layer")


def test_relative_depth_realigns_the_models(page: Any, service: Service) -> None:
    from selenium.webdriver.common.by import By

    select_models(page, list(MODELS))
    before = drawn(page, "drop")
    lens_before = drawn(page, "lens-kl")
    page.find_element(By.ID, "x-depth").click()
    drop = drawn(page, "drop", after=before["seq"])["traces"]
    for trace, (_, layers) in zip(drop, MODELS.items(), strict=True):
        assert trace["x"] == pytest.approx([i / (layers - 1) for i in range(layers)])
    lens = drawn(page, "lens-kl", after=lens_before["seq"])["traces"]
    for trace, (_, layers) in zip(lens, MODELS.items(), strict=True):
        assert trace["x"] == pytest.approx([i / layers for i in range(layers + 1)])
    assert "x=depth" in page.execute_script("return location.hash")
    page.execute_script("document.querySelector('#panels').scrollIntoView()")
    screenshot(page, "two-models-by-relative-depth")
    page.find_element(By.ID, "x-layer").click()
    drop = drawn(page, "drop", after=before["seq"])["traces"]
    assert drop[1]["x"] == [0, 1, 2, 3]


def test_switching_a_metric_redraws_from_the_api(page: Any, service: Service) -> None:
    from selenium.webdriver.support.select import Select

    select_models(page, list(MODELS))
    first = drawn(page, "drop")
    Select(page.find_element(By_css(), "section[data-panel='drop'] select.component")
           ).select_by_value("swap")
    swap = drawn(page, "drop", after=first["seq"])["traces"]
    assert [len(t["x"]) for t in swap] == [layers - 1 for layers in MODELS.values()]
    Select(page.find_element(By_css(), "section[data-panel='drop'] select.metric")
           ).select_by_value("intervention.loss_delta")
    loss = drawn(page, "drop", after=first["seq"] + 1)["traces"]
    api = service.client.get("/api/v1/models/tiny-4l-s0/metrics",
                             params={"metric": "intervention.loss_delta",
                                     "component": "swap"}).json()
    assert loss[1]["y"] == pytest.approx([r["value"] for r in api["rows"]])


def test_neuron_panels_open_on_the_calibrated_classes(page: Any, service: Service) -> None:
    """The neuron count panels draw the width-calibrated classes (docs/metrics.md's default);
    the study's fixed cut-offs stay selectable, labelled as such."""
    from selenium.webdriver.support.select import Select

    select_models(page, ["tiny-4l-s0"])

    def api(metric: str) -> list[float]:
        answer = service.client.get("/api/v1/models/tiny-4l-s0/metrics",
                                    params={"metric": metric}).json()
        return [r["value"] for r in answer["rows"]]

    first = drawn(page, "n-partition")
    assert first["traces"][0]["y"] == pytest.approx(api("neurons.n_partition_cal"))
    picker = Select(page.find_element(By_css(), "section[data-panel='n-partition'] select.metric"))
    assert picker.first_selected_option.get_attribute("value") == "neurons.n_partition_cal"
    labels = {o.get_attribute("value"): o.text for o in picker.options}
    for cls in ("prediction", "suppression", "partition"):
        assert "calibrated" in labels[f"neurons.n_{cls}_cal"]
        assert "fixed cut-offs" in labels[f"neurons.n_{cls}"]
    for panel in ("n-prediction", "n-suppression"):
        chosen = Select(page.find_element(By_css(), f"section[data-panel='{panel}'] select.metric"))
        assert chosen.first_selected_option.get_attribute("value").endswith("_cal"), panel
    picker.select_by_value("neurons.n_partition")
    fixed = drawn(page, "n-partition", after=first["seq"])["traces"][0]["y"]
    assert fixed == pytest.approx(api("neurons.n_partition"))
    assert fixed != pytest.approx(first["traces"][0]["y"])  # tiny models: every neuron, fixed


def By_css() -> str:  # noqa: N802 - reads like selenium's By.CSS_SELECTOR
    from selenium.webdriver.common.by import By

    return str(By.CSS_SELECTOR)


def test_exports_and_downloads_are_the_api_data(page: Any, service: Service) -> None:
    select_models(page, list(MODELS))
    drawn(page, "drop")
    images = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const gd = document.querySelector("section[data-panel='drop'] .plot");
        Promise.all([Plotly.toImage(gd, {format: 'png', width: 800, height: 400}),
                     Plotly.toImage(gd, {format: 'svg', width: 800, height: 400})])
          .then(done, e => done(['error', String(e)]));""")
    assert images[0].startswith("data:image/png;base64,"), images[0][:80]
    assert images[1].startswith("data:image/svg+xml"), images[1][:80]
    assert page.find_elements(By_css(), "section[data-panel='drop'] button[data-export=png]")
    links = page.execute_script(
        "return [...document.querySelectorAll(\"section[data-panel='drop'] .links a\")]"
        ".map(a => [a.dataset.format, a.getAttribute('href')])")
    assert sorted({f for f, _ in links}) == ["csv", "json", "parquet"]
    assert len(links) == 3 * len(MODELS)
    for fmt, href in links:
        assert href.startswith("/api/v1/models/")
        response = service.client.get(href)
        assert response.status_code == 200
        path, _, query = href.partition("?")
        params = dict(parse_qsl(query))
        assert params.pop("format") == fmt
        direct = service.client.get(path, params=params, headers={"Accept": MEDIA[fmt]})
        assert response.content == direct.content
    csv = service.client.get(links[0][1]).text.splitlines()
    assert csv[0].replace('"', "").startswith("metric,component,layer,relative_depth,value")
    assert len(csv) == 1 + MODELS["tiny-2l-s0"]


def test_downloads_carry_the_saved_key(page: Any, service: Service) -> None:
    """With a key saved, a download is fetched with it (reads may be private)."""
    page.execute_script("localStorage.setItem('strata.key', arguments[0])", KEY)
    page.refresh()
    wait_for(page, lambda: page.execute_script("return document.body.dataset.ready"))
    select_models(page, ["tiny-2l-s0"])
    drawn(page, "drop")
    page.execute_script("""
        window.seen = [];
        const original = window.fetch;
        window.fetch = (url, options) => {
          window.seen.push([String(url), (options && options.headers || {})['X-API-Key']]);
          return original(url, options);
        };
        HTMLAnchorElement.prototype.click = () => {};  // no file lands on disk
        document.querySelector("section[data-panel='drop'] .links a[data-format=csv]")
          .dispatchEvent(new MouseEvent('click', {cancelable: true}));
    """)
    seen = wait_for(page, lambda: page.execute_script(
        "return window.seen.filter(s => s[0].includes('format=csv'))"), what="the download")
    assert seen[0][1] == KEY
    assert seen[0][0].startswith(service.base + "/api/v1/models/")
    page.execute_script("localStorage.removeItem('strata.key')")


def test_neuron_table_shows_tokens(page: Any, service: Service) -> None:
    from selenium.webdriver.support.select import Select

    def table() -> list[list[str]]:
        return list(page.execute_script(
            "return [...document.querySelectorAll(\"section[data-panel='neurons'] tbody tr\")]"
            ".map(r => [...r.children].map(c => c.textContent))"))

    def api(neuron_class: str) -> list[dict[str, Any]]:
        return list(service.client.get(
            "/api/v1/models/tiny-4l-s0/neurons",
            params={"class": neuron_class, "layer": 3, "top": 10}).json()["rows"])

    select_models(page, ["tiny-4l-s0"])
    first = drawn(page, "neurons")  # by default: prediction and suppression, the last layer
    both = api("prediction") + api("suppression")
    assert [(r[0], int(r[2])) for r in table()] == \
        [("prediction", r["neuron"]) for r in api("prediction")] + \
        [("suppression", r["neuron"]) for r in api("suppression")]
    Select(page.find_element(By_css(), "section[data-panel='neurons'] select.neuron-class")
           ).select_by_value("partition")
    drawn(page, "neurons", after=first["seq"])
    rows, partition = table(), api("partition")
    assert len(rows) == len(partition) > len(both)  # tiny models: every neuron is "partition"
    assert [int(r[2]) for r in rows] == [r["neuron"] for r in partition]
    assert rows[0][6], "promoted tokens"
    assert rows[0][7], "suppressed tokens"
    promoted = page.execute_script(
        "return [...document.querySelectorAll(\"section[data-panel='neurons'] tbody tr\")][0]"
        ".children[6].querySelectorAll('.tok').length")
    assert promoted == len(partition[0]["promoted"])
    page.execute_script("document.querySelector(\"section[data-panel='neurons']\")"
                        ".scrollIntoView()")
    screenshot(page, "neuron-table")


def test_neuron_table_follows_the_model_picker(page: Any, service: Service) -> None:
    """Picking another model shows its own last layer (not the previous model's layer)."""
    from selenium.webdriver.support.select import Select

    select_models(page, list(MODELS))
    first = drawn(page, "neurons")
    picker = "section[data-panel='neurons'] select.neuron-{}"
    assert Select(page.find_element(By_css(), picker.format("layer"))
                  ).first_selected_option.get_attribute("value") == "1"  # tiny-2l-s0 first
    model_id = service.client.get("/api/v1/models/tiny-4l-s0").json()["id"]
    Select(page.find_element(By_css(), picker.format("model"))).select_by_value(str(model_id))
    drawn(page, "neurons", after=first["seq"])
    layer = Select(page.find_element(By_css(), picker.format("layer")))
    assert layer.first_selected_option.get_attribute("value") == "3"
    neurons = page.execute_script(
        "return [...document.querySelectorAll(\"section[data-panel='neurons'] tbody tr\")]"
        ".map(r => [r.children[1].textContent, Number(r.children[2].textContent)])")
    api = service.client.get("/api/v1/models/tiny-4l-s0/neurons",
                             params={"class": "prediction", "layer": 3, "top": 10}).json()
    assert neurons[:len(api["rows"])] == [["3", r["neuron"]] for r in api["rows"]]


def test_stage_boundaries_with_evidence(page: Any, service: Service) -> None:
    select_models(page, list(MODELS))
    drawn(page, "stages")
    api = service.client.get("/api/v1/stages", params={"models": ",".join(MODELS)}).json()
    rows = page.execute_script(
        "return [...document.querySelectorAll(\"section[data-panel='stages'] tbody tr\")]"
        ".map(r => r.children[7].textContent)")
    assert len(rows) == sum(len(m["boundaries"]) for m in api["models"]) > 0
    assert all(("metric" in r) or ("reason" in r) for r in rows)
    found = [b for m in api["models"] for b in m["boundaries"] if b["found"]]
    hovers = page.execute_script(
        "return document.querySelector(\"section[data-panel='drop'] .plot\").data"
        ".filter(t => t.meta === 'boundary').map(t => t.text[0])")
    assert len(hovers) == len(found)
    for hover, boundary in zip(hovers, found, strict=True):  # the evidence, on hover
        assert boundary["rule"] in hover
        if boundary["boundary"] == 1:
            assert f"kl_at_layer: {boundary['evidence']['kl_at_layer']:.3g}" in hover
    # the stages of the model chosen in the header are shaded: one band per clear stage
    from selenium.webdriver.support.select import Select

    seq = int(page.execute_script(
        "return document.querySelector(\"section[data-panel='drop']\").dataset.seq"))
    Select(page.find_element(By_css(), "#stage-model")).select_by_visible_text("tiny-4l-s0")
    drawn(page, "drop", after=seq)
    shapes = page.execute_script(
        "return document.querySelector(\"section[data-panel='drop'] .plot\").layout.shapes"
        ".map(s => [s.name, s.x0, s.x1])")
    bands = [s[1:] for s in shapes if s[0] == "stage"]
    spans = [r for r in api["rows"] if r["model"] == "tiny-4l-s0" and r["clear"]
             and r["layer_start"] is not None]
    assert len(bands) == len(spans) > 0
    assert bands[0] == [spans[0]["layer_start"] - 0.5, spans[0]["layer_end"] + 0.5]
    # each clear boundary is shaded as a range: its bootstrap interval over sequences (the
    # runs were computed with per-sequence means), from the edge before its first block to
    # the edge before its last, widened by 0.15 of a block on each side
    ranges = sorted(s[1:] for s in shapes if str(s[0]).startswith("boundary-"))
    assert all(b["interval"] is not None for b in found)
    expected = sorted([b["interval"][0] - 0.65, b["interval"][1] - 0.35] for b in found)
    assert [x for r in ranges for x in r] == pytest.approx([x for r in expected for x in r])
    table = page.execute_script(
        "return [...document.querySelectorAll(\"section[data-panel='stages'] tbody tr\")]"
        ".map(r => [r.children[8].textContent, r.children[9].textContent])")
    every = [b for m in api["models"] for b in m["boundaries"]]
    assert sorted(t[0] for t in table) == sorted(
        f"{b['interval'][0]}–{b['interval'][1]}" if b["interval"] else "—" for b in every)


def test_head_stability_beside_its_null_baseline(page: Any, service: Service) -> None:
    traces = drawn(page, "stability")["traces"]
    names = [t["name"] for t in traces]
    assert names[:2] == ["trained refits", "null baseline (random init)"]
    api = service.client.get("/api/v1/families").json()
    assert page.execute_script(
        "return document.querySelector(\"section[data-panel='stability'] select.family\").value"
    ) == api[0]["name"]
    assert all(len(t["x"]) == 4 for t in traces)  # the fam4l family: 4 layers
    page.execute_script("document.querySelector(\"section[data-panel='stability']\")"
                        ".scrollIntoView()")
    screenshot(page, "stability")


def test_head_stability_against_ablation_importance(page: Any, service: Service) -> None:
    """Beside the stability panel: per layer, the correlation over heads of stability and
    ablation importance — the API's numbers, drawn."""
    traces = drawn(page, "stability-importance")["traces"]
    assert [t["name"] for t in traces] == ["Pearson r (95% interval)", "Spearman ρ"]
    api = service.client.get("/api/v1/families/fam4l-adamw/stability-importance").json()
    drawn_rows = [r for r in api["rows"] if r["pearson"] is not None]
    assert traces[0]["y"] == pytest.approx([r["pearson"] for r in drawn_rows])
    assert traces[1]["y"] == pytest.approx([r["spearman"] for r in drawn_rows])
    screenshot(page, "stability-importance")


# In the page, before its own scripts: the answer to GET /api/v1/families held back 2 s.
SLOW_FAMILIES = """
const realFetch = window.fetch.bind(window);
window.fetch = (target, init) => {
  const answer = realFetch(target, init);
  const path = new URL(String(target instanceof Request ? target.url : target),
                       location.href).pathname;
  if (path !== "/api/v1/families") return answer;
  return answer.then((r) => new Promise((ok) => setTimeout(() => ok(r), 2000)));
};
"""


def test_the_stability_panels_wait_for_the_family_list(browser: Any, service: Service) -> None:
    """With the family list slow to arrive, the stability panels finish their first draw with
    the stored family drawn: they never say "no refit families stored" while the list is still
    on its way (the page once drew them empty first, and redrew them when the list came)."""
    added = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                    {"source": SLOW_FAMILIES})
    try:
        browser.get("about:blank")
        browser.get(service.base + "/")
        wait_for(browser, lambda: browser.execute_script("return document.body.dataset.ready"))
        for panel in ("stability", "stability-importance"):
            assert drawn(browser, panel)["traces"], panel  # drawn, not "empty", at its first draw
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                                {"identifier": added["identifier"]})
    assert not console_errors(browser)


def test_a_write_without_a_key_shows_the_api_error(browser: Any, service: Service) -> None:
    from selenium.webdriver.common.by import By

    browser.get(service.base + "/")
    wait_for(browser, lambda: browser.execute_script("return document.body.dataset.ready"))
    browser.execute_script("localStorage.removeItem('strata.key')")
    browser.find_element(By.ID, "register-name").send_keys("nokey")
    browser.find_element(By.ID, "register-source").send_keys("zoo:tiny-2l-s0")
    browser.find_element(By.ID, "register-submit").click()
    out = wait_for(browser, lambda: browser.execute_script(
        "const o = document.getElementById('register-result');"
        "return o.dataset.state === 'error' && o.textContent"), what="register error")
    assert out.startswith("unauthorized")
    errors = console_errors(browser)  # the 401 itself is reported by the browser
    assert all("401" in e["message"] for e in errors), errors


def jobs_available(service: Service) -> bool:
    return "/api/v1/jobs" in service.client.get("/schema/openapi.json").json()["paths"]


def test_register_and_compute_from_the_page(page: Any, service: Service) -> None:
    """Register a model, submit a job for it (API key entered once), watch its progress, and see
    its results drawn without reloading. Needs the jobs API and the local worker that
    `strata serve` starts without STRATA_BROKER_URL."""
    from selenium.webdriver.common.by import By

    if not jobs_available(service):
        pytest.skip("this service has no jobs endpoint yet")
    page.find_element(By.ID, "api-key").send_keys(KEY)
    page.find_element(By.ID, "save-key").click()
    page.find_element(By.ID, "register-name").send_keys("fresh-4l")
    page.find_element(By.ID, "register-source").send_keys("zoo:tiny-4l-s1")
    page.find_element(By.ID, "register-submit").click()
    wait_for(page, lambda: page.execute_script(
        "return document.getElementById('register-result').dataset.state === 'ok'"),
        what="registration")
    select_models(page, ["tiny-2l-s0"])
    before = drawn(page, "drop")
    page.find_element(By.ID, "job-model").send_keys("fresh-4l")
    nseq, seqlen = page.find_element(By.ID, "job-nseq"), page.find_element(By.ID, "job-seqlen")
    # Long enough (every family on 64 x 64 tokens) for the page's polls to see it run: 8 x 32
    # finished between two polls on a fast machine, and no progress was ever drawn.
    nseq.clear()
    nseq.send_keys("64")
    seqlen.clear()
    seqlen.send_keys("64")
    page.find_element(By.ID, "job-submit").click()
    job = wait_for(page, lambda: page.execute_script(
        "const j = document.querySelector('#jobs li.job[data-own]'); return j && j.dataset.jobId"),
        what="the job in the list")
    seen: set[str] = set()
    shown: list[float] = []  # the progress bar while the job runs

    def finished() -> bool:
        state, fraction, text = page.execute_script(
            f"const j = document.getElementById('job-{job}');"
            "return [j.dataset.state, j.querySelector('progress').value, j.textContent];")
        seen.add(state)
        if state == "running" and "%" in text:
            shown.append(fraction)
        return state in ("succeeded", "failed", "cancelled")

    wait_for(page, finished, timeout=300, what="the job to finish")
    assert page.execute_script(f"return document.getElementById('job-{job}').dataset.state") \
        == "succeeded", page.execute_script(
        f"return document.getElementById('job-{job}').textContent")
    assert "running" in seen, seen
    assert shown, "no live progress was shown while the job ran"
    assert all(0 <= f <= 1 for f in shown)
    assert shown == sorted(shown)
    screenshot(page, "job-finished")
    # its results appear: the model joined the selection and the plots redrew with it
    traces = wait_for(page, lambda: (lambda t: t if len(t) == 2 else None)(
        drawn(page, "drop", after=before["seq"])["traces"]), what="the new model's curve")
    assert [t["name"] for t in traces] == ["tiny-2l-s0", "fresh-4l"]
    assert len(traces[1]["x"]) == 4
    screenshot(page, "job-results")


def test_cancel_a_job_from_the_page(page: Any, service: Service) -> None:
    from selenium.webdriver.common.by import By

    if not jobs_available(service):
        pytest.skip("this service has no jobs endpoint yet")
    page.execute_script("localStorage.setItem('strata.key', arguments[0])", KEY)
    page.refresh()
    wait_for(page, lambda: page.execute_script("return document.body.dataset.ready"))
    page.find_element(By.ID, "job-model").send_keys("tiny-2l-s0")
    nseq = page.find_element(By.ID, "job-nseq")
    nseq.clear()
    nseq.send_keys("256")
    page.find_element(By.ID, "job-force").click()
    page.find_element(By.ID, "job-submit").click()
    job = wait_for(page, lambda: page.execute_script(
        "const j = document.querySelector('#jobs li.job[data-own]');"
        "return j && j.querySelector('button.cancel') && j.dataset.jobId"), what="the job")
    click(page, f"#job-{job} button.cancel", "the job's cancel button")
    wait_for(page, lambda: page.execute_script(
        f"return document.getElementById('job-{job}').dataset.state === 'cancelled'"),
        what="the job cancelled")
    assert service.client.get(f"/api/v1/jobs/{job}").json()["state"] == "cancelled"
    assert not page.find_elements(By.CSS_SELECTOR, f"#job-{job} button.cancel")


def test_the_page_waits_out_the_rate_limit_and_says_so(browser: Any, tmp_path: Path) -> None:
    """A service with a tight read limit (15/second): 120 reads through the page's own client
    all succeed, the ones refused with 429 sent again after their Retry-After, while the
    status line says the page is waiting; nothing else goes wrong. (At 40/second a loaded
    2-core machine served the 120 reads at 30 a second, under the limit, and none was refused:
    the limit is below what a busy machine serves, so the refusals this tests happen.)"""
    from tests.integration.web_harness import service_env
    from tests.serving import start_service

    env = {**service_env(tmp_path / "strata.duckdb"), "STRATA_API__READ_RATE_LIMIT": "15/second"}
    served = start_service(env, log=tmp_path / "serve.log", args=["--no-local-worker"],
                           inherit=False, forked=True)
    try:
        browser.get("about:blank")
        browser.get_log("browser")
        browser.get(served.base + "/")
        wait_for(browser, lambda: browser.execute_script("return document.body.dataset.ready"))
        time.sleep(1.1)  # a fresh window for the reads below
        outcome = browser.execute_async_script("""
            const done = arguments[arguments.length - 1];
            (async () => {
              const api = await import("/static/web/api.js");
              const status = document.getElementById("status");
              const seen = new Set();
              new MutationObserver(() => seen.add(status.textContent)).observe(
                status, { childList: true, characterData: true, subtree: true });
              const start = performance.now();
              const answers = await Promise.all([...Array(120).keys()].map(
                (i) => api.get(api.url("/models", { limit: i + 1 }))));
              return { answered: answers.filter((a) => a.total === 0).length,
                       ms: performance.now() - start, seen: [...seen],
                       limited: window.strata.rateLimited || 0,
                       status: status.dataset.message };
            })().then(done, (e) => done({ error: String(e) }));""")
        assert "error" not in outcome, outcome
        assert outcome["answered"] == 120
        assert outcome["limited"] > 0, outcome  # some were refused and waited out
        assert outcome["ms"] >= 1000, outcome  # at least one Retry-After (1 s) was waited
        assert any("rate limited by the service (HTTP 429): waiting 1 s" in s
                   for s in outcome["seen"]), outcome["seen"]
        # The message goes once every request got through: the burst's, and the page's own (its
        # 10-s check for new runs can be refused in the burst and still be waiting out its
        # Retry-After when the 120 are answered; seen on a slow 2-core EPYC).
        wait_for(browser, lambda: browser.execute_script(
            "return document.getElementById('status').dataset.message") == "", timeout=15,
            what="the rate-limit message to go once every request got through")
        others = [e for e in console_errors(browser) if " 429 " not in e["message"]]
        assert not others, others
    finally:
        served.stop()
