"""The instance a handler receives is the one ``session.get`` would give, whichever
way it was loaded.

Plain mappings are made from a Core row (``invocation.loading``); every mapping the
ORM loads differently (inheritance, eager relationships, deferred or
computed columns, composites) and every load someone listens to must go through the
ORM's query. Each case compares the loader's instance with ``session.get``'s on every
database: state, identity, values and their types, history, lazy loads, writes.
"""

from __future__ import annotations

import datetime
import decimal
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from sqlalchemy import (
    JSON,
    Engine,
    ForeignKey,
    Integer,
    Numeric,
    String,
    TypeDecorator,
    create_engine,
    event,
    exc,
    func,
    inspect,
)
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    column_property,
    composite,
    deferred,
    mapped_column,
    reconstructor,
    relationship,
    synonym,
)

from dbworker.dialects import for_url
from dbworker.dialects.base import READ_ONLY_OPTION
from dbworker.invocation.loading import SourceLoader


class Base(DeclarativeBase):
    pass


class Shouted(TypeDecorator[str]):
    """A type whose stored form differs from its Python form, both ways."""

    impl = String(40)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else value.upper()

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else f"{value.lower()}!"


class Kind(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Customer(Base):
    __tablename__ = "load_customers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(40))


class Order(Base):
    __tablename__ = "load_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    label: Mapped[str] = mapped_column("label_text", String(40))  # attribute != column name
    amount: Mapped[decimal.Decimal] = mapped_column(Numeric(10, 2))
    placed: Mapped[datetime.datetime]
    kind: Mapped[Kind]
    payload: Mapped[Any] = mapped_column(JSON)
    note: Mapped[str | None] = mapped_column(Shouted)
    customer_id: Mapped[int] = mapped_column(ForeignKey("load_customers.id"))
    customer: Mapped[Customer] = relationship()
    lines: Mapped[list[Line]] = relationship(back_populates="order")
    title = synonym("label")


class Line(Base):
    __tablename__ = "load_lines"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    order_id: Mapped[int] = mapped_column(ForeignKey("load_orders.id"))
    order: Mapped[Order] = relationship(back_populates="lines")


class Remade(Base):
    """Rebuilt on load by a ``@reconstructor``: a load event of its own."""

    __tablename__ = "load_remade"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(40))

    @reconstructor
    def _remade(self) -> None:
        self.remade = True


# -- mappings the ORM loads differently: each must take its query -------------------------


class Animal(Base):
    __tablename__ = "load_animals"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    type: Mapped[str] = mapped_column(String(20))
    __mapper_args__ = {"polymorphic_on": "type", "polymorphic_identity": "animal"}  # noqa: RUF012


class Dog(Animal):  # single-table inheritance: the row's type picks the class
    __mapper_args__ = {"polymorphic_identity": "dog"}  # noqa: RUF012


class Joined(Base):
    __tablename__ = "load_joined"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    type: Mapped[str] = mapped_column(String(20))
    __mapper_args__ = {"polymorphic_on": "type", "polymorphic_identity": "base"}  # noqa: RUF012


class JoinedChild(Joined):  # joined inheritance: two tables
    __tablename__ = "load_joined_child"
    id: Mapped[int] = mapped_column(ForeignKey("load_joined.id"), primary_key=True)
    extra: Mapped[str] = mapped_column(String(20))
    __mapper_args__ = {"polymorphic_identity": "child"}  # noqa: RUF012


class Deferred(Base):
    __tablename__ = "load_deferred"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    big: Mapped[str] = deferred(mapped_column(String(40)))


class Computed(Base):
    __tablename__ = "load_computed"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(40))
    shout = column_property(func.upper(name))


@dataclass
class Point:
    x: int
    y: int


class Located(Base):
    __tablename__ = "load_located"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    x: Mapped[int]
    y: Mapped[int]
    point: Mapped[Point] = composite("x", "y")


def _eager(lazy: Literal["joined", "selectin"]) -> Any:
    """A mapping whose customer the ORM loads with the row, by ``lazy``'s loader."""
    return type(
        f"Eager_{lazy}",
        (Base,),
        {
            "__tablename__": f"load_eager_{lazy}",
            "id": mapped_column(Integer, primary_key=True, autoincrement=False),
            "customer_id": mapped_column(Integer, ForeignKey("load_customers.id")),
            "customer": relationship(Customer, lazy=lazy),
        },
    )


EagerJoined = _eager("joined")
EagerSelectin = _eager("selectin")


THROUGH_ORM: list[type[Any]] = [
    Animal,
    Dog,
    Joined,
    JoinedChild,
    Deferred,
    Computed,
    Located,
    EagerJoined,
    EagerSelectin,
]

PLACED = datetime.datetime(2026, 5, 17, 8, 30, 15)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all([Customer(id=1, name="ada"), Customer(id=2, name="bob")])
        session.flush()
        session.add(
            Order(
                id=7,
                label="seven",
                amount=decimal.Decimal("12.50"),
                placed=PLACED,
                kind=Kind.LARGE,
                payload={"a": [1, 2], "b": None},
                note="Quiet",
                customer_id=2,
            )
        )
        session.flush()
        session.add_all([Line(id=1, order_id=7), Line(id=2, order_id=7)])
        session.add(Remade(id=1, name="r"))
        session.add_all([Animal(id=1), Dog(id=2), Joined(id=1), JoinedChild(id=2, extra="e")])
        session.add_all([Deferred(id=1, big="b"), Computed(id=1, name="c")])
        session.add(Located(id=1, x=3, y=4))
        session.add_all([EagerJoined(id=1, customer_id=1), EagerSelectin(id=1, customer_id=1)])
    try:
        yield engine
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def loader_for(source: type[Any]) -> SourceLoader:
    return SourceLoader(source, inspect(source).primary_key[0])


def _picture(instance: Any) -> dict[str, Any]:
    """What a handler can observe of an instance right after its load."""
    state = inspect(instance)
    columns = {attr.key: getattr(instance, attr.key) for attr in state.mapper.column_attrs}
    return {
        "class": type(instance),
        "persistent": state.persistent,
        "identity_key": state.identity_key,
        "modified": state.modified,
        "expired": set(state.expired_attributes),
        "unloaded": set(state.unloaded),
        "columns": columns,
        "types": {key: type(value) for key, value in columns.items()},
    }


def _compare(engine: Engine, source: type[Any], key: Any) -> Any:
    """The loader's instance, after checking it against ``session.get``'s."""
    with Session(engine) as expected_session, Session(engine) as loaded_session:
        expected = expected_session.get(source, key)
        loaded = loader_for(source).load(loaded_session, key)
        assert loaded is not None and expected is not None
        # Before any attribute is read (reading could load what was missing).
        assert set(inspect(loaded).unloaded) == set(inspect(expected).unloaded)
        assert _picture(loaded) == _picture(expected)
        assert loaded_session.get(source, key) is loaded  # in the identity map
        assert not loaded_session.dirty and not loaded_session.new
        return loaded


def test_a_plain_mapping_is_made_from_its_row_as_the_orm_would_load_it(engine: Engine) -> None:
    assert loader_for(Order).direct
    loaded = _compare(engine, Order, 7)
    assert loaded.note == "quiet!" and loaded.kind is Kind.LARGE and loaded.placed == PLACED
    assert loaded.title == "seven"


def test_its_relationships_load_when_read_and_writes_flush(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        order = loader_for(Order).load(session, 7)
        assert order.customer.name == "bob"  # many-to-one, lazily
        assert sorted(line.id for line in order.lines) == [1, 2]  # one-to-many, lazily
        order.label = "changed"
        order.customer = session.get(Customer, 1)
        assert list(session.dirty) == [order]
        session.commit()
    with Session(engine) as session:
        again = session.get(Order, 7)
        assert again is not None and (again.label, again.customer_id) == ("changed", 1)


def test_a_row_that_is_gone_loads_as_none(engine: Engine) -> None:
    with Session(engine) as session:
        assert loader_for(Order).load(session, 404) is None


@pytest.mark.parametrize("source", THROUGH_ORM, ids=lambda source: source.__name__)
def test_mappings_the_orm_loads_differently_take_its_query(
    engine: Engine, source: type[Any]
) -> None:
    assert not loader_for(source).direct
    keys: dict[type[Any], int] = {Dog: 2, JoinedChild: 2}
    loaded = _compare(engine, source, keys.get(source, 1))
    if source is Animal:
        assert type(loaded) is Animal
    if source in (Dog, JoinedChild):
        assert type(loaded) is source


def test_a_subclass_row_loaded_through_its_base_is_the_subclass(engine: Engine) -> None:
    with Session(engine) as session:
        assert type(loader_for(Animal).load(session, 2)) is Dog
        assert type(loader_for(Joined).load(session, 2)) is JoinedChild


def test_a_reconstructor_runs(engine: Engine) -> None:
    with Session(engine) as session:
        assert loader_for(Remade).load(session, 1).remade is True


def test_a_load_listener_added_later_sees_the_load(engine: Engine) -> None:
    loader = loader_for(Order)  # built before anyone listened
    seen: list[Any] = []

    def on_load(target: Any, context: Any) -> None:
        seen.append(target)

    event.listen(Order, "load", on_load)
    try:
        with Session(engine) as session:
            order = loader.load(session, 7)
        assert seen == [order]
    finally:
        event.remove(Order, "load", on_load)


def test_session_hooks_around_queries_see_the_load(engine: Engine) -> None:
    seen: list[Any] = []

    def on_execute(state: Any) -> None:
        seen.append(state.statement)

    event.listen(Session, "do_orm_execute", on_execute)
    try:
        with Session(engine) as session:
            assert loader_for(Order).load(session, 7) is not None
        assert len(seen) == 1
    finally:
        event.remove(Session, "do_orm_execute", on_execute)


def test_statement_listeners_see_the_direct_load(engine: Engine) -> None:
    # A listener would miss a read on the driver's cursor: with one, the load goes
    # through SQLAlchemy's execution, which it sees.
    loader = loader_for(Order)
    with Session(engine) as session:
        assert loader.load(session, 7) is not None  # compiled on the driver first
    statements: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", spy)
    try:
        with Session(engine) as session:
            assert loader.load(session, 7) is not None
    finally:
        event.remove(engine, "before_cursor_execute", spy)
    assert len(statements) == 1 and "load_orders" in statements[0], statements


def test_the_direct_load_reads_on_the_drivers_cursor(engine: Engine) -> None:
    loader = loader_for(Order)
    with Session(engine) as session:
        assert loader.load(session, 7) is not None
    # Compiled for the driver (None would mean SQLAlchemy's execution, without a word).
    compiled = loader._driver.compiled()
    assert compiled and all(compiled), compiled


DROPPED = ("load_lines", "load_orders")


def test_a_driver_error_is_the_one_the_orm_load_raises(engine: Engine) -> None:
    loader = loader_for(Order)
    with Session(engine) as session:
        assert loader.load(session, 7) is not None  # compiled on the driver
    Base.metadata.drop_all(engine, tables=[Base.metadata.tables[t] for t in DROPPED])
    with Session(engine) as session, pytest.raises(exc.DBAPIError) as on_driver:
        loader.load(session, 7)
    with Session(engine) as session, pytest.raises(exc.DBAPIError) as through_orm:
        session.get(Order, 7)
    assert type(on_driver.value) is type(through_orm.value)
    assert type(on_driver.value.orig) is type(through_orm.value.orig)
    Base.metadata.create_all(engine)  # for the fixture's drop_all


def test_a_row_the_session_holds_already_is_that_instance(engine: Engine) -> None:
    with Session(engine) as session:
        held = session.get(Order, 7)
        assert held is not None
        held.label = "edited, not flushed"
        assert loader_for(Order).load(session, 7) is held
        assert held.label == "edited, not flushed"


@pytest.fixture
def handler_engine(engine: Engine, database_url: str) -> Iterator[Engine]:
    """An engine set up as a handler process's (where the dialect reads the row apart)."""
    dialect = for_url(database_url)
    if not dialect.source_read_apart:
        pytest.skip(f"{type(dialect).__name__} reads the source row in the handler's transaction")
    configured = create_engine(database_url)
    dialect.configure_engine(configured, handlers=True)
    try:
        yield configured
    finally:
        configured.dispose()


def _read_apart(engine: Engine, handler_engine: Engine, key: Any) -> tuple[Any, Any, bool]:
    """``load_apart``'s instance (in a session as a handler process makes it),
    ``session.get``'s, and whether the read connection was left in a transaction."""
    with Session(engine) as expected_session:
        expected = expected_session.get(Order, key)
        with (
            Session(handler_engine, expire_on_commit=False) as session,
            handler_engine.connect().execution_options(**{READ_ONLY_OPTION: True}) as read,
        ):
            loaded = loader_for(Order).load_apart(session, key, read)
            driver = read.connection.dbapi_connection
            left_open = read.in_transaction() or bool(getattr(driver, "in_transaction", True))
            picture = None if loaded is None else _picture(loaded)
            assert loaded is None or session.get(Order, key) is loaded  # in the identity map
        return picture, None if expected is None else _picture(expected), left_open


def test_a_row_read_apart_is_the_one_the_orm_loads_and_leaves_no_transaction(
    engine: Engine, handler_engine: Engine
) -> None:
    loaded, expected, left_open = _read_apart(engine, handler_engine, 7)
    assert loaded == expected and loaded is not None
    assert not left_open, "the read apart left a transaction open on its connection"
    assert _read_apart(engine, handler_engine, 404)[::2] == (None, False)


def test_a_watched_read_apart_goes_through_the_orm_and_ends_its_transaction(
    engine: Engine, handler_engine: Engine
) -> None:
    statements: list[str] = []

    def spy(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(handler_engine, "before_cursor_execute", spy)
    try:
        loaded, expected, left_open = _read_apart(engine, handler_engine, 7)
    finally:
        event.remove(handler_engine, "before_cursor_execute", spy)
    assert loaded == expected and loaded is not None
    assert not left_open
    assert sum("load_orders" in s for s in statements) == 1, statements


def test_the_handlers_writes_after_a_read_apart_commit(handler_engine: Engine) -> None:
    with (
        Session(handler_engine, expire_on_commit=False) as session,
        handler_engine.connect().execution_options(**{READ_ONLY_OPTION: True}) as read,
    ):
        order = loader_for(Order).load_apart(session, 7, read)
        order.label = "written after the read apart"
        session.commit()
    with Session(handler_engine) as session:
        again = session.get(Order, 7)
        assert again is not None and again.label == "written after the read apart"
