"""When discovery runs: before a claim when the known records ran short, and otherwise
at a bounded interval while claims come back full (so rows an ``eligible`` order puts
first do not wait for a whole backlog); through a backlog, ahead of the claims, once
fewer than two rounds' worth are left unclaimed."""

from __future__ import annotations

from typing import Any

from dbworker.scheduling.discovery import BUSY_DISCOVERY_SECONDS, DiscoverySchedule
from dbworker.scheduling.outbox import Deferred


def test_the_first_poll_discovers() -> None:
    assert DiscoverySchedule().due(now=0.0)


def test_full_claims_put_discovery_off_for_the_busy_interval() -> None:
    schedule = DiscoverySchedule()
    schedule.claims_full(now=100.0, poll_seconds=0.05)
    assert not schedule.due(100.0 + BUSY_DISCOVERY_SECONDS / 2)
    assert schedule.due(100.0 + BUSY_DISCOVERY_SECONDS)


def test_a_longer_poll_interval_is_kept_while_busy() -> None:
    schedule = DiscoverySchedule()
    schedule.claims_full(now=0.0, poll_seconds=BUSY_DISCOVERY_SECONDS * 3)
    assert not schedule.due(BUSY_DISCOVERY_SECONDS * 2)
    assert schedule.due(BUSY_DISCOVERY_SECONDS * 3)


def test_a_short_claim_makes_discovery_due_at_once() -> None:
    schedule = DiscoverySchedule()
    schedule.claims_full(now=0.0, poll_seconds=0.05)
    schedule.ran_short(now=0.2)
    assert schedule.due(0.2)


class _Rounds:
    """Stands in for the outbox, the dialect and the table of ``DiscoverySchedule.ahead``
    (and for its ``run``): counts the rounds run, each finding ``found`` rows."""

    discovery_batch = 4
    discovers_ahead = True

    def __init__(self, schedule: DiscoverySchedule, found: int, deferred: bool) -> None:
        self.schedule, self.found, self.deferred, self.rounds = schedule, found, deferred, 0

    def ahead(self) -> None:
        self.schedule.ahead(self, self, self, now=0.0)  # type: ignore[arg-type]

    def run(self, *_args: object) -> None:
        if self.deferred:
            raise Deferred
        self.rounds += 1
        self.schedule.discovered((self.found, self.rounds), 0.0, self.discovery_batch)


def _after_a_round(
    first: int, monkeypatch: Any, found: int = 4, deferred: bool = False
) -> tuple[DiscoverySchedule, _Rounds]:
    """A schedule whose first round (of at most 4 rows) found ``first``; its later rounds
    find ``found`` each."""
    schedule = DiscoverySchedule()
    schedule.discovered((first, 10), now=0.0, batch=_Rounds.discovery_batch)
    rounds = _Rounds(schedule, found, deferred)
    monkeypatch.setattr(DiscoverySchedule, "run", lambda _self, *args: rounds.run(*args))
    return schedule, rounds


def test_through_a_backlog_discovery_runs_ahead_of_the_claims(monkeypatch: Any) -> None:
    schedule, rounds = _after_a_round(4, monkeypatch)  # a full round: a backlog
    assert schedule.backlog and schedule.unclaimed == 4
    schedule.took(3)
    rounds.ahead()  # 1 left unclaimed, under two rounds' worth: the next round runs
    assert rounds.rounds == 1 and schedule.unclaimed == 5
    rounds.ahead()
    assert rounds.rounds == 2 and schedule.unclaimed == 9
    rounds.ahead()  # two rounds' worth left: nothing more yet
    assert rounds.rounds == 2
    schedule.took(2)
    rounds.ahead()
    assert rounds.rounds == 3 and schedule.unclaimed == 11


def test_a_round_that_is_not_full_ends_the_backlog(monkeypatch: Any) -> None:
    schedule, rounds = _after_a_round(4, monkeypatch, found=1)
    schedule.took(4)
    rounds.ahead()
    assert rounds.rounds == 1 and not schedule.backlog
    rounds.ahead()
    assert rounds.rounds == 1, "no backlog: discovery waits for a claim to run short"


def test_without_a_backlog_nothing_runs_ahead(monkeypatch: Any) -> None:
    schedule, rounds = _after_a_round(3, monkeypatch)
    schedule.took(3)
    rounds.ahead()
    assert rounds.rounds == 0 and schedule.unclaimed == 0


def test_a_round_deferred_is_tried_again_at_the_next_call(monkeypatch: Any) -> None:
    _schedule, rounds = _after_a_round(4, monkeypatch, deferred=True)
    rounds.ahead()  # the database is away: no error, no round
    assert rounds.rounds == 0
    rounds.deferred = False
    rounds.ahead()
    assert rounds.rounds == 1
