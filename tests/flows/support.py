"""Test harness for flows that run real coordinators and handler processes.

Shared by tests/flows and tests/test_validation.py. Nothing here asserts on time:
``waiting.wait_until`` polls the database until a condition holds, with a deadline generous
enough for a loaded CI machine, and a timeout is reported as a failure that says
what was awaited and what was seen last.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator
from execution_reads import ExecutionReads

from .app import APP_TABLES, Base, Item

T = TypeVar("T")

#: Fast polling so tests spend their time working, not sleeping between empty polls.
FAST = {"poll_seconds": 0.05, "max_poll_seconds": 0.5, "lease_seconds": 10}


@dataclass
class Harness(ExecutionReads):
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

    def diagnosis(self, worker: str) -> str:
        return f", records {self.records(worker)}"

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
