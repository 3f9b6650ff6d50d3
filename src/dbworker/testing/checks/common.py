"""What several conformance checks share: the expected rows, and how a check waits,
skips and reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from ...core.policy import Ending, decide
from ...dialects import WorkerTable
from ..harness import DialectFactory, Harness
from ..models import ITEMS, Item
from ..report import NotApplicable

#: A check: it raises AssertionError when the dialect breaks the contract, and
#: ``NotApplicable`` when a capability flag says the behaviour cannot happen.
Check = Callable[[DialectFactory, str], None]
T = TypeVar("T")

ALL_ITEMS = [row.id for row in ITEMS]

#: How a stopping coordinator releases an item (not a crash).
STOPPED = decide(Ending.STOPPED)


def without_waiting(what: str, call: Callable[[], T]) -> T:
    """Run ``call``; a lock wait (bounded by the actors' lock timeout) is a failure."""
    try:
        return call()
    except DBAPIError as exc:
        raise AssertionError(f"{what} waited for a lock or failed: {exc.orig!r}") from exc


def skip_with_one_writer(h: Harness, what: str) -> None:
    if not h.dialect.supports_concurrent_claims:
        raise NotApplicable(
            "a database without concurrent claims has one writer at a time: every "
            f"application write waits for the {what}'s transaction, row locks or not"
        )


def note_of(h: Harness, item_id: int) -> str | None:
    with h.app_engine.connect() as conn:
        return conn.execute(select(Item.note).where(Item.id == item_id)).scalar_one()


def status_of(h: Harness, worker: WorkerTable, source_id: Any) -> str | None:
    record = h.record(worker, source_id)
    return None if record is None else record["status"]
