"""Take a screenshot of a running Strata service's dashboard as a user sees it.

    .venv/bin/python scripts/dashboard_screenshot.py --url http://127.0.0.1:8000 \
        --models SmolLM2-135M-Instruct.Q4_1,demo-4l --out docs/study-smollm2/dashboard.png

The models are ticked the way a user does (search, tick), the x axis is set to relative depth
(`--x layer` keeps layers), error bars stay on, stages are shaded for the first model, and the
picture is taken once every panel in the window has drawn from the API. Needs Debian's chromium
and chromium-driver, and selenium (a test dependency).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(check: Callable[[], Any], what: str, timeout: float = 120,
             on_timeout: Callable[[str], Any] | None = None) -> Any:
    """`check()`'s first true value, polled until `timeout`; then `on_timeout(what)` (by default:
    exit with a message)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            if on_timeout is not None:
                return on_timeout(what)
            raise SystemExit(f"error: timed out waiting for {what}")
        time.sleep(0.1)


def browser(width: int, height: int) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit("error: needs chromium and chromedriver "
                         "(apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver))


def tick(driver: Any, name: str, on_timeout: Callable[[str], Any] | None = None) -> None:
    """Tick `name` in the model list the way a user does: search for it, tick its box, clear the
    search (every model listed again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def ticked() -> bool:
        try:
            boxes = driver.find_elements(
                By.CSS_SELECTOR, f'#model-list li[data-model-name="{name}"] input')
            if boxes and not boxes[0].is_selected():
                boxes[0].click()
            return bool(boxes) and boxes[0].is_selected()
        except StaleElementReferenceException:  # the list was redrawn under the click
            return False

    search = driver.find_element(By.ID, "model-search")
    search.clear()
    search.send_keys(name)
    wait_for(ticked, f"model {name} in the model list", on_timeout=on_timeout)
    search.clear()
    search.send_keys(" ")  # clear() fires no input event: type, then erase, to list every model
    search.send_keys("\b")


def panels_settled(driver: Any) -> bool:
    """Every panel is drawn, empty or failed (none still loading)."""
    states = driver.execute_script(
        "return [...document.querySelectorAll('section.panel')].map(s => s.dataset.state)")
    return bool(states) and all(s in ("drawn", "empty", "error") for s in states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--models", required=True, help="comma-separated model names")
    parser.add_argument("--x", choices=("depth", "layer"), default="depth")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args()
    from selenium.webdriver.support.select import Select

    models = [m for m in args.models.split(",") if m]
    driver = browser(args.width, args.height)
    try:
        driver.get(args.url.rstrip("/") + "/")
        wait_for(lambda: driver.execute_script("return document.body.dataset.ready"),
                 "the page to load")
        for name in models:
            tick(driver, name)
        driver.find_element("id", f"x-{args.x}").click()
        Select(driver.find_element("id", "stage-model")).select_by_visible_text(models[0])
        time.sleep(1.0)  # let the redraws start before asking whether they have settled
        wait_for(lambda: panels_settled(driver), "every panel to draw")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        if errors:
            print(f"warning: the browser console has errors: {errors}", file=sys.stderr)
        driver.execute_script("window.scrollTo(0, 0)")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        print(args.out)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
