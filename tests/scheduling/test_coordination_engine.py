"""The coordinator's engine hands the scheduler the connection it gave back last (its
server process's caches are warm for it), unless the user chose the pool."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import make_url
from sqlalchemy.pool import NullPool

from dbworker.dialects import for_url
from dbworker.engines import coordination_engine


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'coordination.db'}"


def _next_after_returning_in_order(url: str, **options: object) -> tuple[object, object, object]:
    """Check out two connections, give back the first then the second, check out one:
    (first, second, the one given)."""
    engine = coordination_engine(make_url(url), for_url(url), options)
    try:
        first, second = engine.connect(), engine.connect()
        ids = id(first.connection.dbapi_connection), id(second.connection.dbapi_connection)
        first.close()
        second.close()
        with engine.connect() as again:
            return ids[0], ids[1], id(again.connection.dbapi_connection)
    finally:
        engine.dispose()


def test_the_connection_given_back_last_serves_next(tmp_path: Path) -> None:
    first, second, given = _next_after_returning_in_order(_url(tmp_path))
    assert first != second
    assert given == second


def test_the_users_pool_order_wins(tmp_path: Path) -> None:
    first, _second, given = _next_after_returning_in_order(_url(tmp_path), pool_use_lifo=False)
    assert given == first


def test_a_pool_class_of_the_users_takes_no_pool_order(tmp_path: Path) -> None:
    url = _url(tmp_path)
    engine = coordination_engine(make_url(url), for_url(url), {"poolclass": NullPool})
    try:
        assert isinstance(engine.pool, NullPool)
        with engine.connect():
            pass
    finally:
        engine.dispose()
