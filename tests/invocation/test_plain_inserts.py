"""A parting's writes without the ORM's unit of work (``plain_inserts.py``): only where
nothing would differ from the ORM's flush, with the same rows; the partings of a batch
that only insert go in one statement (every database that ends together), and a
mapping someone listens on takes the ORM's flush."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import JSON, Engine, ForeignKey, Integer, String, event, func
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from dbworker.invocation.plain_inserts import PlainInserts

from .test_endings_together import _skip_alone, run_together
from .test_group import GroupEffect, rig  # noqa: F401  (the fixture)


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "plain_notes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    text: Mapped[str | None] = mapped_column(String(20))
    kind: Mapped[str] = mapped_column(String(20), default="plain")
    stamp: Mapped[str | None] = mapped_column(String(20), server_default="now")


class Parent(Base):
    __tablename__ = "plain_parents"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    children: Mapped[list[Child]] = relationship()


class Child(Base):
    __tablename__ = "plain_children"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent_id: Mapped[int] = mapped_column(ForeignKey("plain_parents.id"))


class Document(Base):
    __tablename__ = "plain_documents"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[Any] = mapped_column(JSON(none_as_null=False))


def test_new_objects_of_a_plain_mapping_become_the_rows_the_orm_would_write() -> None:
    session = Session()
    session.add(Note(text="a"))
    session.add(Note(text=None, kind="other"))
    session.add(Note())
    planned = PlainInserts().rows(session)
    assert planned is not None
    statement, rows = planned
    assert statement.table is Note.__table__
    # The key left to its autoincrement, a default or server default to the database,
    # an unset column without one written as NULL.
    assert rows == [{"text": "a"}, {"text": None, "kind": "other"}, {"text": None}]


def _with(*objects: Any) -> Session:
    session = Session()
    session.add_all(objects)
    return session


@pytest.mark.parametrize(
    "case",
    [
        "nothing new",
        "two mappings",
        "a relationship",
        "a type that writes None",
        "a SQL expression",
        "a session listener",
        "a mapper listener",
    ],
)
def test_anything_the_orm_would_do_differently_takes_its_flush(case: str) -> None:
    listeners: list[tuple[Any, str, Any]] = []
    if case == "nothing new":
        session = Session()
    elif case == "two mappings":
        session = _with(Note(text="a"), Child(id=1, parent_id=1))
    elif case == "a relationship":
        session = _with(Parent(id=1))
    elif case == "a type that writes None":
        session = _with(Document(id=1, body=None))
    elif case == "a SQL expression":
        session = _with(Note(text=func.lower("A")))
    elif case == "a session listener":
        session = _with(Note(text="a"))
        listeners.append((session, "before_flush", lambda *_: None))
    else:
        session = _with(Note(text="a"))
        listeners.append((Note, "before_insert", lambda *_: None))
    for target, name, listener in listeners:
        event.listen(target, name, listener)
    try:
        assert PlainInserts().rows(session) is None
    finally:
        for target, name, listener in listeners:
            event.remove(target, name, listener)


def test_a_modified_or_deleted_object_takes_the_orms_flush() -> None:
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(Note(id=1, text="a"))
    with Session(engine) as session:
        note = session.get(Note, 1)
        assert note is not None
        session.add(Note(text="b"))
        note.text = "changed"
        assert PlainInserts().rows(session) is None
        session.rollback()
        session.delete(session.get(Note, 1))
        session.add(Note(text="b"))
        assert PlainInserts().rows(session) is None


@pytest.fixture
def inserts() -> Iterator[list[str]]:
    """The INSERT statements into ``group_effects`` sent from now on."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO GROUP_EFFECTS"):
            sent.append(statement)

    event.listen(Engine, "before_cursor_execute", seen)
    yield sent
    event.remove(Engine, "before_cursor_execute", seen)


def test_a_batchs_plain_inserts_go_in_one_statement(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    inserts: list[str],
) -> None:
    setup = rig(["ok"] * 6)
    _skip_alone(setup)
    _, batches, _ = run_together(setup, monkeypatch)
    assert setup.effects() == dict.fromkeys(range(1, 7), 1)
    assert setup.finished_count() == 6
    grouped = [b for b in batches if len(b) > 1]
    assert grouped, batches
    # One statement per batch (a lone ending's included), not one per ending.
    assert len(inserts) <= len(batches) < 6, (inserts, batches)


def test_a_mapping_someone_listens_on_takes_the_orms_flush(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    inserts: list[str],
) -> None:
    setup = rig(["ok"] * 4)
    _skip_alone(setup)
    heard: list[int] = []

    def before_insert(_mapper: Any, _conn: Any, target: GroupEffect) -> None:
        heard.append(target.item_id)

    event.listen(GroupEffect, "before_insert", before_insert)
    try:
        run_together(setup, monkeypatch)
    finally:
        event.remove(GroupEffect, "before_insert", before_insert)
    assert sorted(heard) == [1, 2, 3, 4], "the ORM's flush ran for each"
    assert len(inserts) == 4
    assert setup.effects() == dict.fromkeys(range(1, 5), 1)
