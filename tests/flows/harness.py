"""Test harness for flows that run real coordinators and handler processes.

Shared by tests/flows and tests/test_validation.py. Nothing here asserts on time:
``wait_for`` polls the database until a condition holds, with a deadline generous
enough for a loaded CI machine, and a timeout is reported as a failure that says
what was awaited and what was seen last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionStatus

from .app import APP_TABLES, Base, Item

T = TypeVar("T")

#: How long to wait for something that should take a second or two: generous, because
#: the tests share a small machine with other suites (load averages above 10 happen).
DEADLINE_SECONDS = 90.0
POLL_INTERVAL_SECONDS = 0.05

#: Fast polling so tests spend their time working, not sleeping between empty polls.
FAST = {"poll_seconds": 0.05, "max_poll_seconds": 0.5, "lease_seconds": 10}


def wait_for(
    condition: Callable[[], T],
    description: str,
    *,
    timeout: float = DEADLINE_SECONDS,
    diagnose: Callable[[], object] | None = None,
) -> T:
    """Call ``condition`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    last: T = condition()
    while not last:
        if time.monotonic() >= deadline:
            extra = f"; {diagnose()}" if diagnose is not None else ""
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {description}; "
                f"last seen: {last!r}{extra}"
            )
        time.sleep(POLL_INTERVAL_SECONDS)
        last = condition()
    return last


@dataclass
class Harness:
    """One test's database, application engine, session factory and coordinators."""

    url: str
    engine: Engine
    session_factory: sessionmaker[Session]
    journal: Path
    coordinators: list[Coordinator] = field(default_factory=list)

    def coordinator(self, url: str | None = None, **options: Any) -> Coordinator:
        coordinator = Coordinator(
            self.session_factory, database_url=url or self.url, **{**FAST, **options}
        )
        self.coordinators.append(coordinator)
        return coordinator

    # -- the application's data ------------------------------------------------------

    def insert(self, *ids: int, **values: Any) -> None:
        with self.session_factory.begin() as session:
            session.add_all(Item(id=i, journal=str(self.journal), **values) for i in ids)

    def update(self, item_id: int, **values: Any) -> None:
        # One UPDATE statement: on SQLite it takes the write lock at once, never
        # upgrading from a read (which can fail instead of waiting for a busy writer).
        with self.session_factory.begin() as session:
            session.execute(update(Item).where(Item.id == item_id).values(**values))

    def item(self, item_id: int) -> Item:
        with self.session_factory() as session:
            item = session.get_one(Item, item_id)
            session.expunge(item)
            return item

    def items(self) -> dict[int, Item]:
        with self.session_factory() as session:
            items = session.scalars(select(Item).order_by(Item.id)).all()
            session.expunge_all()
            return {item.id: item for item in items}

    def journal_lines(self) -> list[str]:
        if not self.journal.exists():
            return []
        return self.journal.read_text(encoding="utf-8").splitlines()

    def runs(self, worker: str, item_id: int) -> int:
        """How many invocations of ``worker`` began for ``item_id`` (committed or not)."""
        return self.journal_lines().count(f"{worker} {item_id}")

    # -- execution status --------------------------------------------------------------

    def status(self, coordinator: Coordinator, worker: str, item_id: int) -> ExecutionStatus | None:
        with self.session_factory() as session:
            return coordinator.execution_status(session, worker=worker, source_id=item_id)

    def state(self, coordinator: Coordinator, worker: str, item_id: int) -> dict[str, Any] | None:
        with self.session_factory() as session:
            return coordinator.workers[worker].state(session, item_id)

    def statuses(
        self, coordinator: Coordinator, worker: str, ids: Iterator[int] | list[int] | range
    ) -> dict[int, ExecutionStatus | None]:
        with self.session_factory() as session:
            return {
                i: coordinator.execution_status(session, worker=worker, source_id=i) for i in ids
            }

    def wait_for_status(
        self,
        coordinator: Coordinator,
        worker: str,
        ids: list[int] | range,
        status: ExecutionStatus,
    ) -> None:
        wanted = list(ids)

        def reached() -> bool:
            return all(s is status for s in self.statuses(coordinator, worker, wanted).values())

        wait_for(
            reached,
            f"{worker} to reach {status.name} for items {wanted}",
            diagnose=lambda: (
                f"statuses {self.statuses(coordinator, worker, wanted)}, "
                f"health {coordinator.health()}, records {self.records(worker)}"
            ),
        )

    def records(self, worker: str) -> list[tuple[Any, ...]]:
        """The raw execution records of ``worker``, for failure messages only."""
        query = text(
            "SELECT source_id, status, token, attempts, crashes, not_before, lease_expires_at"
            f" FROM dbworker_{worker} ORDER BY source_id"
        )
        try:
            with self.engine.connect() as conn:
                return [tuple(row) for row in conn.execute(query)]
        except Exception as exc:  # a diagnosis must not hide the original failure
            return [("cannot read records", repr(exc))]

    def close(self) -> None:
        for coordinator in self.coordinators:
            # A bounded stop: a test that failed mid-run must not hang its teardown.
            coordinator.stop(timeout=10)
        self.engine.dispose()


@contextmanager
def harness(database_url: str, tmp_path: Path) -> Iterator[Harness]:
    """The application's tables in an empty database, and a harness around them."""
    engine = create_engine(database_url)
    Base.metadata.create_all(engine, tables=APP_TABLES)
    # expire_on_commit=False: tests read attributes of rows after their session ends.
    session_factory = sessionmaker(engine, expire_on_commit=False)
    h = Harness(database_url, engine, session_factory, tmp_path / "journal.txt")
    try:
        yield h
    finally:
        h.close()
