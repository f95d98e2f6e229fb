"""The MLflow UI in headless Chromium, at the URL the smoke sweep printed: the runs table lists every trial by
name, and a run page shows the capsule artifact. Screenshots are kept: under the test's tmp dir, and in
``test-artifacts/`` of the checkout when ``CI`` is set (.ci/run installs Chromium and its driver).

Driver: Selenium with the Debian ``chromium-driver``. Selenium's explicit waits (wait until a text is on the
page) are what a single-page app needs, and it is the well-kept library for this; a hand-written DevTools
client would have to re-implement them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
SWEEP_RUN = "it-ui (sweep)"
EXPERIMENT = "capt-it-ui"
RUN_NAMES = ("cb/tiny-t5/capt/s0", "cb/minilm/capt/s0", "rte/tiny-t5/capt/s0", "rte/minilm/capt/s0")
WAIT_S = 30.0
"""Longest wait for one thing to appear (the UI loads runs and artifacts asynchronously)."""


def _executable(names: tuple[str, ...]) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by Selenium; skipped, saying how to install them, when either is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="Selenium is missing: pip install -e '.[dev]'")
    chromium, driver = _executable(CHROMIUM), _executable(("chromedriver",))
    if chromium is None or driver is None:
        pytest.skip(f"NO BROWSER TEST: Chromium ({chromium or 'missing'}) or chromedriver ({driver or 'missing'}) is "
                    "not installed; `apt-get install chromium chromium-driver` (.ci/run does it when it can)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()


def _shots(tmp_path: Path) -> list[Path]:
    folders = [tmp_path / "screenshots"]
    if os.environ.get("CI"):
        folders.append(ROOT / "test-artifacts" / "mlflow-ui")
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def _screenshot(browser: Any, folders: list[Path], name: str) -> None:
    for folder in folders:
        browser.save_screenshot(str(folder / f"{name}.png"))


def _wait_for_text(browser: Any, text: str) -> Any:
    """The first visible element whose own text is `text`, once the page shows it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    locator = (By.XPATH, f"//*[normalize-space(text())='{text}']")
    return WebDriverWait(browser, WAIT_S).until(expected_conditions.element_to_be_clickable(locator))


def _best_validation_first(smoke_sweep: dict[str, Any]) -> list[str]:
    """The sweep's trial runs by their logged best validation score, highest first (read from the server)."""
    from mlflow import MlflowClient

    runs = MlflowClient(smoke_sweep["uri"]).search_runs([smoke_sweep["experiment_id"]])
    scores = {r.info.run_name: r.data.metrics["validation/best_score"] for r in runs if r.info.run_name in RUN_NAMES}
    return sorted(scores, key=lambda name: -scores[name])


def test_the_printed_url_lists_every_trial_and_a_run_page_shows_the_capsule(
        smoke_sweep: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    folders = _shots(tmp_path)
    browser.get(smoke_sweep["url"])
    try:  # sorted by a metric, MLflow lists the nested runs flat: every trial shows, best validation first
        links = {name: _wait_for_text(browser, name) for name in RUN_NAMES}
        _wait_for_text(browser, "Sort: validation/best_score")
    finally:
        _screenshot(browser, folders, "runs")
    assert "/runs" in browser.current_url
    shown = sorted(RUN_NAMES, key=lambda name: links[name].location["y"])
    assert shown == _best_validation_first(smoke_sweep), shown
    links["rte/minilm/capt/s0"].click()
    try:
        _wait_for_text(browser, "Artifacts").click()
        _wait_for_text(browser, "artifact").click()
        _wait_for_text(browser, "capsule.safetensors")
    finally:
        _screenshot(browser, folders, "run-artifacts")
    assert "/runs/" in browser.current_url and "artifacts" in browser.current_url


def test_the_sweep_runs_url_shows_its_report_and_the_registry_its_champion(
        smoke_sweep: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    folders = _shots(tmp_path)
    browser.get("about:blank")  # a fresh page, as a pasted URL opens: the app keeps state across hash changes
    browser.get(smoke_sweep["sweep_run_url"])
    try:
        for name in ("report.md", "summary.md", "summary.csv", "sweep_config.json"):
            _wait_for_text(browser, name)
        assert "Evaluations" not in browser.page_source, "a training run's page, not a GenAI run's"
        _wait_for_text(browser, "report.png").click()
        WebDriverWait(browser, WAIT_S).until(  # the picture drawn (the UI shows it from a blob: URL)
            lambda b: any(b.execute_script("return arguments[0].naturalWidth", img) >= 600
                          for img in b.find_elements(By.TAG_NAME, "img")))
    finally:
        _screenshot(browser, folders, "sweep-run-report")
    browser.get("about:blank")
    browser.get(smoke_sweep["uri"].rstrip("/") + "/#/models/capt-minilm-rte")
    try:  # the version the sweep registered, with the alias it promoted
        WebDriverWait(browser, WAIT_S).until(lambda b: "Version 1" in b.page_source and "champion" in b.page_source)
    finally:
        _screenshot(browser, folders, "registered-model")


def test_from_the_home_page_or_a_bare_link_the_experiment_opens_on_its_runs_once_model_training_is_chosen(
        smoke_sweep: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    """MLflow 3.17 lets the browser, not the experiment, decide how an experiment opens: its "GenAI / Model training"
    switch (GenAI at first, kept by the browser); no experiment tag changes it (pipelines.tracking.experiment.
    TRAINING_VIEW). Once a user picks Model training, the home page's link and the bare experiment URL open the runs
    table with the sweep's run, not the GenAI traces page."""
    folders, home = _shots(tmp_path), smoke_sweep["uri"].rstrip("/") + "/#/"
    browser.get("about:blank")
    browser.get(home)
    try:
        _wait_for_text(browser, "Model training").click()
        _wait_for_text(browser, EXPERIMENT).click()
        _wait_for_text(browser, SWEEP_RUN)
        assert "/runs" in browser.current_url and "traces" not in browser.current_url, browser.current_url
        browser.get("about:blank")
        browser.get(f"{home}experiments/{smoke_sweep['experiment_id']}")
        _wait_for_text(browser, SWEEP_RUN)
        assert "/runs" in browser.current_url, browser.current_url
    finally:
        _screenshot(browser, folders, "experiment-from-home")
        browser.execute_script("window.localStorage.clear()")  # the next test opens a fresh browser's UI
