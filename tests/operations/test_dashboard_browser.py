"""The dashboard in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which ``.ci/run`` installs), against a running coordinator.

The pages render; the retry button resets a failed item and the coordinator runs it
again; a cross-site form POST and a POST without the CSRF token are refused.
Screenshots are written to ``$DBWORKER_SCREENSHOTS`` when set (docs/images holds the
ones the documentation shows).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from dbworker import Coordinator, ExecutionStatus
from dbworker.operator.dashboard import create_app
from dbworker.registry import Timing

from . import app, periodic_app
from .support import Site, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test: apt-get install chromium chromium-driver")
        pytest.skip("no chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,900")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@contextlib.contextmanager
def serving(application: Any, port: int) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the dashboard to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def attacker_site(page: str) -> Iterator[str]:
    """Another origin (``localhost``, another port) serving ``page``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()


#: What Chromium's driver says of an element found on a page that a navigation has
#: just replaced (the same race as a stale element, reported otherwise).
_REPLACED = "does not belong to the document"


def page_text(driver: WebDriver) -> str:
    """The page's text; empty while a navigation replaces the page."""
    try:
        return str(driver.find_element(By.TAG_NAME, "body").text)
    except (StaleElementReferenceException, NoSuchElementException):
        return ""
    except WebDriverException as exc:
        if _REPLACED in str(exc.msg):
            return ""
        raise


def shoot(driver: WebDriver, name: str, tmp_path: Path) -> None:
    driver.save_screenshot(str(tmp_path / f"{name}.png"))
    target = os.environ.get("DBWORKER_SCREENSHOTS")
    if target:
        # The whole page, not just the window: the documentation shows all of it.
        height = driver.execute_script("return document.documentElement.scrollHeight")
        # The window's size includes the browser's own frame.
        driver.set_window_size(1200, max(600, int(height) + 160))
        driver.save_screenshot(str(Path(target) / f"dashboard-{name}.png"))
        driver.set_window_size(1200, 900)


def test_the_dashboard_in_a_browser(ops: Site, browser: WebDriver, tmp_path: Path) -> None:
    coordinator: Coordinator = ops.coordinator()
    coordinator.transactional_worker(name="jobs", source=app.Job, concurrency=2)(app.run_job)
    # A periodic worker ticking every second: the overview's Schedules section.
    coordinator.periodic_worker("beat", every=dt.timedelta(seconds=1))(periodic_app.finish)
    coordinator.create_worker_tables()
    coordinator._registry_timing = Timing(heartbeat=0.2, stats=0.2)
    ops.add_jobs(range(1, 9), app.QUICK)
    # 9 fails on its first run only: retried from the dashboard, it finishes.
    ops.add_jobs([9], app.FAIL, fail_times=1, error="value")
    ops.add_jobs([10], app.FAIL, fail_times=99, error="runtime")
    coordinator.start()
    try:
        ops.wait_for_status(coordinator, "jobs", range(1, 9), ExecutionStatus.FINISHED)
        ops.wait_for_status(coordinator, "jobs", [9, 10], ExecutionStatus.FAILED)
        with serving(create_app(coordinator), free_port()) as base:

            def failed_shown() -> str:
                browser.get(base + "/")
                row = browser.find_element(By.CSS_SELECTOR, '#workers tr[data-worker="jobs"]')
                return str(row.find_element(By.CSS_SELECTOR, "td.failed").text)

            # The counts may come from a coordinator's count of a moment ago (the
            # page says how old): wait for one taken after the failures.
            wait_until(lambda: failed_shown() == "2", "the overview to show 2 failed")
            assert browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")

            def coordinators_shown() -> str:
                browser.get(base + "/")
                return str(browser.find_element(By.ID, "coordinators").text)

            # Heartbeats every 0.2 s make a coordinator stale after 0.6 s without one: on
            # a loaded machine a page can catch a late one, so look again until it is
            # shown live (a coordinator that stopped beating never would be).
            wait_until(
                lambda: str(os.getpid()) in (shown := coordinators_shown()) and "live" in shown,
                "the coordinator to be shown live",
            )

            def schedule_shown() -> dict[str, str]:
                browser.get(base + "/")
                row = browser.find_element(By.CSS_SELECTOR, '#schedules tr[data-worker="beat"]')
                cells = row.find_elements(By.TAG_NAME, "td")
                return {
                    "schedule": cells[1].text,
                    "last": cells[3].text,
                    "status": cells[4].text,
                    "next": cells[5].text,
                }

            # The running coordinator makes a tick each second and runs it.
            shown = wait_until(
                lambda: (found := schedule_shown())["status"] == "finished" and found,
                "the schedule's last tick shown finished",
            )
            assert shown and shown["schedule"] == "every 0:00:01"
            last = dt.datetime.fromisoformat(shown["last"].replace("Z", "+00:00"))
            following = dt.datetime.fromisoformat(shown["next"].replace("Z", "+00:00"))
            assert following > last and (following - last).total_seconds() % 1 == 0
            # The last slot links to its tick's record.
            browser.find_element(
                By.CSS_SELECTOR, '#schedules tr[data-worker="beat"] td a[href*="/items/"]'
            ).click()
            wait_until(lambda: "/workers/beat/items/" in browser.current_url, "the tick's page")
            assert browser.find_element(By.ID, "status").text == "finished"
            browser.get(base + "/")
            shoot(browser, "overview", tmp_path)

            browser.get(base + "/workers/jobs")
            failed = browser.find_elements(By.CSS_SELECTOR, "#failed tr[data-id]")
            assert [r.get_attribute("data-id") for r in failed] == ["9", "10"]
            shoot(browser, "failed", tmp_path)

            # A POST whose form lost its CSRF token is refused, and changes nothing.
            browser.execute_script(
                "document.querySelectorAll('#failed tr[data-id=\"9\"] input[name=csrf]')"
                ".forEach(e => e.remove())"
            )
            browser.find_element(By.CSS_SELECTOR, '#failed tr[data-id="9"] button.retry').click()
            wait_until(lambda: "403" in page_text(browser), "the POST without a token refused")
            assert "CSRF token" in page_text(browser)
            assert ops.statuses(coordinator, "jobs", [9]) == {9: ExecutionStatus.FAILED}

            # A page of another site that posts a form here (with a token it had to
            # guess) is refused.
            forged = (
                f'<form id="f" method="post" action="{base}/workers/jobs/retry-failed">'
                '<input name="csrf" value="guessed"></form>'
                "<script>document.getElementById('f').submit()</script>"
            )
            with attacker_site(forged) as evil:
                browser.get(evil)
                wait_until(
                    lambda: browser.current_url.startswith(base) and "403" in page_text(browser),
                    "the forged POST to be refused",
                    diagnose=lambda: (browser.current_url, page_text(browser)),
                )
                assert "cross-site request refused" in page_text(browser)
            assert ops.statuses(coordinator, "jobs", [9, 10]) == dict.fromkeys(
                [9, 10], ExecutionStatus.FAILED
            )

            # The real button: reset, and the running coordinator runs it again.
            browser.get(base + "/workers/jobs/items/9")
            assert (
                "Traceback (most recent call last)" in browser.find_element(By.ID, "traceback").text
            )
            shoot(browser, "item", tmp_path)
            browser.find_element(By.CSS_SELECTOR, "#retry button").click()
            wait_until(lambda: "reset: it runs again" in page_text(browser), "the reset")
            ops.wait_for_status(coordinator, "jobs", [9], ExecutionStatus.FINISHED)
            browser.get(base + "/workers/jobs/items/9")
            assert browser.find_element(By.ID, "status").text == "finished"
            history = browser.find_element(By.ID, "history").text
            assert "claimed, attempt 2" in history and "finished" in history
            assert ops.statuses(coordinator, "jobs", [10]) == {10: ExecutionStatus.FAILED}
    finally:
        coordinator.stop()
