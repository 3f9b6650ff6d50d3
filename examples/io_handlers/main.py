"""I/O-bound handlers, both kinds, as a type checker sees them (mypy checks this file).

``transactional_worker`` takes a ``def`` handler (a ``Session``) or an ``async def`` one
(an ``AsyncSession``) and returns it unchanged, types included: the handlers below stay
callable as they were defined, and a handler that takes the wrong session, or may
return something other than an outcome, is refused by the type checker.

Run: ``python -m io_handlers.main sqlite:////tmp/io_handlers.db`` from ``examples/``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sqlalchemy import String, create_engine, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import AsyncIO, Coordinator, Finished, Threads, Unfinished


class Base(DeclarativeBase):
    pass


class Page(Base):
    __tablename__ = "io_handlers_pages"

    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str] = mapped_column(String(200))
    fetched: Mapped[bool] = mapped_column(default=False)
    checked: Mapped[bool] = mapped_column(default=False)


async def fetch(page: Page, session: AsyncSession) -> Finished | Unfinished:
    """Many at once on one event loop: awaits its I/O (here a stand-in sleep)."""
    await asyncio.sleep(0.1)
    page.fetched = True
    return Finished()


def check(page: Page, session: Session) -> Finished:
    """Many at once on threads: a blocking call (here a stand-in sleep)."""
    time.sleep(0.1)
    page.checked = True
    return Finished()


def build(url: str) -> Coordinator:
    coordinator = Coordinator(sessionmaker(create_engine(url)), database_url=url)
    # The decorator returns each handler unchanged, and its type with it.
    fetching: Callable[[Page, AsyncSession], Awaitable[Finished | Unfinished]]
    fetching = coordinator.transactional_worker(
        "fetch", Page, lambda: select(Page).where(Page.url != ""), concurrency=20,
        executor=AsyncIO(),
    )(fetch)  # fmt: skip
    checking: Callable[[Page, Session], Finished]
    checking = coordinator.transactional_worker("check", Page, concurrency=20, executor=Threads())(
        check
    )
    assert fetching is fetch and checking is check
    return coordinator


if TYPE_CHECKING:
    # What the type checker refuses (each ignore is checked: mypy reports an unused one).

    async def wrong_session(page: Page, session: Session) -> Finished:
        return Finished()

    def no_outcome(page: Page, session: Session) -> None:
        pass

    def refused(coordinator: Coordinator) -> None:
        coordinator.transactional_worker("a", Page)(wrong_session)  # type: ignore[type-var]
        coordinator.transactional_worker("b", Page)(no_outcome)  # type: ignore[type-var]


if __name__ == "__main__":
    database_url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:////tmp/io_handlers.db"
    app = build(database_url)
    engine = create_engine(database_url)
    Base.metadata.create_all(engine)
    app.create_worker_tables()
    with Session(engine) as db, db.begin():
        db.add_all(Page(url=f"https://example.com/{n}") for n in range(100))
    print(app.drain())
