"""Periodic workers end to end (issue 24): every slot ticks exactly once however many
coordinator services run, none is skipped, and each catch-up policy makes what it says
of the slots missed while every service was down. On every backend."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import ConfigurationError, Coordinator, ExecutionStatus, Tick
from dbworker.core.schedules import MICROSECONDS, to_microseconds
from dbworker.dialects import for_url
from dbworker.scheduling.ticks import Ticker
from serving import process_in_session
from waiting import wait_until

from . import app

STEP = app.EVERY // app.EVERY.resolution  # one slot, in microseconds


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    app.Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def make_coordinator(engine: Engine, url: str, catch_up: str = "latest") -> Coordinator:
    coordinator = Coordinator(
        sessionmaker(engine), database_url=url, poll_seconds=0.05, max_poll_seconds=0.2
    )
    app.register(coordinator, catch_up)
    coordinator.create_worker_tables()
    return coordinator


def service(url: str, log_path: Path) -> contextlib.AbstractContextManager[Popen[bytes]]:
    """A coordinator service in a process (and session) of its own; SIGTERM stops it."""
    return process_in_session([sys.executable, "-m", f"{__package__}.run_service", url], log_path)


def stop(process: Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    wait_until(lambda: process.poll() is not None, "the service to stop")
    assert process.returncode == 0


def slots(engine: Engine) -> list[int]:
    with Session(engine) as session:
        return list(session.scalars(select(Tick.slot).where(Tick.worker == app.NAME)))


def finished(coordinator: Coordinator, engine: Engine) -> list[int]:
    """The slots of the ticks whose record is FINISHED."""
    with Session(engine) as session:
        ticks = session.scalars(select(Tick).where(Tick.worker == app.NAME)).all()
        return sorted(
            tick.slot
            for tick in ticks
            if coordinator.execution_status(session, worker=app.NAME, source_id=tick.id)
            is ExecutionStatus.FINISHED
        )


def runs(engine: Engine) -> list[int]:
    with Session(engine) as session:
        return sorted(session.scalars(select(app.TickRun.slot)))


def db_now(engine: Engine, url: str) -> float:
    with engine.connect() as conn:
        return float(conn.execute(select(for_url(url).now())).scalar_one())


def assert_each_slot_once(engine: Engine, coordinator: Coordinator) -> list[int]:
    made = slots(engine)
    assert len(made) == len(set(made)), "a slot was made into two ticks"
    ordered = sorted(made)
    assert ordered == finished(coordinator, engine), "a tick did not end FINISHED"
    assert runs(engine) == ordered, "a tick's handler committed other than once"
    return ordered


def test_two_services_tick_each_slot_exactly_once(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    coordinator = make_coordinator(engine, database_url)  # for reading; never started
    with (
        service(database_url, tmp_path / "a.log") as first,
        service(database_url, tmp_path / "b.log") as second,
    ):
        wait_until(lambda: len(finished(coordinator, engine)) >= 12, "twelve finished ticks")
        stop(first)
        stop(second)
    ordered = assert_each_slot_once(engine, coordinator)
    assert len(ordered) >= 12
    steps = {later - earlier for earlier, later in itertools.pairwise(ordered)}
    assert steps == {STEP}, "a slot was skipped between the first and the last"


@pytest.mark.parametrize("catch_up", ["latest", "all", "none"])
def test_catch_up_after_every_service_was_down(
    engine: Engine, database_url: str, catch_up: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = [make_coordinator(engine, database_url) for _ in range(2)]
    for coordinator in before:
        coordinator.start()
    wait_until(lambda: len(finished(before[0], engine)) >= 2, "two finished ticks")
    for coordinator in before:
        coordinator.stop()
    last = max(slots(engine))
    # Down across several slots: the database's clock is past four more of them.
    wait_until(
        lambda: db_now(engine, database_url) * MICROSECONDS > last + 4.5 * STEP,
        "four slots to pass",
        interval=0.2,
    )
    # When the first insert ran, on the database's clock: what it made up to. Taken as
    # it is made: read afterwards, a regular tick may already have moved it on.
    first_insert: list[dt.datetime] = []
    make = Ticker.make

    def recording(ticker: Ticker, now: float) -> None:
        make(ticker, now)
        made_up_to = ticker.periodic[0].made_up_to
        if not first_insert and made_up_to is not None:
            first_insert.append(made_up_to)

    monkeypatch.setattr(Ticker, "make", recording)
    after = make_coordinator(engine, database_url, catch_up)
    after.start()
    try:
        [started] = wait_until(lambda: first_insert, "the service's first insert")
        until = to_microseconds(started)
        wait_until(
            lambda: max(finished(after, engine)) > last + STEP * 6, "ticks after the catch-up"
        )
    finally:
        after.stop()
    ordered = assert_each_slot_once(engine, after)
    made_at_start = [s for s in ordered if last < s <= until]
    missed = list(range(last + STEP, until + 1, STEP))
    expected = {"latest": missed[-1:], "all": missed, "none": []}[catch_up]
    assert made_at_start == expected
    later = [s for s in ordered if s > until]
    steps = {b - a for a, b in itertools.pairwise(later)}
    assert later and later[0] - until <= STEP and steps == {STEP}


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"cron": "61 * * * *"}, "61 * * * *"),
        ({"cron": "* * * *"}, "* * * *"),
        ({"cron": "* * * * *", "every": dt.timedelta(seconds=1)}, "every="),
        ({}, "cron=None, every=None"),
        ({"every": dt.timedelta(0)}, "timedelta(0)"),
        ({"every": dt.timedelta(seconds=-5)}, "timedelta(days=-1, seconds=86395)"),
        ({"every": dt.timedelta(seconds=1), "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"every": dt.timedelta(seconds=1), "catch_up": "some"}, "'some'"),
    ],
)
def test_bad_schedules_are_refused_at_registration_naming_the_value(
    tmp_path: Path, arguments: dict[str, Any], named: str
) -> None:
    url = f"sqlite:///{tmp_path / 'app.sqlite'}"
    coordinator = Coordinator(sessionmaker(create_engine(url)), database_url=url)
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        coordinator.periodic_worker(app.NAME, **arguments)
    assert app.NAME not in coordinator.workers
