"""What limits hold back, visible to operators (issue 26) on every database: per
limited worker, ``coordinator.operations.limits()`` counts the waiting items whose key
is busy and the rate slots used, and ``dbworker status``, the Prometheus metrics and
the dashboard (in a headless Chromium) show them.

Claims are made by the dialect directly (no handler runs), so the counts are exact."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished, LimitFigures
from dbworker.dialects import Owner, WorkerTable, for_url
from dbworker.limit_options import check_limits
from dbworker.operator.cli.status import cmd_status
from dbworker.operator.dashboard import create_app
from dbworker.operator.metrics import prometheus_metrics
from operations.test_dashboard_browser import browser, free_port, page_text, serving
from waiting import wait_until

__all__ = ["browser"]  # the fixture, used by name

EXCLUSIVE, RATED, RATED_BY_KEY, PLAIN = (
    "vis_exclusive",
    "vis_rated",
    "vis_rated_by_key",
    "vis_plain",
)


class _Base(DeclarativeBase):
    pass


class VisibleJob(_Base):
    __tablename__ = "visible_jobs"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(sa.String(32))


def _handle(job: VisibleJob, session: Session) -> Finished:
    return Finished()


@pytest.fixture
def limited(database_url: str) -> Iterator[Coordinator]:
    """Jobs 1-3 of key a, 4 of key b; each limited worker claimed as much as it may."""
    engine = sa.create_engine(database_url)
    _Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=database_url)
    worker = coordinator.transactional_worker
    for name, limits in LIMITS.items():
        worker(name, VisibleJob, **limits)(_handle)
    worker(PLAIN, VisibleJob)(_handle)
    coordinator.create_worker_tables()
    with engine.begin() as conn:
        conn.execute(
            sa.insert(VisibleJob),
            [
                {"id": 1, "key": "a"},
                {"id": 2, "key": "a"},
                {"id": 3, "key": "a"},
                {"id": 4, "key": "b"},
            ],
        )
    try:
        assert _claim(coordinator, database_url, EXCLUSIVE) == [1, 4], "one per key"
        assert _claim(coordinator, database_url, RATED) == [1, 2], "2 per hour"
        assert _claim(coordinator, database_url, RATED_BY_KEY) == [1, 4], "1 per key and hour"
        yield coordinator
    finally:
        engine.dispose()


LIMITS: dict[str, dict[str, Any]] = {
    EXCLUSIVE: {"exclusive_by": VisibleJob.key},
    RATED: {"rate_limit": "2/h"},
    RATED_BY_KEY: {"rate_limit": "1/h", "rate_limit_by": VisibleJob.key},
}


def _claim(coordinator: Coordinator, url: str, name: str) -> list[Any]:
    """Claim what ``name``'s limits allow, as its coordinator would."""
    source = VisibleJob.__table__
    assert isinstance(source, sa.Table)
    table = WorkerTable(
        name,
        coordinator.workers[name].execution_table,
        source.c.id,
        monotonic_keys=True,
        limits=check_limits(source, **LIMITS[name]),
    )
    dialect = for_url(url)
    engine = sa.create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    with engine.begin() as conn:
        dialect.discover(conn, table)
        eligible = sa.select(VisibleJob).order_by(VisibleJob.id)
        claims = dialect.claim(conn, table, eligible, 10, 3600.0, Owner.current())
    engine.dispose()
    return sorted(c.source_id for c in claims)


EXPECTED = {
    EXCLUSIVE: LimitFigures(EXCLUSIVE, "visible_jobs.key", None, None, 2, None, None, None, 0.0),
    RATED: LimitFigures(RATED, None, "2/h", None, None, 2, 2, 2, 0.0),
    RATED_BY_KEY: LimitFigures(RATED_BY_KEY, None, "1/h", "visible_jobs.key", None, 2, 1, 2, 0.0),
}


def _without_time(figures: LimitFigures) -> LimitFigures:
    return LimitFigures(**{**_fields(figures), "measured_at": 0.0})


def _fields(figures: LimitFigures) -> dict[str, Any]:
    return {f: getattr(figures, f) for f in LimitFigures.__dataclass_fields__}


def test_operations_count_what_limits_hold_back(limited: Coordinator) -> None:
    found = limited.operations.limits()
    assert {name: _without_time(f) for name, f in found.items()} == EXPECTED
    assert limited.operations.limits(PLAIN) == {}, "an unlimited worker has no limits"
    assert list(limited.operations.limits(EXCLUSIVE)) == [EXCLUSIVE]


def test_status_shows_limits(limited: Coordinator, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(worker=None, live=True, json=True, watch=None)
    assert cmd_status(limited, args) == 0
    report = json.loads(capsys.readouterr().out)
    assert "limits" not in report[PLAIN]
    for name, figures in EXPECTED.items():
        fields = _fields(figures)
        del fields["worker"], fields["measured_at"]
        assert report[name]["limits"] == fields

    assert cmd_status(limited, argparse.Namespace(**{**vars(args), "json": False})) == 0
    human = capsys.readouterr().out.splitlines()
    start = next(
        i
        for i, line in enumerate(human)
        if line.split()[:3] == ["worker", "exclusive_by", "key_busy"]
    )
    rows = {line.split()[0]: line.split()[1:] for line in human[start + 2 : start + 5]}
    assert rows == {
        EXCLUSIVE: ["visible_jobs.key", "2", "-", "-", "-", "-"],
        RATED: ["-", "-", "2/h", "-", "2", "2"],
        RATED_BY_KEY: ["-", "-", "1/h", "visible_jobs.key", "2", "2"],
    }


def test_metrics_show_limits(limited: Coordinator) -> None:
    metrics = prometheus_metrics(limited, CollectorRegistry())
    samples = {
        (sample.name, sample.labels.get("worker")): sample.value
        for family in text_string_to_metric_families(metrics.text())
        for sample in family.samples
        if sample.name.startswith(
            ("dbworker_items_key_busy", "dbworker_rate_slots_used", "dbworker_items_rate_limited")
        )
    }
    assert samples == {
        ("dbworker_items_key_busy", EXCLUSIVE): 2.0,
        ("dbworker_rate_slots_used", RATED): 2.0,
        ("dbworker_rate_slots_used", RATED_BY_KEY): 2.0,
        ("dbworker_items_rate_limited", RATED): 2.0,
        ("dbworker_items_rate_limited", RATED_BY_KEY): 2.0,
    }


def test_the_dashboard_shows_limits(limited: Coordinator, browser: WebDriver) -> None:
    with serving(create_app(limited), free_port()) as base:
        browser.get(base + "/")
        wait_until(lambda: "Limits" in page_text(browser), "the overview to render")
        rows = {
            row.get_attribute("data-worker"): [
                cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td.n")
            ]
            for row in browser.find_elements(By.CSS_SELECTOR, "#limits tr[data-worker]")
        }
        assert rows == {
            EXCLUSIVE: ["2", "-", "-"],
            RATED: ["-", "2", "2"],
            RATED_BY_KEY: ["-", "2", "2"],
        }
        browser.get(f"{base}/workers/{EXCLUSIVE}")
        wait_until(lambda: "waiting for a busy key" in page_text(browser), "the worker page")
        assert browser.find_element(By.CSS_SELECTOR, "#worker-limits .key-busy").text == "2"
        browser.get(f"{base}/workers/{RATED_BY_KEY}")
        wait_until(lambda: "rate-limited" in page_text(browser), "the worker page")
        limits = browser.find_element(By.ID, "worker-limits")
        assert limits.find_element(By.CSS_SELECTOR, ".slots-used").text == "2"
        assert limits.find_element(By.CSS_SELECTOR, ".rate-limited").text == "2"
        browser.get(f"{base}/workers/{PLAIN}")
        wait_until(lambda: "Worker " + PLAIN in page_text(browser), "the worker page")
        assert not browser.find_elements(By.ID, "worker-limits")
