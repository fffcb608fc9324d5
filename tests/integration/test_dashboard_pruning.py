"""The dashboard's pruning-plan panel, in the real browser (as test_dashboard.py tests the other
panels): headless Chromium through Selenium on a `strata serve` of its own, seeded over HTTP
(POST /api/v1/runs/ingest, as a worker delivers) with `zoo:planted-pruning` computed with
`pruning,pruning_drops`, and a model whose run lacks them. The panel's table is the API's plan;
a model without the families gets an empty state that says how to compute them. The browser's
console stays free of errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.support.ui import Select

from compute.models import resolve_model_spec
from compute.run import RunConfig, compute_run
from compute.tokens import TokenSpec
from tests.integration.test_dashboard import (
    By_css,
    chrome,
    console_errors,
    drawn,
    require_browser,
    screenshot,
    select_models,
    wait_for,
)
from tests.integration.test_pruning_plan import _renamed
from tests.integration.web_harness import Service, service_env
from tests.serving import start_service

MODEL = "planted-pruning"
BARE = "planted-no-pruning"
SINGLE = "planted-single-drops"  # intervention and pruning, no pruning_drops


@pytest.fixture(autouse=True, scope="module")
def _browser() -> None:
    """First of the module's fixtures: before a service or a browser is started."""
    require_browser()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("pruning-web")
    env = service_env(tmp / "strata.duckdb")
    result = compute_run(
        RunConfig(
            model=resolve_model_spec(f"zoo:{MODEL}"),
            tokens=TokenSpec(source="builtin", n_sequences=4, seq_len=16),
            families=("pruning", "pruning_drops"),
        )
    )
    families = ("intervention", "pruning")
    single = compute_run(result.config.model_copy(update={"families": families}))
    # what it serves is delivered over HTTP: no job runs, so no local worker and beat
    served = start_service(env, log=tmp / "serve.log", inherit=False, forked=True,
                           args=["--no-local-worker"])
    web = Service(served.base, served.proc, served.log, tmp, {MODEL: result})
    try:
        for run in (
            result,
            _renamed(result, BARE, ("pruning",), "pruning."),  # the predictors, no drops
            _renamed(single, SINGLE, families, None),
        ):
            web.ingest(run)
        yield web
    finally:
        web.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chrome()
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: Any, service: Service) -> Iterator[Any]:
    browser.get("about:blank")
    browser.get_log("browser")
    browser.get(service.base + "/")
    wait_for(browser, lambda: browser.execute_script("return document.body.dataset.ready"))
    yield browser
    errors = console_errors(browser)
    assert not errors, errors


def _table(page: Any, css: str) -> list[list[str]]:
    return list(
        page.execute_script(
            "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
            ".map(r => [...r.children].map(c => c.textContent))",
            f"section[data-panel='pruning'] table.{css}",
        )
    )


def test_the_panel_shows_the_plan_for_each_budget(page: Any, service: Service) -> None:
    select_models(page, [MODEL])
    first = drawn(page, "pruning")
    plan = service.client.get(f"/api/v1/models/{MODEL}/pruning-plan", params={"n": 1}).json()
    rows = _table(page, "pruning-choices")
    assert len(rows) == len(plan["rows"]) == 4
    for shown, row in zip(rows, plan["rows"], strict=True):
        assert shown[1] == ", ".join(map(str, row["blocks"]))
    assert rows[0][1] == "5"  # the identity block: the measured best (ties to the lower one)
    scores = _table(page, "pruning-scores")
    assert any(r[0] == "Block Influence" and r[1] == "1" for r in scores)

    budget = Select(page.find_element(By_css(), "section[data-panel='pruning'] select.pruning-n"))
    assert [o.get_attribute("value") for o in budget.options] == ["1", "2", "3", "4"]
    budget.select_by_value("2")
    drawn(page, "pruning", after=first["seq"])
    two = service.client.get(f"/api/v1/models/{MODEL}/pruning-plan", params={"n": 2}).json()
    rows = _table(page, "pruning-choices")
    by_choice = {r["choice"]: r for r in two["rows"]}
    assert rows[1][1] == "5, 6" == ", ".join(map(str, by_choice["block_influence"]["blocks"]))
    assert [r[1] for r in rows] == [", ".join(map(str, r["blocks"])) for r in two["rows"]]
    page.execute_script(
        "document.querySelector(\"section[data-panel='pruning']\").scrollIntoView()"
    )
    screenshot(page, "pruning-plan")


def test_a_model_without_the_families_says_how_to_compute_them(page: Any) -> None:
    select_models(page, [BARE])
    page.execute_script(
        "document.querySelector(\"section[data-panel='pruning']\").scrollIntoView()"
    )

    def settled() -> Any:
        got = page.execute_script(
            "const s = document.querySelector(\"section[data-panel='pruning']\");"
            "return [s.dataset.state, Number(s.dataset.seq)];"
        )
        return got if got[0] in ("empty", "drawn", "error") and got[1] > 0 else None

    status, _ = wait_for(page, settled, what="the pruning panel")
    assert status == "empty"
    text = page.execute_script(
        "return document.querySelector(\"section[data-panel='pruning'] .empty-state\").textContent"
    )
    assert "--metrics pruning,pruning_drops" in text
    assert BARE in text


def test_a_model_with_single_drops_only_shows_the_plan_for_one_block(
        page: Any, service: Service) -> None:
    """No run with pruning_drops, a default-like run with intervention: the panel draws the
    plan for n = 1 from the single-block drops, offers no wider budget, and says where the
    costs come from and how to get the wider ones."""
    select_models(page, [SINGLE])
    drawn(page, "pruning")
    plan = service.client.get(f"/api/v1/models/{SINGLE}/pruning-plan", params={"n": 1}).json()
    assert plan["costs_from"] == "intervention"
    rows = _table(page, "pruning-choices")
    assert [r[1] for r in rows] == [", ".join(map(str, r["blocks"])) for r in plan["rows"]]
    budget = Select(page.find_element(By_css(), "section[data-panel='pruning'] select.pruning-n"))
    assert [o.get_attribute("value") for o in budget.options] == ["1"]
    note = page.execute_script(
        "return document.querySelector(\"section[data-panel='pruning'] .note\").textContent")
    assert "intervention family's single-block drops" in note
    assert f"--model {SINGLE} --metrics pruning,pruning_drops" in note
