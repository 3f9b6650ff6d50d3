"""Fenced statements on the driver's cursor behave as through SQLAlchemy's execution.

On the database's clock a built-once fenced UPDATE runs on the driver's own cursor
(``dialects.driver_cursor``) unless someone watches statements. What SQLAlchemy's
path gave must still hold: the statement joins SQLAlchemy's transaction (begun for it
if there is none), the driver's errors are SQLAlchemy's exceptions, classified as
before, a connection the server dropped is invalidated, and listeners and ``echo``
see every statement.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, event, exc, select, text, update

from dbworker.dialects import for_url
from dbworker.testing import Harness
from dbworker.testing.models import Item
from server_sessions import drop_on_server, server_id


def _harness(database_url: str) -> Harness:
    h = Harness(lambda _clock: for_url(database_url), database_url)
    h.seed()
    h.discover(h.items)
    return h


def test_fenced_statements_have_a_driver_form_on_each_database(database_url: str) -> None:
    # Without one, every finish falls back to SQLAlchemy's execution without a word.
    with _harness(database_url) as h:
        token = h.claim_one(h.items, 1).token
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.items, 1, token)
        assert h.record(h.items, 1)["status"] == "finished"  # type: ignore[index]
        compiled = h.dialect._driver_forms.compiled()
        assert compiled and all(statement is not None for statement in compiled), compiled


def test_discovery_and_claims_run_on_the_driver_cursor(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A woken poll's discovery, its watermark and its claim: SQLAlchemy's execution around
    # discovery alone cost PostgreSQL's pickup about 0.6 ms (``ab_discovery_driver.json``).
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed(items=())
        conn = h.actor()
        with conn.begin():  # the first on a connection learns MySQL's binary log (once)
            h.dialect.discover_to_watermark(conn, h.items)
        h.add_items(1, 2, 3)

        def refused(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError("a discovery statement went through SQLAlchemy's execution")

        monkeypatch.setattr(Connection, "_execute_clauseelement", refused)
        for _ in range(2):  # new rows, then none (the watermark read after it)
            with conn.begin():
                h.dialect.discover_to_watermark(conn, h.items)
        claimed = h.claim(conn, h.items, select(Item).order_by(Item.id), 2)
        monkeypatch.undo()
        assert len(h.records(h.items)) == 3
        assert [c.source_id for c in claimed] == [1, 2]


def test_outside_a_transaction_the_statement_joins_one_begun_for_it(database_url: str) -> None:
    with _harness(database_url) as h:
        token = h.claim_one(h.items, 1).token
        conn = h.actor()
        assert not conn.in_transaction()
        assert h.dialect.finish(conn, h.items, 1, token)
        assert conn.in_transaction()  # so the caller's commit covers it
        conn.commit()
        conn.close()
        assert h.record(h.items, 1)["status"] == "finished"  # type: ignore[index]


def test_listeners_see_every_fenced_statement(database_url: str) -> None:
    with _harness(database_url) as h:
        tokens = {i: h.claim_one(h.items, i).token for i in (1, 2)}
        conn = h.actor()
        seen: list[str] = []

        def spy(*args: Any) -> None:
            seen.append(args[2])

        with h.transaction(conn):
            assert h.dialect.finish(conn, h.items, 1, tokens[1])  # on the driver
        event.listen(conn.engine, "before_cursor_execute", spy)
        with h.transaction(conn):
            assert h.dialect.finish(conn, h.items, 2, tokens[2])
        assert [s for s in seen if s.lstrip().upper().startswith("UPDATE")], seen
        assert h.record(h.items, 2)["status"] == "finished"  # type: ignore[index]


def test_a_driver_error_is_sqlalchemys_and_keeps_its_class(database_url: str) -> None:
    with _harness(database_url) as h:
        token = h.claim_one(h.items, 1).token
        with h.transaction() as conn:
            assert h.dialect.renew(conn, h.items, [(1, token)], 60.0) == []
        if h.app_engine.dialect.name == "sqlite":
            # One writer at a time: the holder's BEGIN IMMEDIATE already has the lock.
            return
        holder, waiter = h.app(), h.actor(lock_timeout=1.0)
        with holder.begin():
            table = h.items.table
            holder.execute(update(table).where(table.c.source_id == 1).values(attempts=7))
            with pytest.raises(exc.OperationalError) as raised, waiter.begin():
                h.dialect.finish(waiter, h.items, 1, token)
        assert raised.value.orig is not None
        assert h.dialect.is_transient(raised.value)  # a lock wait: worth retrying


def test_a_driver_error_is_the_one_sqlalchemy_would_raise(database_url: str) -> None:
    with _harness(database_url) as h:
        token = h.claim_one(h.items, 1).token
        conn = h.actor()
        with h.transaction(conn):
            assert h.dialect.finish(conn, h.items, 1, token)  # compiled on the driver
        with h.app_engine.begin() as app:
            app.execute(text(f"DROP TABLE {h.items.table.name}"))

        def failure() -> exc.DBAPIError:
            with pytest.raises(exc.DBAPIError) as raised, h.transaction(conn):
                h.dialect.finish(conn, h.items, 1, token)
            return raised.value

        on_driver = failure()
        event.listen(conn.engine, "before_cursor_execute", lambda *args: None)
        through_sqlalchemy = failure()
        assert type(on_driver) is type(through_sqlalchemy), (on_driver, through_sqlalchemy)
        assert type(on_driver.orig) is type(through_sqlalchemy.orig)
        assert h.dialect.is_transient(on_driver) == h.dialect.is_transient(through_sqlalchemy)
        assert not on_driver.connection_invalidated


def test_a_connection_the_server_dropped_is_invalidated(database_url: str) -> None:
    with _harness(database_url) as h:
        if h.app_engine.dialect.name == "sqlite":
            pytest.skip("an embedded database has no server to drop a connection")
        tokens = {i: h.claim_one(h.items, i).token for i in (1, 2)}
        conn = h.actor()
        with h.transaction(conn):
            assert h.dialect.finish(conn, h.items, 1, tokens[1])
        with pytest.raises(exc.DBAPIError) as raised, h.transaction(conn):
            drop_on_server(h.url, server_id(conn))
            h.dialect.finish(conn, h.items, 2, tokens[2])
        assert raised.value.connection_invalidated
        assert h.dialect.is_transient(raised.value)
        assert conn.invalidated


def test_a_cursor_kept_with_a_connection_goes_with_it(database_url: str) -> None:
    # One pooled connection: after the server drops it, the pool's record stays and
    # gets a new driver connection. The statements must run on a cursor of that one.
    with _harness(database_url) as h:
        if h.app_engine.dialect.name == "sqlite":
            pytest.skip("an embedded database has no server to drop a connection")
        tokens = {i: h.claim_one(h.items, i).token for i in (1, 2)}
        engine = create_engine(h.url, pool_size=1, max_overflow=0)
        h.dialect.configure_engine(engine)
        try:
            with engine.connect() as conn:
                with conn.begin():
                    assert h.dialect.finish(conn, h.items, 1, tokens[1])
                with pytest.raises(exc.DBAPIError) as raised, conn.begin():
                    drop_on_server(h.url, server_id(conn))
                    h.dialect.finish(conn, h.items, 2, tokens[2])
                assert raised.value.connection_invalidated
            with engine.connect() as conn, conn.begin():
                assert h.dialect.finish(conn, h.items, 2, tokens[2])
        finally:
            engine.dispose()
        assert h.record(h.items, 2)["status"] == "finished"  # type: ignore[index]


@pytest.mark.backends("mysql")
def test_pymysql_runs_the_driver_form_too(mysql_driver_urls: dict[str, str]) -> None:
    url = mysql_driver_urls["pymysql"]
    with _harness(url) as h:
        tokens = {i: h.claim_one(h.items, i).token for i in (1, 2)}
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.items, 1, tokens[1])
            assert not h.dialect.finish(conn, h.items, 2, tokens[2] + 1)
        compiled = h.dialect._driver_forms.compiled()
        assert compiled and all(statement is not None for statement in compiled), compiled
        assert h.record(h.items, 1)["status"] == "finished"  # type: ignore[index]
        assert h.record(h.items, 2)["status"] == "working"  # type: ignore[index]
