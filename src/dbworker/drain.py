"""Run every currently eligible item to completion, synchronously, in this process.

For application tests (like Celery's eager mode or Oban's drain_queue): no
processes, no threads, no waiting. Workers take turns, so an item that a first
worker finishes becomes eligible for a dependent worker in the same drain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from .core.errors import DBWorkerError
from .core.policy import failure
from .core.tasks import ErrorInfo, ResultKind
from .dialects import Dialect, Owner
from .executors import Runner
from .scheduling.discovery import repeat_while_adding
from .worker import Registration

#: A handler that always returns Unfinished() would otherwise drain forever.
DEFAULT_MAX_INVOCATIONS = 10_000


@dataclass(frozen=True, slots=True)
class DrainedItem:
    worker: str
    source_id: Any
    #: "finished", "unfinished", "failed", "retrying" or "lost".
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
) -> DrainReport:
    owner = Owner.current()
    items: list[DrainedItem] = []
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
                result = runner.run(worker.task(claim))
                outcome = result.kind
                if outcome is ResultKind.UNRECORDED:
                    error = ErrorInfo(result.error or "", result.error_type, result.traceback)
                    decision = failure(result.retry_delay)
                    with engine.begin() as conn:
                        dialect.record(
                            conn, worker.table, claim.source_id, claim.token, decision, error
                        )
                    outcome = (
                        ResultKind.FAILED if result.retry_delay is None else ResultKind.RETRYING
                    )
                items.append(DrainedItem(worker.name, claim.source_id, outcome.value, result.error))
                progressed = True
    return DrainReport(tuple(items))
