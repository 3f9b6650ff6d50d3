"""The one path every ending takes: which row of the transition table it writes (or
leaves to the handler process), and which event it reports, to the log listener too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import pytest
from sqlalchemy import Connection

from dbworker import Event, EventKind, Events
from dbworker.core.policy import Decision, Ending, decide
from dbworker.core.tasks import ErrorInfo, Result, ResultKind
from dbworker.core.transitions import Transition
from dbworker.dialects import Claim, Dialect, WorkerTable
from dbworker.logs import log_event
from dbworker.scheduling.endings import CANCELLED, ClaimedItem, Endings

TABLE = cast(WorkerTable, object())
ITEM = ClaimedItem("job", TABLE, 7, token=3, attempt=2)


class RecordingDialect:
    """Stands in for a dialect: remembers what ``record`` was asked to write."""

    def __init__(self) -> None:
        self.recorded: list[tuple[Any, int, Transition | None, ErrorInfo | None]] = []

    def record(
        self,
        conn: Any,
        worker: Any,
        source_id: Any,
        token: int,
        decision: Decision,
        error: ErrorInfo | None = None,
    ) -> bool:
        self.recorded.append((source_id, token, decision.transition, error))
        return True


class Harness:
    def __init__(self) -> None:
        self.dialect = RecordingDialect()
        self.events: list[Event] = []
        events = Events()
        events.subscribe(self.events.append)
        self.endings = Endings(cast(Dialect, self.dialect), self.write, events)

    def write(self, _: str, apply: Callable[[Connection], object], __: Any) -> None:
        apply(cast(Connection, None))

    @property
    def written(self) -> list[Transition | None]:
        return [transition for _, _, transition, _ in self.dialect.recorded]

    @property
    def reported(self) -> list[EventKind]:
        return [event.kind for event in self.events]


def result(kind: ResultKind, **fields: Any) -> Result:
    return Result(("job", 7, 3), kind, duration=0.25, **fields)


@pytest.mark.parametrize(
    ("kind", "reported"),
    [
        (ResultKind.FINISHED, EventKind.FINISHED),
        (ResultKind.UNFINISHED, EventKind.UNFINISHED),
        (ResultKind.FAILED, EventKind.FAILED),
        (ResultKind.RETRYING, EventKind.RETRIED),
        (ResultKind.LOST, EventKind.LOST),
    ],
)
def test_what_the_handler_process_recorded_is_reported_not_written(
    kind: ResultKind, reported: EventKind
) -> None:
    h = Harness()
    assert h.endings.result(ITEM, result(kind), crashes=0, max_crashes=3) is kind
    assert h.written == []
    assert h.reported == [reported]
    assert (h.events[0].attempt, h.events[0].duration) == (2, 0.25)


@pytest.mark.parametrize(
    ("retry_delay", "written", "reported", "outcome"),
    [
        (None, Transition.FAIL, EventKind.FAILED, ResultKind.FAILED),
        (5.0, Transition.RETRY, EventKind.RETRIED, ResultKind.RETRYING),
    ],
)
def test_an_unrecorded_failure_is_written_here(
    retry_delay: float | None, written: Transition, reported: EventKind, outcome: ResultKind
) -> None:
    h = Harness()
    unrecorded = result(ResultKind.UNRECORDED, error="boom", retry_delay=retry_delay)
    assert h.endings.result(ITEM, unrecorded, crashes=0, max_crashes=3) is outcome
    assert h.written == [written]
    assert h.reported == [reported]
    [(_, token, _, error)] = h.dialect.recorded
    assert token == 3 and error is not None and error.message == "boom"


@pytest.mark.parametrize(("crashes", "written"), [(0, Transition.CRASH), (2, Transition.GIVE_UP)])
def test_a_crash_is_released_or_given_up_at_the_limit(crashes: int, written: Transition) -> None:
    h = Harness()
    crashed = result(ResultKind.CRASHED, error="killed by SIGKILL")
    h.endings.result(ITEM, crashed, crashes=crashes, max_crashes=3)
    assert h.written == [written]
    assert h.reported == [EventKind.CRASHED]
    assert h.events[0].error == "killed by SIGKILL"


def test_a_run_stopped_here_is_recorded_again_but_not_reported_twice() -> None:
    h = Harness()
    crashed = result(ResultKind.CRASHED, error="killed")
    h.endings.result(ITEM, crashed, crashes=0, max_crashes=3, report=False)
    assert h.written == [Transition.CRASH]  # fenced: a no-op if the stop recorded it
    assert h.reported == []


def test_a_timeout_is_written_as_a_failure_and_reported_as_a_timeout() -> None:
    h = Harness()
    decision = decide(Ending.TIMED_OUT, error=TimeoutError("late"))
    h.endings.conclude(ITEM, decision, ErrorInfo("HandlerTimeout: late"), says="late")
    assert h.written == [Transition.FAIL]
    assert h.reported == [EventKind.TIMED_OUT]
    assert h.events[0].error == "late"


def test_a_stop_releases_without_counting_a_crash() -> None:
    h = Harness()
    h.endings.conclude(ITEM, decide(Ending.STOPPED), ErrorInfo("stopped"), duration=1.0)
    assert h.written == [Transition.RELEASE]
    assert h.reported == [EventKind.RELEASED]


@pytest.mark.parametrize(("crashes", "runs"), [(2, True), (3, False)])
def test_a_vanished_holder_is_given_up_at_the_limit(crashes: int, runs: bool) -> None:
    h = Harness()
    claim = Claim(7, 3, attempts=4, failures=0, crashes=crashes)
    assert h.endings.vanished(ITEM, claim, max_crashes=3) is runs
    assert h.written == ([] if runs else [Transition.FAIL])
    assert h.reported == ([] if runs else [EventKind.CRASHED])


def test_a_cancel_writes_nothing() -> None:
    # The canceller wrote the CANCEL row; the holder only reports it.
    h = Harness()
    h.endings.conclude(ITEM, CANCELLED, recorded=True)
    assert (h.written, h.reported) == ([], [EventKind.CANCELLED])


def test_a_lost_claim_writes_nothing() -> None:
    h = Harness()
    h.endings.conclude(ITEM, decide(Ending.LOST))
    assert (h.written, h.reported) == ([], [EventKind.LOST])


# -- the log listener ------------------------------------------------------------------------

SAYINGS = [
    (Event(EventKind.FINISHED, "job", 7, 2, duration=0.5), logging.INFO, "item finished in 0.500s"),
    (Event(EventKind.FAILED, "job", 7, 2, error="E: x"), logging.WARNING, "item failed: E: x"),
    (Event(EventKind.RETRIED, "job", 7, 2, error="E: x"), logging.WARNING, "item retrying: E: x"),
    (Event(EventKind.CRASHED, "job", 7, 2, error="gone"), logging.ERROR, "item crashed: gone"),
    (
        Event(EventKind.TIMED_OUT, "job", 7, 2, error="late"),
        logging.WARNING,
        "item timed out: late",
    ),
    (
        Event(EventKind.LOST, "job", 7, 2),
        logging.WARNING,
        "item lost its claim; handler stopped",
    ),
    (
        Event(EventKind.LOST, "job", 7, 2, duration=1.0),
        logging.WARNING,
        "item lost its claim; its writes were rolled back",
    ),
    (
        Event(EventKind.RELEASED, "job", 7, 2, duration=1.0),
        logging.WARNING,
        "item stopped by coordinator shutdown; released",
    ),
    (
        Event(EventKind.CANCELLED, "job", 7, 2),
        logging.WARNING,
        "item cancelled; handler stopped",
    ),
    (
        Event(EventKind.CANCELLED, "job", 7, 2, duration=1.0),
        logging.WARNING,
        "item cancelled; its writes were rolled back",
    ),
]


@pytest.mark.parametrize(("event", "level", "message"), SAYINGS)
def test_the_log_listener_says_each_ending_with_the_item_attributes(
    event: Event, level: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dbworker")
    log_event(event)
    [record] = caplog.records
    assert (record.levelno, record.getMessage()) == (level, message)
    assert (record.__dict__["worker"], record.__dict__["source_id"]) == ("job", 7)
    assert record.__dict__["attempt"] == 2


def test_a_cancel_no_one_ran_is_logged_without_an_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Reported by the canceller's coordinator: no claim, so no attempt.
    caplog.set_level(logging.DEBUG, logger="dbworker")
    log_event(Event(EventKind.CANCELLED, "job", 7))
    [record] = caplog.records
    assert (record.levelno, record.getMessage()) == (logging.INFO, "item cancelled")
    assert (record.__dict__["worker"], record.__dict__["source_id"]) == ("job", 7)
    assert record.__dict__["attempt"] == "?"


@pytest.mark.parametrize("kind", list(EventKind), ids=str)
def test_every_ending_is_logged(kind: EventKind, caplog: pytest.LogCaptureFixture) -> None:
    """Each kind an ending reports has a log line; claims and database errors are
    logged where they happen (a claim is no ending, the outbox logs its errors)."""
    caplog.set_level(logging.DEBUG, logger="dbworker")
    log_event(Event(kind, "job", 7, 2, duration=1.0, error="e"))
    silent = {EventKind.CLAIMED, EventKind.DATABASE_ERROR, EventKind.CONTENTION, EventKind.LOOP_LAG}
    assert len(caplog.records) == (0 if kind in silent else 1)
