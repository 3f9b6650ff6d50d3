"""A small application for the flow tests: models and handlers at module scope.

Handler processes import this module by name (handlers are pickled by reference),
so nothing here may depend on test-local state. Each handler appends a line to the
item's ``journal`` file when it starts: that side effect lives outside the
handler's transaction, so tests can count invocations even of runs whose database
writes were rolled back.
"""

from __future__ import annotations

import contextlib
import time

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Finished, HandlerContractError, Outcome, Unfinished


class Base(DeclarativeBase):
    pass


class Item(Base):
    """The source model of every flow test."""

    __tablename__ = "flow_item"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    #: Invocations whose transaction committed (rolled back with a failed run).
    invocations: Mapped[int] = mapped_column(Integer, default=0)
    #: How many times steps_handler returns Unfinished() before Finished().
    unfinished_times: Mapped[int] = mapped_column(Integer, default=0)
    #: One "B" per invocation that began, then "U" or "F" for how it ended.
    trace: Mapped[str] = mapped_column(String(200), default="")
    result: Mapped[str | None] = mapped_column(String(100))
    should_fail: Mapped[bool] = mapped_column(Boolean, default=False)
    prepared: Mapped[bool] = mapped_column(Boolean, default=False)
    published: Mapped[bool] = mapped_column(Boolean, default=False)
    #: What publish_handler saw of ``prepared`` when it ran.
    saw_prepared: Mapped[bool | None] = mapped_column(Boolean)
    sleep_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    journal: Mapped[str | None] = mapped_column(String(1000))


class Output(Base):
    """A second table handlers write to, to show writes beyond the source row commit."""

    __tablename__ = "flow_output"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("flow_item.id"))
    worker: Mapped[str] = mapped_column(String(50))


class Other(Base):
    """A model that is not any worker's source (for eligible-validation tests)."""

    __tablename__ = "flow_other"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)


class Pair(Base):
    """A model with a composite primary key, which cannot be a source."""

    __tablename__ = "flow_pair"

    left: Mapped[int] = mapped_column(Integer, primary_key=True)
    right: Mapped[int] = mapped_column(Integer, primary_key=True)


APP_TABLES: list[Table] = [Base.metadata.tables[m.__tablename__] for m in (Item, Output, Other)]


def journal(source: Item, worker: str) -> None:
    write_journal(source.journal, worker, source.id)


def write_journal(path: str | None, worker: str, item_id: int) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(f"{worker} {item_id}\n")


# -- handlers --------------------------------------------------------------------------


def finish_handler(source: Item, session: Session) -> Finished:
    journal(source, "process")
    source.invocations += 1
    source.result = f"done {source.id}"
    session.add(Output(item_id=source.id, worker="process"))
    return Finished()


def steps_handler(source: Item, session: Session) -> Outcome:
    journal(source, "steps")
    source.trace += "B"
    source.invocations += 1
    if source.invocations <= source.unfinished_times:
        source.trace += "U"
        return Unfinished()
    source.trace += "F"
    source.result = f"done {source.id}"
    return Finished()


def flaky_handler(source: Item, session: Session) -> Finished:
    journal(source, "flaky")
    source.invocations += 1
    source.result = "partial"
    session.add(Output(item_id=source.id, worker="flaky"))
    session.flush()  # the writes reach the database before the failure, then roll back
    if source.should_fail:
        raise ValueError(f"flaky item {source.id} failed on purpose")
    source.result = f"done {source.id}"
    return Finished()


def prepare_handler(source: Item, session: Session) -> Finished:
    journal(source, "prepare")
    if source.should_fail:
        raise RuntimeError(f"cannot prepare item {source.id}")
    source.prepared = True
    return Finished()


def publish_handler(source: Item, session: Session) -> Finished:
    journal(source, "publish")
    source.saw_prepared = source.prepared
    source.published = True
    return Finished()


def slow_handler(source: Item, session: Session) -> Finished:
    # Copy what is needed, then release the read transaction while sleeping (as the
    # README advises for long computations), so the database is not held meanwhile.
    seconds, item_id, path = source.sleep_seconds, source.id, source.journal
    session.rollback()
    write_journal(path, "slow", item_id)
    time.sleep(seconds)
    session.get_one(Item, item_id).result = f"slept {item_id}"
    return Finished()


# -- handlers that break the contract (tests/test_validation.py) ----------------------------


def returns_none_handler(source: Item, session: Session) -> None:
    journal(source, "bad")
    source.result = "written"


def returns_value_handler(source: Item, session: Session) -> object:
    journal(source, "bad")
    source.result = "written"
    # Returning the class instead of an instance is an easy mistake.
    return {1: Finished, 2: True, 3: "finished"}.get(source.id, 0)


def commit_handler(source: Item, session: Session) -> Finished:
    journal(source, "bad")
    source.result = "written"
    session.add(Output(item_id=source.id, worker="bad"))
    session.flush()  # the writes reach the database, so the rollback has work to do
    session.commit()
    return Finished()


def commit_swallowed_handler(source: Item, session: Session) -> Finished:
    journal(source, "bad")
    source.result = "written"
    # A handler hiding its mistake must still not get its writes through.
    with contextlib.suppress(HandlerContractError):
        session.commit()
    return Finished()


def close_handler(source: Item, session: Session) -> Finished:
    journal(source, "bad")
    source.result = "written"
    session.close()
    return Finished()
