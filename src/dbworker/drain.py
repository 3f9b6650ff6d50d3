"""Run every currently eligible item to completion, synchronously, in this process.

For application tests (like Celery's eager mode or Oban's drain_queue): no
processes, no threads, no waiting. Workers take turns, so an item that a first
worker finishes becomes eligible for a dependent worker in the same drain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from .core.errors import DBWorkerError
from .dialects import Dialect, Owner
from .events import Events
from .executors import Runner
from .scheduling.discovery import repeat_while_adding
from .scheduling.endings import CLAIMED, ClaimedItem, Endings
from .worker import Registration

#: A handler that always returns Unfinished() would otherwise drain forever.
DEFAULT_MAX_INVOCATIONS = 10_000


@dataclass(frozen=True, slots=True)
class DrainedItem:
    worker: str
    source_id: Any
    #: "finished", "unfinished", "failed", "retrying", "lost" or "crashed".
    outcome: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain ran, in order."""

    items: tuple[DrainedItem, ...] = field(default_factory=tuple)

    def counts(self) -> dict[str, Counter[str]]:
        """Outcomes per worker: ``{"process": Counter({"finished": 3, "failed": 1})}``."""
        counts: dict[str, Counter[str]] = {}
        for item in self.items:
            counts.setdefault(item.worker, Counter())[item.outcome] += 1
        return counts

    def __len__(self) -> int:
        return len(self.items)


def drain(
    engine: Engine,
    dialect: Dialect,
    runner: Runner,
    workers: Sequence[Registration],
    lease_seconds: float,
    max_invocations: int = DEFAULT_MAX_INVOCATIONS,
    events: Events | None = None,
) -> DrainReport:
    owner = Owner.current()
    items: list[DrainedItem] = []

    def write(_: str, apply: Callable[[Connection], object], __: dict[str, Any] | None) -> None:
        # No outbox: a database error ends the drain, as any error of a test would.
        with engine.begin() as conn:
            apply(conn)

    endings = Endings(dialect, write, events)
    for worker in workers:
        with engine.begin() as conn:
            repeat_while_adding(lambda: dialect.sweep(conn, worker.table))  # noqa: B023
    progressed = True
    while progressed:
        progressed = False
        for worker in workers:
            with engine.begin() as conn:
                dialect.discover(conn, worker.table)
                claims = dialect.claim(
                    conn,
                    worker.table,
                    worker.eligible_query(),
                    worker.concurrency,
                    lease_seconds,
                    owner,
                )
            for claim in claims:
                if len(items) >= max_invocations:
                    raise DBWorkerError(
                        f"drain() stopped after {max_invocations} invocations; does a handler "
                        "keep returning Unfinished() without a delay?"
                    )
                progressed = True
                item = ClaimedItem(
                    worker.name, worker.table, claim.source_id, claim.token, claim.attempts
                )
                if not endings.vanished(item, claim, worker.max_crashes):
                    items.append(DrainedItem(worker.name, claim.source_id, "failed", VANISHED))
                    continue
                endings.conclude(item, CLAIMED, recorded=True)
                result = runner.run(worker.task(claim))
                outcome = endings.result(
                    item, result, crashes=claim.crashes, max_crashes=worker.max_crashes
                )
                items.append(DrainedItem(worker.name, claim.source_id, outcome.value, result.error))
    return DrainReport(tuple(items))


#: What a drained item whose holders vanished too often reports (``Ending.VANISHED``).
VANISHED = "its holder vanished too often (lease expired without renewal); gave up"
