"""Completions are announced to other coordinators' dependent workers in batches: a
busy loop completes items in most passes, and each announcement is a transaction."""

from __future__ import annotations

import time
from typing import Any

from dbworker.scheduling.loop import ANNOUNCE_EVERY_SECONDS, Scheduler


class _Wakeups:
    def __init__(self) -> None:
        self.announced: list[set[str]] = []

    def announce(self, names: set[str], transaction: Any) -> None:
        self.announced.append(set(names))


class _Outbox:
    transaction = None


def _scheduler() -> Any:
    scheduler: Any = Scheduler.__new__(Scheduler)
    scheduler.wakeups = _Wakeups()
    scheduler.outbox = _Outbox()
    scheduler._to_announce = set()
    scheduler._next_announce = 0.0
    return scheduler


def test_completions_within_the_interval_are_announced_together(monkeypatch: Any) -> None:
    scheduler = _scheduler()
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    scheduler._to_announce |= {"after"}
    scheduler._announce()
    assert scheduler.wakeups.announced == [{"after"}], "the first goes out at once"
    scheduler._to_announce |= {"after"}
    clock[0] += ANNOUNCE_EVERY_SECONDS / 2
    scheduler._announce()
    scheduler._to_announce |= {"report"}
    scheduler._announce()
    assert scheduler.wakeups.announced == [{"after"}], "held until the interval is over"
    clock[0] += ANNOUNCE_EVERY_SECONDS
    scheduler._announce()
    assert scheduler.wakeups.announced == [{"after"}, {"after", "report"}]
    assert scheduler._to_announce == set()


def test_nothing_to_announce_sends_nothing() -> None:
    scheduler = _scheduler()
    scheduler._announce()
    assert scheduler.wakeups.announced == []
    assert time.monotonic() >= scheduler._next_announce
