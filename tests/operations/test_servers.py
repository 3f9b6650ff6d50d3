"""The private-server fixture itself: it must really stop, crash and restart a server
(else the outage tests would prove nothing), keep its data, and never be the shared one."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from backends import DEFAULT_URLS, ServerBackend

from .servers import PrivateServer


def rows(server: PrivateServer) -> list[int]:
    engine = sa.create_engine(server.url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.exec_driver_sql("SELECT n FROM survivors ORDER BY n").scalars())
    finally:
        engine.dispose()


@pytest.mark.backends("postgresql", "mysql")
def test_stop_kill_and_restart(private_server: PrivateServer, backend: ServerBackend) -> None:
    shared = make_url(DEFAULT_URLS[backend])
    assert make_url(private_server.url).port != shared.port

    engine = sa.create_engine(private_server.url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE survivors (n INTEGER)")
        conn.exec_driver_sql("INSERT INTO survivors VALUES (1)")
    engine.dispose()

    private_server.kill9()
    assert private_server.answers() is not None
    private_server.start()
    assert rows(private_server) == [1]

    for mode in ("fast", "immediate"):
        private_server.stop(mode)
        assert private_server.answers() is not None
        private_server.start()
        assert private_server.answers() is None

    private_server.restart("kill9", down_seconds=0.5)
    assert rows(private_server) == [1]
