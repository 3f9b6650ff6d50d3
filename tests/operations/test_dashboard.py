"""The dashboard over HTTP (Starlette's test client): pages render from the database,
the actions reset failed items, and what must be refused is refused."""

from __future__ import annotations

import datetime as dt
import re
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from dbworker import ConfigurationError, ExecutionStatus
from dbworker.operator.dashboard import check_binding, create_app

from . import periodic_app
from .support import Site, wait_until
from .test_cli import (
    COMMAND_TIMEOUT,
    DBWORKER,
    REFERENCE,
    dbworker,
    environment,
    reaped,
    twin,
    worked,
)
from .test_schedules import START, add_ticks, periodic

LOCAL = "http://127.0.0.1:8000"


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


def test_pages_render_and_retry_resets(ops: Site) -> None:
    coordinator = worked(ops)
    client = TestClient(create_app(coordinator), base_url=LOCAL)
    index = client.get("/")
    assert index.status_code == 200
    assert 'data-worker="jobs"' in index.text and "<svg" in index.text
    assert "No coordinator is running." in index.text
    worker = client.get("/workers/jobs")
    assert worker.status_code == 200
    assert 'data-id="3"' in worker.text and 'data-id="4"' in worker.text
    assert "ValueError" in worker.text  # the error and its traceback
    item = client.get("/workers/jobs/items/3")
    assert item.status_code == 200 and "Traceback (most recent call last)" in item.text
    assert client.get("/workers/nope").status_code == 404
    assert client.get("/workers/jobs/items/99").status_code == 404

    token = csrf_of(item.text)
    done = client.post("/workers/jobs/items/3/retry", data={"csrf": token}, follow_redirects=False)
    assert done.status_code == 303
    assert ops.statuses(coordinator, "jobs", [3, 4]) == {
        3: ExecutionStatus.UNFINISHED,
        4: ExecutionStatus.FAILED,
    }
    everything = client.post("/workers/jobs/retry-failed", data={"csrf": token})
    assert everything.status_code == 200 and "reset 1 failed item(s)" in everything.text
    assert ops.statuses(coordinator, "jobs", [4]) == {4: ExecutionStatus.UNFINISHED}


def test_the_item_page_cancels_an_open_item(ops: Site) -> None:
    coordinator = worked(ops)  # job 5 is UNFINISHED, job 1 FINISHED
    client = TestClient(create_app(coordinator), base_url=LOCAL)
    item = client.get("/workers/jobs/items/5")
    assert item.status_code == 200 and 'id="cancel"' in item.text
    assert 'id="cancel"' not in client.get("/workers/jobs/items/1").text
    token = csrf_of(item.text)
    done = client.post("/workers/jobs/items/5/cancel", data={"csrf": token})
    assert done.status_code == 200 and "cancelled: it does not run again" in done.text
    assert 'id="cancel"' not in done.text and 'id="retry"' in done.text
    assert ops.statuses(coordinator, "jobs", [5]) == {5: ExecutionStatus.FAILED}
    state = ops.state(coordinator, "jobs", 5)
    assert state is not None and state["error_type"] == "dbworker.Cancelled"
    left = client.post("/workers/jobs/items/1/cancel", data={"csrf": token})
    assert "not open: left alone" in left.text
    assert ops.statuses(coordinator, "jobs", [1]) == {1: ExecutionStatus.FINISHED}
    refused = client.post("/workers/jobs/items/5/cancel", data={"csrf": "guessed"})
    assert refused.status_code == 403


def test_the_overview_shows_schedules_only_with_periodic_workers(ops: Site) -> None:
    plain = twin(ops)
    plain.create_worker_tables()
    without = TestClient(create_app(plain), base_url=LOCAL).get("/")
    assert without.status_code == 200 and 'data-worker="jobs"' in without.text
    assert 'id="schedules"' not in without.text and "Schedules" not in without.text

    coordinator = periodic(ops)
    coordinator.create_worker_tables()
    add_ticks(ops, "hourly", [START, START + periodic_app.HOURLY])
    add_ticks(ops, "nightly", [START.replace(hour=2, minute=30)])
    coordinator.drain()
    states = {state.worker: state for state in coordinator.operations.schedules()}
    index = TestClient(create_app(coordinator), base_url=LOCAL).get("/")
    assert index.status_code == 200
    section = index.text[index.text.index('<table id="schedules">') :]
    section = section[: section.index("</table>")]
    rows = dict(re.findall(r'<tr data-worker="(\w+)">(.*?)</tr>', section, re.DOTALL))
    assert list(rows) == ["hourly", "nightly", "minutely"]
    hourly = states["hourly"]
    assert (
        f'href="/workers/hourly/items/{hourly.last_tick}">2024-05-01 01:00:00Z</a>'
        in (rows["hourly"])
    )
    assert '<td class="status finished">finished</td>' in rows["hourly"]
    assert "every 1:00:00" in rows["hourly"] and "latest" in rows["hourly"]
    assert '<td class="status failed">failed</td>' in rows["nightly"]
    assert "cron &#39;30 4 * * *&#39; (Europe/Berlin)" in rows["nightly"]
    # Never ticked: no slot, no status, and still its next slot.
    assert '<td class="last-slot">-</td>' in rows["minutely"]
    assert '<td class="status -">-</td>' in rows["minutely"]
    for name, row in rows.items():
        next_slot = states[name].next_slot
        # The page is rendered a moment after states: a slot may have fallen between.
        shown = re.search(r'<time datetime="([^"]+)">', row)
        assert shown is not None and dt.datetime.fromisoformat(shown[1]) >= next_slot
    item = TestClient(create_app(coordinator), base_url=LOCAL).get(
        f"/workers/hourly/items/{hourly.last_tick}"
    )
    assert item.status_code == 200 and "finished" in item.text


def test_forged_and_tokenless_posts_are_refused(ops: Site) -> None:
    coordinator = worked(ops)
    client = TestClient(create_app(coordinator), base_url=LOCAL)
    token = csrf_of(client.get("/workers/jobs").text)
    url = "/workers/jobs/items/3/retry"
    refused = [
        client.post(url),  # no CSRF token
        client.post(url, data={"csrf": "guessed"}),
        client.post(url, data={"csrf": token}, headers={"origin": "https://evil.example"}),
        client.post(url, data={"csrf": token}, headers={"sec-fetch-site": "cross-site"}),
        client.get(url),  # actions are POST only
    ]
    assert [r.status_code for r in refused] == [403, 403, 403, 403, 405]
    assert ops.statuses(coordinator, "jobs", [3]) == {3: ExecutionStatus.FAILED}
    # A page reached through another name (DNS rebinding) is refused without a token.
    assert (
        TestClient(create_app(coordinator), base_url="http://evil.example").get("/").status_code
        == 403
    )


def test_read_only_has_no_actions(ops: Site) -> None:
    coordinator = worked(ops)
    client = TestClient(create_app(coordinator, read_only=True), base_url=LOCAL)
    page = client.get("/workers/jobs")
    assert page.status_code == 200 and "Retry" not in page.text
    assert "Cancel" not in client.get("/workers/jobs/items/5").text
    assert client.post("/workers/jobs/retry-failed", data={}).status_code == 403
    assert ops.statuses(coordinator, "jobs", [3]) == {3: ExecutionStatus.FAILED}


def test_an_access_token_guards_every_page(ops: Site) -> None:
    coordinator = twin(ops)
    coordinator.create_worker_tables()
    app = create_app(coordinator, token="s3cret")
    client = TestClient(app, base_url="http://dashboard.example")
    assert client.get("/").status_code == 401
    assert client.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/", headers={"authorization": "Bearer s3cret"}).status_code == 200
    # ?token= once: traded for a cookie, and dropped from the address.
    first = client.get("/workers/jobs?token=s3cret", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/workers/jobs"
    assert client.get("/workers/jobs").status_code == 200  # by the cookie now


def test_binding_beyond_loopback_needs_a_token() -> None:
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    with pytest.raises(ConfigurationError, match="access token"):
        check_binding("0.0.0.0", None)
    check_binding("0.0.0.0", "s3cret")


def test_the_dashboard_command(ops: Site, tmp_path: Path) -> None:
    worked(ops)
    refused = dbworker(ops.url, "dashboard", REFERENCE, "--host", "0.0.0.0", cwd=ops.workdir)
    assert refused.returncode == 2 and "access token" in refused.stderr
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "dashboard.log"
    command = [str(DBWORKER), "dashboard", REFERENCE, "--port", str(port), "--read-only"]
    with log.open("wb") as out:
        started = subprocess.Popen(
            command,
            env=environment(ops.url),
            cwd=ops.workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def page() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/workers/jobs") as response:
                return str(response.read().decode())
        except OSError:
            return None

    with reaped(started) as process:
        wait_until(lambda: page() is not None, "the dashboard to answer", diagnose=log.read_text)
        text = page()
        assert text is not None and 'data-id="3"' in text and "Retry" not in text
        assert f"dashboard at http://127.0.0.1:{port}/ (read-only)" in log.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(COMMAND_TIMEOUT) == 0
