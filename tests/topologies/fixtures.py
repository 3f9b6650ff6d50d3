"""Session fixtures for the topologies (a pytest plugin: the root conftest loads it).

Each topology is built on first use by one pytest process (one per xdist worker) and torn
down at the session's end. Missing programs skip the tests that need them on a developer
machine; under ``DBWORKER_REQUIRE_BACKENDS`` naming the topology (or ``all``, as CI
sets) they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import pytest

from backends import REQUIRE_ENV_VAR, DatabaseServers, TopologyName, required_topologies

from .failover import Failover
from .galera import Galera
from .pgbouncer import PgBouncer
from .processes import TopologyUnavailable

T = TypeVar("T")


def unavailable(name: TopologyName, reason: str) -> NoReturn:
    if name in required_topologies():
        pytest.fail(
            f"{name} is required ({REQUIRE_ENV_VAR}={os.environ[REQUIRE_ENV_VAR]}) but "
            f"unavailable: {reason}",
            pytrace=False,
        )
    pytest.skip(f"{name} unavailable: {reason}")


def build(name: TopologyName, make: Callable[[], T]) -> T:
    """``make()``, or the skip / failure a missing program calls for."""
    try:
        return make()
    except TopologyUnavailable as exc:
        reason = str(exc)
    unavailable(name, reason)


@pytest.fixture(scope="session")
def pgbouncer(_database_servers: DatabaseServers) -> Iterator[PgBouncer]:
    """A PgBouncer (``pool_mode = transaction``) in front of the tests' PostgreSQL."""
    try:
        admin = _database_servers.admin_url("postgresql")
    except Exception as exc:  # no PostgreSQL: the postgresql backend's rules apply
        unavailable("pgbouncer", f"no PostgreSQL server behind it: {exc}")
    bouncer = build("pgbouncer", lambda: PgBouncer(admin))
    yield bouncer
    bouncer.stop()


@pytest.fixture
def failover() -> Iterator[Failover]:
    """A PostgreSQL primary streaming to a replica, built for one test (it kills one)."""
    pair = build("failover", Failover)
    yield pair
    pair.stop()


@pytest.fixture(scope="session")
def galera() -> Iterator[Galera]:
    """A three-node MariaDB Galera cluster on loopback ports (about 20 s to build)."""
    cluster = build("galera", Galera)
    yield cluster
    cluster.stop()
