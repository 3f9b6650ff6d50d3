"""A claim that took nothing because another transaction held claimable records looks
again soon (backing off while it recurs), not at the worker's next poll; an empty claim
that skipped nothing backs off as usual."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dbworker.core.timing import PollBackoff, Timings
from dbworker.dialects import Claim, Claims
from dbworker.scheduling.discovery import DiscoverySchedule
from dbworker.scheduling.polling import Polls
from dbworker.scheduling.state import CONTENDED_RETRY_SECONDS, WorkerState

#: Polling so rare that a poll due within a second can only be a contention retry.
TIMINGS = Timings(poll_seconds=60, max_poll_seconds=600)
NOW = 1000.0


class _Dialect:
    discovery_batch = 1000

    def __init__(self) -> None:
        self.results: list[list[Claim]] = []

    def claim(self, *_: Any) -> list[Claim]:
        return self.results.pop(0)


class _Outbox:
    def transaction(self, _what: str, run: Any, read_only: bool = False) -> Any:
        return run(None)


class _Executor:
    uses_rows = False

    def free_slots(self) -> int:
        return 2

    def submit_all(self, tasks: list[Any]) -> None:
        pass


class _NoDiscovery(DiscoverySchedule):
    """The claim alone is under test."""

    def run(self, *_: Any) -> None:
        pass

    def sweep(self, *_: Any) -> int:
        return 0

    def discover(self, *_: Any, **__: Any) -> Any:
        return 0, None


def _polls(dialect: _Dialect) -> Any:
    outcomes: Any = SimpleNamespace(claimed=lambda state, claim: True)
    health: Any = SimpleNamespace(claimed=0)
    return Polls(_Outbox(), dialect, TIMINGS, None, health, outcomes)  # type: ignore[arg-type]


def _state() -> WorkerState:
    worker: Any = SimpleNamespace(
        name="w", table=None, eligible_query=lambda: None, task=lambda claim, row=None: claim
    )
    backoff = PollBackoff(TIMINGS.poll_seconds, TIMINGS.max_poll_seconds)
    return WorkerState(worker, _Executor(), backoff, discovery=_NoDiscovery())  # type: ignore[arg-type]


def _waits(results: list[list[Claim]]) -> list[float]:
    dialect = _Dialect()
    dialect.results = list(results)
    polls, state = _polls(dialect), _state()
    waits = []
    for _ in results:
        polls.poll(state, NOW)
        assert state.polled_at == NOW  # a result's look again counts from it
        waits.append(state.next_poll - NOW)
    return waits


def test_a_claim_that_skipped_held_records_looks_again_soon_and_backs_off() -> None:
    held = Claims.of((), skipped=3)
    assert _waits([held, held, held]) == pytest.approx(
        [CONTENDED_RETRY_SECONDS, 2 * CONTENDED_RETRY_SECONDS, 4 * CONTENDED_RETRY_SECONDS]
    )


def test_an_empty_claim_that_skipped_nothing_waits_for_the_poll() -> None:
    assert _waits([Claims(), []]) == pytest.approx([TIMINGS.poll_seconds, 2 * TIMINGS.poll_seconds])


def test_a_claim_without_skips_ends_the_contention_backoff() -> None:
    held, taken = Claims.of((), skipped=1), Claims.of([Claim(1, 1, 1, 0, 0)])
    assert _waits([held, held, taken, held]) == pytest.approx(
        [
            CONTENDED_RETRY_SECONDS,
            2 * CONTENDED_RETRY_SECONDS,
            0.0,  # it claimed: the next poll is now
            CONTENDED_RETRY_SECONDS,
        ]
    )


def test_a_skipping_claim_keeps_the_worker_from_probing() -> None:
    dialect = _Dialect()
    dialect.results = [Claims.of((), skipped=1)]
    polls, state = _polls(dialect), _state()
    polls.poll(state, NOW)
    assert not state.discovery.idle, "records are there: the next poll must claim"
