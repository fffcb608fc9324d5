"""The dashboard's layout and its less travelled states, in the real browser at 1400 px wide
(issue 50, item 5): long model names, Plotly's mode-bar beside titles and legends, the stability
error bars and their caption on `/` and `/family`, panels without data, and the run menu that
chooses which stored run of a model is drawn.

Headless Chromium through Selenium, as in test_dashboard.py, on two real `strata serve`s: one of
this module's own, seeded over HTTP (POST /api/v1/runs/ingest, as a worker delivers) with one
computed zoo run stored under long, real-looking model names — "SmolLM2-135M-Instruct.Q4_1"
twice (two runs of one model, the second with its values scaled), "gpt2" and
"Qwen2.5-Coder-0.5B-Instruct" (as `transformer_lens` sources) — and the session's (`web`: the
refit family and its stability). None of these runs computed the opt-in families (heads_atp,
tuned_lens). The browser's console stays free of errors.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from compute.run import RunResult
from tests.integration.synthetic import variant
from tests.integration.test_dashboard import (
    SCREENSHOT,
    By_css,
    console_errors,
    drawn,
    require_browser,
    screenshot,
    select_models,
    wait_for,
)
from tests.integration.web_harness import FAMILY, Service, service_env, zoo_result
from tests.serving import start_service

WIDTH = 1400  # the width the issue measured at
LONG = "SmolLM2-135M-Instruct.Q4_1"
GPT2 = "gpt2"
QWEN = "Qwen2.5-Coder-0.5B-Instruct"
V1 = "/api/v1"


@pytest.fixture(autouse=True, scope="module")
def _browser() -> None:
    """First of the module's fixtures: before a service or a browser is started."""
    require_browser()


def renamed(result: RunResult, name: str, source: str) -> RunResult:
    """The same run under another model name and source."""
    config = result.config
    model = config.model.model_copy(update={"name": name, "source": source})
    config = config.model_copy(update={"model": model})
    return dataclasses.replace(result, config=config, config_hash=config.config_hash())


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("layout-web")
    np.save(tmp / "tokens.npy", np.random.default_rng(0).integers(1, 4000, (4, 24)))
    result = zoo_result("tiny-4l-s0", tmp / "tokens.npy")
    # what it serves is delivered over HTTP: no job runs, so no local worker and beat
    served = start_service(
        service_env(tmp / "strata.duckdb"), log=tmp / "serve.log", inherit=False, forked=True,
        args=["--no-local-worker"],
    )
    web = Service(served.base, served.proc, served.log, tmp, {LONG: result})
    try:
        # two runs of LONG: the second (another induction seed, every value x3) is the newer
        for run in (
            variant(result, name=LONG),
            variant(result, name=LONG, seed=7, scale=3.0),
            renamed(result, GPT2, "transformer_lens"),
            renamed(result, QWEN, "transformer_lens"),
        ):
            web.ingest(run)
        yield web
    finally:
        web.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = SCREENSHOT.browser(WIDTH, 1000)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def open_page(driver: Any, address: str) -> Any:
    driver.get("about:blank")
    driver.get_log("browser")  # drop what earlier tests left
    driver.get(address)
    wait_for(
        driver, lambda: driver.execute_script("return document.body.dataset.ready"), what=address
    )
    assert driver.execute_script("return window.innerWidth") == WIDTH
    return driver


@pytest.fixture
def page(browser: Any, service: Service) -> Iterator[Any]:
    """The browser on a freshly loaded dashboard of this module's service."""
    yield open_page(browser, service.base + "/")
    errors = console_errors(browser)
    assert not errors, errors


def settled(driver: Any, panel: str, after: int = 0) -> dict[str, Any]:
    """Scroll a panel into view and wait until a draw after `after` ended; its state, draw
    number, note, and whether any axis is drawn in it (and how wide its plot is)."""
    driver.execute_script(
        "document.querySelector(`section[data-panel='${arguments[0]}']`).scrollIntoView()", panel
    )

    def state() -> Any:
        got = driver.execute_script(
            """
            const s = document.querySelector(`section[data-panel='${arguments[0]}']`);
            const plot = s.querySelector('.plot');
            const box = plot ? plot.getBoundingClientRect() : null;
            return {state: s.dataset.state, seq: Number(s.dataset.seq),
                    note: s.querySelector('.note').textContent,
                    axes: [...s.querySelectorAll('.xtick, .ytick')]
                      .filter(t => t.getBoundingClientRect().width > 0).length,
                    plot: box ? [box.width, box.height] : null};""",
            panel,
        )
        return got if got["state"] in ("drawn", "empty", "error") and got["seq"] > after else None

    return dict(wait_for(driver, state, what=f"panel {panel}"))


# --------------------------------------------------------------------- 1. long model names

# Per text node outside the form controls: how many lines it is laid out on.
TEXT_LINES = """
const lines = (root) => {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const out = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.textContent.trim() || n.parentElement.closest('select, button, option')) continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    const tops = new Set([...range.getClientRects()].filter(r => r.width > 0)
      .map(r => Math.round(r.top)));
    out.push([n.textContent.trim(), tops.size]);
  }
  return out;
};
"""


def test_long_model_names_stay_on_one_line_and_nothing_scrolls_sideways(
    page: Any, service: Service
) -> None:
    select_models(page, [LONG, GPT2, QWEN])
    drawn(page, "drop")
    names = page.execute_script(
        TEXT_LINES
        + """
        return [...document.querySelectorAll('#model-list li .name')].flatMap(lines);"""
    )
    assert {n for n, _ in names} >= {LONG, GPT2, QWEN}, names
    assert all(count == 1 for _, count in names), f"model names over several lines: {names}"
    chips = page.execute_script(
        TEXT_LINES
        + """
        return [...document.querySelectorAll('#selected-chips .chip')].flatMap(lines);"""
    )
    assert [n for n, _ in chips] == [LONG, GPT2, QWEN], chips
    assert all(count == 1 for _, count in chips), f"chip names over several lines: {chips}"
    # every panel drawn, then: neither the page nor anything in the sidebar scrolls sideways
    for panel in page.execute_script(
        "return [...document.querySelectorAll('section.panel')].map(s => s.dataset.panel)"
    ):
        settled(page, panel)
    page.execute_script("window.scrollTo(0, 0)")
    widths = page.execute_script(
        "return [document.scrollingElement.scrollWidth, window.innerWidth]"
    )
    assert widths[0] <= widths[1], f"the page scrolls sideways: {widths}"
    wide = page.execute_script("""
        return [...document.querySelectorAll('#sidebar, #sidebar *')]
          .filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX)
                       && e.scrollWidth > e.clientWidth + 1)
          .map(e => [e.id || e.className, e.scrollWidth, e.clientWidth]);""")
    assert not wide, f"scrolls sideways in the sidebar: {wide}"
    screenshot(page, "layout-long-names")


# ----------------------------------------------------------- 2. the mode-bar covers no text

# Per plot on the page: the texts (titles, legend entries, heat-map titles, axis titles) that
# the mode-bar's box meets, and the legend entries that meet the x axis title.
OVERLAPS = """
const box = (e) => e.getBoundingClientRect();
const meet = (a, b) => a.width > 0 && b.width > 0 && a.left < b.right && b.left < a.right
  && a.top < b.bottom && b.top < a.bottom;
const out = [];
for (const plot of document.querySelectorAll('.js-plotly-plot')) {
  const where = plot.closest('section').dataset.panel;
  const texts = [...plot.querySelectorAll(
    '.gtitle, .legendtext, .annotation-text, .cbtitle text, .g-xtitle, .g-ytitle')];
  for (const bar of plot.querySelectorAll('.modebar')) {
    for (const t of texts) {
      if (meet(box(bar), box(t))) out.push([where, 'modebar', t.textContent]);
    }
  }
  for (const title of plot.querySelectorAll('.g-xtitle')) {
    for (const t of plot.querySelectorAll('.legendtext')) {
      if (meet(box(title), box(t))) out.push([where, title.textContent, t.textContent]);
    }
  }
}
return [document.querySelectorAll('.js-plotly-plot .modebar').length, out];
"""


def plotted_panels(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('section.panel')]"
            ".filter(s => s.querySelector('.plot')).map(s => s.dataset.panel)"
        )
    )


def test_the_mode_bar_covers_no_title_or_legend(
    page: Any, browser: Any, service: Service, web: Service
) -> None:
    select_models(page, [LONG, GPT2, QWEN])
    seen: set[tuple[str, ...]] = set()  # (panel, what covers, what is covered)
    plots = 0
    for panel in plotted_panels(page):
        plots += settled(page, panel)["state"] == "drawn"
        main_bars, overlaps = page.execute_script(OVERLAPS)
        seen |= {tuple(o) for o in overlaps}
    page.execute_script(
        "document.querySelector(\"section[data-panel='heads-ablation']\").scrollIntoView()"
    )
    screenshot(page, "layout-modebar-heatmaps")
    # the refit family's stability panels (the session's service) and the family page
    open_page(browser, web.base + "/")
    for panel in ("stability", "stability-importance"):
        settled(browser, panel)
        seen |= {tuple(o) for o in browser.execute_script(OVERLAPS)[1]}
    open_page(browser, f"{web.base}/family?name={FAMILY}")
    for panel in ("family-layers", "family-heads", "family-importance"):
        wait_for(
            browser,
            lambda p=panel: browser.execute_script(
                f"return document.querySelector(\"section[data-panel='{p}']\").dataset.drawn > 0"
            ),
            what=f"panel {panel}",
        )
    bars, overlaps = browser.execute_script(OVERLAPS)
    assert bars == 3
    seen |= {tuple(o) for o in overlaps}
    screenshot(browser, "layout-modebar-family")
    assert not seen, f"the mode-bar or the axis title covers: {sorted(seen)}"
    assert plots > 15, plots
    assert main_bars == plots  # every drawn plot has its mode-bar, and only those
    assert not console_errors(browser), console_errors(browser)


# ------------------------------------------ 3. the stability error bars, captioned as they are


def caption(note: str) -> str:
    """The note's clause that says what the error bars are."""
    found = re.search(r"error bars: ([^;]+)", note)
    assert found, f"no caption of the error bars in: {note!r}"
    return found.group(1).strip()


def bars_of(driver: Any, selector: str) -> dict[str, Any]:
    return dict(
        driver.execute_script(f"""
        return Object.fromEntries(document.querySelector("{selector} .plot").data
          .filter(t => t.error_y).map(t => [t.name, {{y: t.y, bars: t.error_y.array,
            visible: t.error_y.visible !== false}}]));""")
    )


def test_both_pages_draw_and_caption_the_same_stability_error_bars(
    browser: Any, web: Service
) -> None:
    """What the bars are is the API's: per layer, `heads.stability` is the mean over the
    layer's heads and has no stderr; its spread is `heads.stability_std`, the std over those
    heads (docs/metrics.md) — drawn and captioned alike on both pages."""
    rows = web.client.get(f"{V1}/families/{FAMILY}/stability").json()["rows"]

    def per_layer(metric: str, column: str = "value") -> list[Any]:
        return [
            r[column]
            for r in sorted(rows, key=lambda r: r["layer"])
            if r["metric"] == metric and r["head"] is None
        ]

    assert all(s is None for s in per_layer("heads.stability", "stderr"))
    spread = {
        "trained refits": per_layer("heads.stability_std"),
        "null baseline (random init)": per_layer("heads.stability_null_std"),
    }
    assert all(len(v) == 4 and max(v) > 0 for v in spread.values())
    captions = []
    open_page(browser, web.base + "/")
    main = settled(browser, "stability")
    drew = bars_of(browser, "section[data-panel='stability']")
    for name, values in spread.items():
        assert drew[name]["visible"], name
        assert drew[name]["bars"] == pytest.approx(values), name
    for name, metric in (
        ("residual CKA (linear)", "heads.residual_cka.linear"),
        ("residual CKA (RBF)", "heads.residual_cka.rbf"),
    ):
        stderr = per_layer(metric, "stderr")  # over refits: null with one refit
        assert drew[name]["visible"] == any(s is not None for s in stderr), (name, stderr)
    captions.append(caption(main["note"]))
    open_page(browser, f"{web.base}/family?name={FAMILY}")
    wait_for(
        browser,
        lambda: browser.execute_script(
            "return document.querySelector(\"section[data-panel='family-layers']\").dataset.drawn"
            " > 0"
        ),
        what="the family's stability per layer",
    )
    drew = bars_of(browser, "section[data-panel='family-layers']")
    for name, values in spread.items():
        assert drew[name]["visible"], name
        assert drew[name]["bars"] == pytest.approx(values), name
    captions.append(
        caption(
            browser.execute_script(
                "return document.querySelector(\"section[data-panel='family-layers'] .note\")"
                ".textContent"
            )
        )
    )
    assert captions[0] == captions[1], captions
    assert "std over" in captions[0], captions
    assert "heads" in captions[0], captions
    assert "stderr" not in captions[0].replace("not a standard error", ""), captions
    screenshot(browser, "layout-family-bars")
    assert not console_errors(browser), console_errors(browser)


# --------------------------------------------------------- 4. panels without data say so


def test_panels_without_data_say_so_instead_of_drawing_empty_axes(
    page: Any, service: Service
) -> None:
    from selenium.webdriver.support.select import Select

    select_models(page, [GPT2])
    assert drawn(page, "drop")["traces"]
    for panel, family in (("heads-screen", "heads_atp"), ("tuned-lens", "tuned_lens")):
        got = settled(page, panel)
        assert got["axes"] == 0, f"{panel} draws empty axes: {got}"
        assert got["state"] == "empty", (panel, got)
        assert f"no {family} results for this model" in got["note"], (panel, got)
        assert not got["plot"] or got["plot"][1] == 0, (panel, got)
    screenshot(page, "layout-empty-panel")
    # the same panel draws again, full width, for a metric the model has
    before = settled(page, "heads-screen")
    Select(
        page.find_element(By_css(), "section[data-panel='heads-screen'] select.metric")
    ).select_by_value("heads.ablation_loss_delta")
    got = settled(page, "heads-screen", after=before["seq"])
    assert got["state"] == "drawn", got
    assert got["axes"] > 0
    assert got["plot"][0] > 600, got  # the whole panel's width, not a hidden div's default
    cells = page.execute_script(
        "return document.querySelector(\"section[data-panel='heads-screen'] .plot\").data[0].z"
        ".flat().filter(v => v !== null).length"
    )
    heads = service.client.get(
        f"{V1}/models/{GPT2}/heads", params={"metric": "heads.ablation_loss_delta"}
    ).json()["rows"]
    assert cells == len(heads) > 0


# ------------------------------------------------------------------------- 5. the run menu


def test_the_run_menu_names_the_canonical_run_and_draws_the_one_chosen(
    page: Any, service: Service
) -> None:
    from selenium.webdriver.support.select import Select

    model = service.client.get(f"{V1}/models/{LONG}").json()
    canonical = model["current_runs"]["intervention"]
    basis = model["current_run_basis"]["intervention"]
    runs = service.client.get(
        f"{V1}/runs", params={"model_id": model["id"], "status": "succeeded"}
    ).json()["items"]
    assert len(runs) == 2
    other = next(r["id"] for r in runs if r["id"] != canonical)

    def api(run_id: int | None) -> tuple[list[float], str]:
        answer = service.client.get(
            f"{V1}/models/{LONG}/metrics",
            params={
                "metric": "intervention.kl",
                "component": "drop",
                **({"run_id": run_id} if run_id else {}),
            },
        )
        assert answer.status_code == 200, answer.text
        return [r["value"] for r in answer.json()["rows"]], answer.headers["X-Strata-Run"]

    canonical_values, header = api(None)
    assert header.split(";")[0] == str(canonical)
    other_values, header = api(other)
    assert header.split(";")[0] == str(other)
    assert other_values != pytest.approx(canonical_values)

    select_models(page, [LONG])
    first = drawn(page, "drop")
    assert first["traces"][0]["y"] == pytest.approx(canonical_values)
    menu = f"#selected-chips .chip[data-model-id='{model['id']}'] select.run-choice"
    wait_for(
        page,
        lambda: (
            len(page.execute_script(f'return [...document.querySelectorAll("{menu} option")]')) == 3
        ),
        what="the model's runs in the menu",
    )
    options = page.execute_script(
        f'return [...document.querySelectorAll("{menu} option")].map(o => [o.value, o.text])'
    )
    assert options[0] == ["", f"canonical: run {canonical} ({basis})"], options
    assert sorted(v for v, _ in options[1:]) == sorted([str(canonical), str(other)])
    assert page.execute_script(f'return document.querySelector("{menu}").value') == ""

    def requested(run_id: int) -> list[str]:
        return list(
            page.execute_script(
                "return performance.getEntriesByType('resource').map(r => r.name)"
                ".filter(n => n.includes('/metrics?') && n.includes(`run_id=${arguments[0]}`)"
                " && n.includes('metric=intervention.kl') && n.includes('component=drop'))",
                run_id,
            )
        )

    assert requested(canonical)
    Select(page.find_element(By_css(), menu)).select_by_value(str(other))
    chosen = drawn(page, "drop", after=first["seq"])
    assert chosen["traces"][0]["y"] == pytest.approx(other_values)
    assert requested(other), "the chosen run was not read from the API"
    links = page.execute_script(
        "return [...document.querySelectorAll(\"section[data-panel='drop'] .links a\")]"
        ".map(a => a.getAttribute('href'))"
    )
    assert links
    assert all(f"run_id={other}" in link for link in links), links
    chip = f"#selected-chips .chip[data-model-id='{model['id']}']"
    assert page.execute_script(f'return document.querySelector("{chip}").dataset.run') == str(other)
    # the per-head panels follow the choice too
    heads = drawn(page, "heads-ablation")
    z = page.execute_script(
        "return document.querySelector(\"section[data-panel='heads-ablation'] .plot\")"
        ".data[0].z.flat().filter(v => v !== null)"
    )
    served = service.client.get(
        f"{V1}/models/{LONG}/heads", params={"metric": "heads.ablation_kl", "run_id": other}
    ).json()["rows"]
    assert sorted(z) == pytest.approx(sorted(r["value"] for r in served))
    assert heads["traces"][0]["cells"] == len(served)
    # and back to the canonical run
    page.execute_script("document.querySelector('#sidebar').scrollIntoView()")
    Select(page.find_element(By_css(), menu)).select_by_value("")
    again = drawn(page, "drop", after=chosen["seq"])
    assert again["traces"][0]["y"] == pytest.approx(canonical_values)
    screenshot(page, "layout-run-menu")
