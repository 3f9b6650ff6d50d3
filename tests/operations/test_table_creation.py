"""``create_worker_tables()`` while another process creates the same tables.

Services started together (or, on Galera, a CREATE made on another node arriving
between this node's check and its own CREATE) race: the loser's CREATE fails because
the table now exists. It checks again and goes on; an error that no other process
explains is raised at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator
from executors.app import Base, Item, handle

WORKER = "creation_race"
REGISTRY = "dbworker_coordinators"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    Base.metadata.create_all(engine, tables=[Base.metadata.tables[Item.__tablename__]])
    yield engine
    engine.dispose()


def _coordinator(engine: Engine, url: str) -> Coordinator:
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    coordinator.transactional_worker(WORKER, Item)(handle)
    return coordinator


def _creates_registry(statement: str) -> bool:
    return statement.lstrip().startswith(f"CREATE TABLE {REGISTRY} ")


def test_tables_another_process_created_meanwhile(engine: Engine, database_url: str) -> None:
    coordinator = _coordinator(engine, database_url)
    other = create_engine(database_url)
    raced: list[str] = []

    def another_process_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if _creates_registry(statement) and not raced:
            raced.append(statement)
            Base.metadata.tables[REGISTRY].create(other)

    event.listen(engine, "before_cursor_execute", another_process_first)
    try:
        coordinator.create_worker_tables()
    finally:
        event.remove(engine, "before_cursor_execute", another_process_first)
        other.dispose()
    assert raced, "the other process created the registry between the check and the CREATE"
    names = set(inspect(engine).get_table_names())
    assert {REGISTRY, coordinator.workers[WORKER].execution_table.name} <= names


def test_a_failure_no_other_process_explains_is_raised(engine: Engine, database_url: str) -> None:
    coordinator = _coordinator(engine, database_url)
    tries: list[str] = []

    def broken(
        conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any
    ) -> tuple[str, Any]:
        if _creates_registry(statement):
            tries.append(statement)
            return "CREATE TABLE", parameters  # a syntax error, every time
        return statement, parameters

    event.listen(engine, "before_cursor_execute", broken, retval=True)
    try:
        with pytest.raises(DBAPIError):
            coordinator.create_worker_tables()
    finally:
        event.remove(engine, "before_cursor_execute", broken)
    assert len(tries) == 1, "not retried: nothing changed the tables meanwhile"
