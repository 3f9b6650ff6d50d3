"""What the scheduler knows about each worker: the claims it holds and when to look again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.timing import PollBackoff
from ..executors import Executor
from ..worker import Registration
from .discovery import DiscoverySchedule

#: After a claim that took nothing because another transaction held claimable records,
#: the next look comes this soon, doubling while it recurs.
CONTENDED_RETRY_SECONDS = 0.01


@dataclass(slots=True)
class HeldClaim:
    """A claim this coordinator holds."""

    token: int
    attempt: int
    failures: int
    started: float
    #: The record's crash count as claimed: a takeover of the item raises it.
    crashes: int = 0


@dataclass(slots=True)
class WorkerState:
    """One worker's scheduling state."""

    worker: Registration
    executor: Executor
    backoff: PollBackoff
    next_poll: float = 0.0
    #: When its last poll began.
    polled_at: float = 0.0
    held: dict[Any, HeldClaim] = field(default_factory=dict)
    #: Runs that completed in the database (Unfinished, a retry) and were claimed
    #: again before their result was read, by (source_id, token).
    completing: dict[tuple[Any, int], HeldClaim] = field(default_factory=dict)
    discovery: DiscoverySchedule = field(default_factory=DiscoverySchedule)
    #: The wait after a claim that found claimable records locked by another
    #: transaction (``Claims.skipped``) and took nothing: that lock is usually one
    #: short transaction, so look again soon, backing off (up to the poll backoff's
    #: longest wait) while it lasts.
    contention: PollBackoff = field(init=False)

    def __post_init__(self) -> None:
        self.contention = PollBackoff(CONTENDED_RETRY_SECONDS, self.backoff.maximum)

    def look_again(self, now: float, *, soon: bool) -> None:
        """A result came in that may have made items of this worker eligible: poll at
        once if ``soon``, else no later than ``poll_seconds`` after the last poll (the
        rows a handler wrote are new work, found as a busy worker finds it)."""
        self.backoff.reset()
        self.next_poll = min(self.next_poll, now if soon else self.polled_at + self.backoff.initial)

    def poll_now(self, now: float) -> None:
        """Poll at once, discovering first (a wake-up named this worker, or new ticks
        were made). The backoff is left as it is: a wake-up that finds nothing
        (another coordinator was faster) must not restart polling at its shortest
        interval."""
        self.next_poll = min(self.next_poll, now)
        self.discovery.ran_short(now)
        self.discovery.idle = False

    def item(self, source_id: Any, attempt: int | str) -> tuple[str, dict[str, Any]]:
        """How log records name an item: as attributes (``extra``), which formats and
        log pipelines use (see ``dbworker.logs``); the message only says "item"."""
        return "item", {"worker": self.worker.name, "source_id": source_id, "attempt": attempt}
