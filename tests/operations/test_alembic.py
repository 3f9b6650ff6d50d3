"""Migrations: Alembic autogenerate sees the worker tables, and an old shape is refused.

Worker tables live in the source model's MetaData, so an application that generates
its migrations from that MetaData gets dbworker's tables in the same migration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, Engine, MetaData, Table, create_engine, inspect
from sqlalchemy.orm import sessionmaker

from dbworker import ConfigurationError, Coordinator

from . import app

WORKER = "documents"
TABLE = f"dbworker_{WORKER}"
#: The coordinator registry, which lives beside the worker tables.
REGISTRY = "dbworker_coordinators"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    app.DocumentBase.metadata.create_all(
        engine, tables=[app.DocumentBase.metadata.tables[app.Document.__tablename__]]
    )
    yield engine
    engine.dispose()


def coordinator_for(engine: Engine, url: str) -> Coordinator:
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    coordinator.transactional_worker(name=WORKER, source=app.Document)(app.process_document)
    return coordinator


def differences(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), app.DocumentBase.metadata))


def changed_tables(diff: list[Any]) -> set[str]:
    """The tables an autogenerate diff touches (entries are tuples, or lists of them)."""
    names = set()
    for entry in diff:
        for change in entry if isinstance(entry, list) else [entry]:
            subject = change[1] if change[0] in ("add_table", "remove_table") else None
            if subject is not None:
                names.add(subject.name)
            elif change[0] in ("add_index", "remove_index"):
                names.add(change[1].table.name)
            else:
                names.add(change[2])  # modify_*/add_column: (op, schema, table, ...)
    return names


def test_autogenerate_sees_the_worker_table(engine: Engine, database_url: str) -> None:
    coordinator = coordinator_for(engine, database_url)
    assert TABLE in app.DocumentBase.metadata.tables
    assert REGISTRY in app.DocumentBase.metadata.tables

    diff = differences(engine)
    added = [
        entry[1].name for entry in diff if isinstance(entry, tuple) and entry[0] == "add_table"
    ]
    assert sorted(added) == [REGISTRY, TABLE]
    # Nothing else: the application's own table is in step with the database.
    assert changed_tables(diff) == {REGISTRY, TABLE}, diff

    coordinator.create_worker_tables()
    assert differences(engine) == []


def test_older_table_shape_is_refused(engine: Engine, database_url: str) -> None:
    coordinator = coordinator_for(engine, database_url)
    current = app.DocumentBase.metadata.tables[TABLE]
    dropped = ("owner_pid", "traceback")
    # The table as an older version (or a hand-written migration) might have made it.
    old = Table(
        TABLE,
        MetaData(),
        *(
            Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in current.columns
            if c.name not in dropped
        ),
    )
    old.create(engine)

    with pytest.raises(ConfigurationError) as raised:
        coordinator.create_worker_tables()
    message = str(raised.value)
    assert TABLE in message and "missing columns owner_pid, traceback" in message
    # Creating is idempotent, not a migration: the old table is left as it was.
    assert {c["name"] for c in inspect(engine).get_columns(TABLE)} == {c.name for c in old.columns}

    with pytest.raises(ConfigurationError, match="missing columns owner_pid, traceback"):
        coordinator.start()
    assert not coordinator.running
