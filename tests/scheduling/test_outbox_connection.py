"""The outbox keeps the scheduler's connection from one transaction to the next (a
checkout and a checkin less per claim), with each transaction's read-only option its
own, and gives it back to the pool after an error and at the end."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, event, make_url, text

from dbworker.dialects import for_url
from dbworker.dialects.base import READ_ONLY_OPTION
from dbworker.engines import coordination_engine
from dbworker.scheduling.outbox import Deferred, Outbox, SchedulerHealth


def _read_only(conn: Connection) -> bool:
    conn.execute(text("SELECT 1")).scalar_one()
    return bool(conn.get_execution_options().get(READ_ONLY_OPTION))


def _broken(conn: Connection) -> None:
    conn.execute(text("SELECT * FROM dbworker_no_such_table"))


def test_the_outbox_keeps_its_connection_until_an_error(database_url: str) -> None:
    url = make_url(database_url)
    dialect = for_url(url)
    engine = coordination_engine(url, dialect, {})
    checkouts: list[int] = []
    checkins: list[int] = []

    def checked_out(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        checkouts.append(id(dbapi_connection))

    def checked_in(dbapi_connection: Any, _record: Any) -> None:
        checkins.append(id(dbapi_connection))

    event.listen(engine, "checkout", checked_out)
    event.listen(engine, "checkin", checked_in)
    outbox = Outbox(engine, dialect, SchedulerHealth())
    try:
        assert outbox.transaction("a write", _read_only) is False
        assert outbox.transaction("a read", _read_only, read_only=True) is True
        assert outbox.transaction("a write again", _read_only) is False
        assert len(checkouts) == 1, "one connection for every transaction"

        with pytest.raises(Deferred):
            outbox.transaction("a failing one", _broken)
        assert len(checkins) == 1, "given back after the error"
        outbox.blocked_until = 0.0  # the wait before retrying is not this test's
        assert outbox.transaction("after the error", _read_only) is False
        assert len(checkouts) == 2, "the next transaction checked one out again"
    finally:
        outbox.close()
        assert len(checkins) == len(checkouts), "given back at the end"
        engine.dispose()
