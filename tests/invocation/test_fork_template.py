"""The runner a pool's forked processes share: prepared once in the coordinator.

A process pool forked from a single-threaded coordinator hands every process the same
runner, ``ProcessRunner.for_fork()``: the driver imported, the mappers configured,
each registered worker's statements built and rehearsed, and no connection kept (none
may cross a fork). That the forked processes then run every call exactly once is
``tests/executors/test_concurrent.py``'s (``forked_app``); here, what the prepared
runner holds, on every database.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import QueuePool

from dbworker import Coordinator
from dbworker.invocation import ChildConfig, ProcessRunner
from executors.app import Base, Item, handle

WORKER = "fork_template"


@pytest.fixture
def coordinator(database_url: str) -> Iterator[Coordinator]:
    engine: Engine = create_engine(database_url)
    Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=database_url)
    coordinator.transactional_worker(WORKER, Item)(handle)
    coordinator.create_worker_tables()
    try:
        yield coordinator
    finally:
        engine.dispose()


def test_the_template_is_prepared_once_and_holds_no_connection(coordinator: Coordinator) -> None:
    runner = coordinator._runner()
    template = runner.for_fork()
    assert template is not runner
    assert runner.for_fork() is template, "one template for every forked process"
    runtime = template.runtime
    # The coordinator's registrations reached it, and their statements ran: the
    # execution table and the source loader exist before any process forks.
    assert runtime.rehearsals == {WORKER: (Item, None, False)}
    assert (WORKER, Item, False) in runtime._tables
    assert Item in runtime._loaders
    # It connected: the dialect learnt the server, which forked processes skip.
    assert runtime.engine.dialect.server_version_info is not None
    assert _connections(runtime.engine) == (0, 0), "no connection crosses a fork"


def test_only_the_configuration_crosses_to_a_new_interpreter(coordinator: Coordinator) -> None:
    runner = coordinator._runner()
    runner.for_fork()
    copy = pickle.loads(pickle.dumps(runner))
    assert copy.config == runner.config
    assert copy._workers == ()
    assert copy._fork_template is None


def test_a_template_that_cannot_connect_is_still_given() -> None:
    """A database down at start: the processes start unprepared and their first
    invocation meets the error, as without a template."""
    config = ChildConfig("postgresql+psycopg://nobody@127.0.0.1:9/none", {})
    runner = ProcessRunner(config, [(WORKER, Item, False)])
    template = runner.for_fork()
    assert runner.for_fork() is template
    assert template.runtime.engine.dialect.server_version_info is None, "never connected"
    assert _connections(template.runtime.engine) == (0, 0)


def _connections(engine: Engine) -> tuple[int, int]:
    """How many connections the engine's pool holds idle, and lent out."""
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    return pool.checkedin(), pool.checkedout()
