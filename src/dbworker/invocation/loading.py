"""How the source row becomes the mapped instance a handler receives.

The handler gets what ``session.get(Source, key)`` would give it: an instance
persistent in its session, every column loaded, no history. The ORM's query path
builds that at a cost (its compile state, loading context and row processing took
about as much client CPU as the round trip itself, ``benchmarks.child_path``). For a
plain mapping the same instance is made from the row read on the driver's cursor
(``dialects.driver_cursor``), by SQLAlchemy's documented route for an instance loaded
without its query: ``make_transient_to_detached``, then ``Session.add``. Anything the
ORM would do differently for a mapping (inheritance, eager loaders, deferred or
computed columns, load events, session hooks around queries) takes the ORM's path, so
the handler cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Table, bindparam, inspect, select
from sqlalchemy.orm import (
    ColumnProperty,
    Mapper,
    Relationship,
    Session,
    Synonym,
    make_transient_to_detached,
)

from ..dialects.driver_cursor import DriverForms, all_rows, first_row
from .session import listened

#: Relationship loaders that leave the attribute unloaded until it is read, as an
#: instance made from the row leaves it; any other loader fills it during the load.
_LOADED_WHEN_READ = frozenset({"select", True, "raise", "raise_on_sql", "write_only", "dynamic"})
#: Session hooks that see loads: with one listening, only the ORM's load is the same.
_SESSION_HOOKS = ("do_orm_execute", "loaded_as_persistent", "detached_to_persistent")
#: Instance events a load fires (``load`` also runs ``@reconstructor`` methods).
_INSTANCE_HOOKS = ("load", "refresh", "expire")

_KEY = "dbworker_source_id"
_KEYS = "dbworker_source_ids"


class SourceLoader:
    """Loads rows of one mapped class by primary key, built once per process."""

    def __init__(self, source: type[Any], pk: ColumnElement[Any]) -> None:
        mapper = inspect(source)
        self._orm = select(source).where(pk == bindparam(_KEY))
        columns = plain_columns(mapper)
        self._manager = mapper.class_manager
        self._direct = None if columns is None else select(*columns).where(pk == bindparam(_KEY))
        self._keys = [] if columns is None else [_attribute(mapper, c) for c in columns]
        self._driver = DriverForms()
        #: Several rows by key in one statement (``load_many``): one per power of two of
        #: keys (``_many_for``), and where the key is among the columns.
        self._columns = columns
        self._pk = pk
        self._many: dict[int, Any] = {}
        self._key_at = 0 if columns is None else [c.key for c in columns].index(str(pk.key))

    @property
    def direct(self) -> bool:
        """Whether rows of this mapping are loaded without the ORM's query path."""
        return self._direct is not None

    def load(self, session: Session, source_id: Any, bind: Connection | None = None) -> Any:
        """The row as ``session`` holds it, or None when the row is gone."""
        params = {_KEY: source_id}
        arguments = None if bind is None else {"bind": bind}
        if not self._direct_for(session):
            return session.execute(self._orm, params, bind_arguments=arguments).scalar()
        assert self._direct is not None
        row = self._read(session.connection(bind_arguments=arguments), self._direct, params)
        return None if row is None else self._instance(session, row)

    def load_apart(self, session: Session, source_id: Any, read: Connection) -> Any:
        """``load``, reading on ``read`` (a connection of the database's own, where one
        statement reads consistently without a transaction) rather than in the session's
        transaction, which then begins with the handler's first statement."""
        driver = None
        if self._direct_for(session):
            driver = self._driver.get(read, "load", self._direct)
        if driver is None:
            instance = self.load(session, source_id, read)
            session.commit()  # ends the read transaction; the instance stays loaded
            return instance
        row = first_row(read, driver, {_KEY: source_id}, alone=True)
        return None if row is None else self._instance(session, row)

    def load_many_apart(
        self, wanted: Sequence[tuple[Session, Any]], read: Connection
    ) -> list[Any] | None:
        """``load_apart`` for each (session, source id) of ``wanted``, in one statement
        (the instances, or None for a row that is gone); None when this mapping, or a
        session's hooks, need the ORM's load (each is then loaded by itself)."""
        found = self.load_many(wanted, read)
        if found is not None:
            read.rollback()  # no transaction left open on the reading connection
        return found

    def load_many(
        self, wanted: Sequence[tuple[Session, Any]], conn: Connection
    ) -> list[Any] | None:
        """``load`` for each (session, source id) of ``wanted``, in one statement on
        ``conn``, in its transaction (the instances, or None for a row that is gone);
        None when this mapping, or a session's hooks, need the ORM's load."""
        if self._columns is None or not all(self._direct_for(session) for session, _ in wanted):
            return None
        if not wanted:
            return []
        by_key = self.rows([source_id for _, source_id in wanted], conn)
        assert by_key is not None  # a mapping of plain columns
        found = []
        for session, source_id in wanted:
            row = by_key.get(source_id)
            found.append(None if row is None else self._instance(session, row))
        return found

    @property
    def plain(self) -> bool:
        """Whether its rows are read as plain columns (``rows``), not by the ORM's load."""
        return self._columns is not None

    def rows(self, keys: Sequence[Any], conn: Connection) -> dict[Any, tuple[Any, ...]] | None:
        """The rows of ``keys`` in one statement on ``conn``, by key, as ``instance``
        takes them (a key whose row is gone is missing); None if this mapping needs the
        ORM's load."""
        if self._columns is None:
            return None
        if not keys:
            return {}
        # On the driver's cursor, as a single row is: SQLAlchemy's execution of an
        # expanding IN was as much of a group's CPU as making the instances. The last
        # key is repeated up to the statement's count (a row is found once).
        count = 1 << (len(keys) - 1).bit_length()
        statement = self._many_for(count)
        params = {f"{_KEYS}_{i}": keys[min(i, len(keys) - 1)] for i in range(count)}
        driver = self._driver.get(conn, ("many", count), statement)
        if driver is None:
            rows: Sequence[Any] = conn.execute(statement, params).all()
        else:
            rows = all_rows(conn, driver, params)
        return {row[self._key_at]: tuple(row) for row in rows}

    def instance(self, session: Session, row: tuple[Any, ...]) -> Any | None:
        """The instance of ``row`` (from ``rows``), persistent in ``session``; None when
        the session needs the ORM's load (it holds instances, or someone listens)."""
        return self._instance(session, row) if self._direct_for(session) else None

    def _many_for(self, count: int) -> Any:
        statement = self._many.get(count)
        if statement is None:
            assert self._columns is not None
            keys = [bindparam(f"{_KEYS}_{i}", type_=self._pk.type) for i in range(count)]
            statement = self._many[count] = select(*self._columns).where(self._pk.in_(keys))
        return statement

    def _direct_for(self, session: Session) -> bool:
        return not (
            self._direct is None
            or len(session.identity_map)  # it may hold the row already: the ORM finds it
            or _hooked(session, self._manager.dispatch)
        )

    def _instance(self, session: Session, row: Any) -> Any:
        """The instance of ``row`` (in column order), persistent in ``session``."""
        instance = self._manager.new_instance()
        values = inspect(instance).dict
        for key, value in zip(self._keys, row, strict=True):
            values[key] = value
        make_transient_to_detached(instance)
        session.add(instance)
        return instance

    def _read(self, conn: Connection, statement: Any, params: dict[str, Any]) -> Any:
        """The row's values, on the driver's cursor unless someone watches statements."""
        driver = self._driver.get(conn, "load", statement)
        if driver is not None:
            return first_row(conn, driver, params)
        return conn.execute(statement, params).first()


def plain_columns(mapper: Mapper[Any]) -> list[Column[Any]] | None:
    """The table columns an instance of ``mapper`` is made from, or None when a load
    through the ORM would do more than read them (then only the ORM's load will do)."""
    table = mapper.local_table
    if (
        not isinstance(table, Table)
        or mapper.persist_selectable is not table
        or mapper.inherits is not None
        or mapper.polymorphic_on is not None
        or len(mapper.self_and_descendants) != 1
        or mapper.composites
    ):
        return None
    columns: list[Column[Any]] = []
    for prop in mapper.iterate_properties:
        if isinstance(prop, ColumnProperty):
            if prop.deferred or len(prop.columns) != 1:
                return None
            column = prop.columns[0]
            if not isinstance(column, Column) or column.table is not table:
                return None  # a column_property expression, or another table's column
            columns.append(column)
        elif isinstance(prop, Relationship):
            if prop.lazy not in _LOADED_WHEN_READ:
                return None
        elif not isinstance(prop, Synonym):
            return None
    return columns


def _attribute(mapper: Mapper[Any], column: Column[Any]) -> str:
    return mapper.get_property_by_column(column).key


def _hooked(session: Session, instance_events: Any) -> bool:
    # Checked at each load: listeners can be added to the Session class or the mapped
    # class at any time, and each must see the load as it would through the ORM.
    return listened(session.dispatch, _SESSION_HOOKS) or listened(instance_events, _INSTANCE_HOOKS)
