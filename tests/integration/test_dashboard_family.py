"""The refit family page (/family), in the real browser, as test_dashboard.py tests the
dashboard: headless Chromium through Selenium on the session's real `strata serve` (with its
local worker; tests/integration/web_harness.py). The stored family's stability is drawn per
layer against the null, per head and against the anchor's ablation importance; a family made
over the API is computed from the page, whose job line shows the worker's progress and then
the new plots, without a reload. The browser's console stays free of errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_dashboard import (
    chrome,
    console_errors,
    require_browser,
    screenshot,
    wait_for,
)
from tests.integration.web_harness import FAMILY, KEY, Service


@pytest.fixture(autouse=True, scope="module")
def _browser() -> None:
    """First of the module's fixtures: before a service or a browser is started."""
    require_browser()


V1 = "/api/v1"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chrome()
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def open_page(browser: Any, web: Service, name: str) -> Any:
    browser.get(web.base + "/")
    browser.execute_script(f"localStorage.setItem('strata.key', '{KEY}')")
    browser.get_log("browser")
    browser.get(f"{web.base}/family?name={name}")
    wait_for(browser, lambda: browser.execute_script("return document.body.dataset.ready"),
             what="the family page")
    return browser


def drawn(browser: Any, panel: str) -> list[dict[str, Any]]:
    """The traces plotly drew in a panel (waited for)."""
    wait_for(browser, lambda: browser.execute_script(
        f"return document.querySelector(\"section[data-panel='{panel}']\").dataset.drawn"
        " > 0"), what=f"panel {panel}")
    return list(browser.execute_script(
        f"return document.querySelector(\"section[data-panel='{panel}'] .plot\").data"
        ".map(t => ({name: t.name, x: t.x, y: t.y, z: t.z, type: t.type}))"))


def test_the_family_page_draws_stability_per_layer_per_head_and_against_importance(
        browser: Any, web: Service) -> None:
    page = open_page(browser, web, FAMILY)
    api = web.client.get(f"{V1}/families/{FAMILY}").json()
    members = page.execute_script(
        "return [...document.querySelectorAll('#family-members tbody tr')]"
        ".map(r => [r.children[0].textContent, r.children[2].textContent])")
    assert members == [[m["model"]["name"], m["state"]] for m in api["member_states"]]
    layers = drawn(page, "family-layers")
    assert [t["name"] for t in layers] == ["trained refits", "null baseline (random init)"]
    served = web.client.get(f"{V1}/families/{FAMILY}/stability",
                            params={"metric": "heads.stability"}).json()["rows"]
    assert layers[0]["y"] == pytest.approx([r["value"] for r in served])
    heads = drawn(page, "family-heads")
    assert heads[0]["type"] == "heatmap"
    per_head = web.client.get(f"{V1}/families/{FAMILY}/stability", params={
        "metric": "heads.stability", "per_head": True}).json()["rows"]
    cells = {(r["layer"], r["head"]): r["value"] for r in per_head if r["head"] is not None}
    assert heads[0]["z"][1][2] == pytest.approx(cells[(1, 2)])
    importance = drawn(page, "family-importance")
    joined = web.client.get(f"{V1}/families/{FAMILY}/stability-importance").json()["rows"]
    assert importance[0]["y"] == pytest.approx(
        [r["pearson"] for r in joined if r["pearson"] is not None])
    screenshot(page, "family")
    assert not console_errors(page), console_errors(page)


def test_a_family_computed_from_the_page_shows_its_progress_then_its_plots(
        browser: Any, web: Service) -> None:
    from selenium.webdriver.common.by import By

    made = web.client.post(f"{V1}/families", headers={"X-API-Key": KEY}, json={
        "name": "fam4l-adamw-page", "members": ["fam4l-adamw-s1", "fam4l-adamw-s0"],
        "n_prompts": 48, "prompt_len": 64, "n_null": 10})
    assert made.status_code == 201, made.text
    page = open_page(browser, web, "fam4l-adamw-page")
    assert page.find_element(By.ID, "job-line").get_attribute("data-state") == "none"
    assert "no stability computed yet" in page.find_element(
        By.CSS_SELECTOR, "section[data-panel='family-layers'] .note").text
    page.find_element(By.ID, "compute-stability").click()
    wait_for(page, lambda: page.execute_script("return window.strata.familyProgressSeen > 0"),
             timeout=180, what="the job's progress on the page")
    assert "%" in page.find_element(By.ID, "job-line").text
    screenshot(page, "family-progress")
    wait_for(page, lambda: page.find_element(By.ID, "job-line").get_attribute("data-state")
             == "succeeded", timeout=300, what="the job to succeed")
    layers = drawn(page, "family-layers")
    assert len(layers[0]["x"]) == 4
    family = web.client.get(f"{V1}/families/fam4l-adamw-page").json()
    assert {m["state"] for m in family["member_states"]} == {"current"}
    rows = page.execute_script(
        "return [...document.querySelectorAll('#family-members tbody tr')]"
        ".map(r => r.children[2].textContent)")
    assert rows == ["current", "current"]
    assert "has no heads run yet" in page.find_element(  # its anchor: s1, which has none
        By.CSS_SELECTOR, "section[data-panel='family-importance'] .note").text
    screenshot(page, "family-computed")
    assert not console_errors(page), console_errors(page)
