"""A handler process running several invocations at once on threads records a failing
handler's ending itself, with a connection of its own pool, whatever each thread keeps
(``connections.py``: its handler's connection and, where the dialect reads the source
row apart, one for that read). Run in the test's own process on claimed items of every
database, as the threads executor's process runs them."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import make_url

from dbworker.core.tasks import Result, ResultKind
from dbworker.invocation.connections import pool_options
from dbworker.invocation.runtime import ChildConfig, Runtime

from .test_group import rig  # noqa: F401  (the fixture: claimed items of every database)

#: Far shorter than SQLAlchemy's default pool timeout (30 s): a record waiting for a
#: connection the pool does not have fails fast, as UNRECORDED, instead of late.
POOL_TIMEOUT = 2.0


def test_failures_are_recorded_by_the_threads_that_ran_them(rig: Any) -> None:  # noqa: F811
    threads = 3
    setup = rig(["raise"] * threads)
    url = setup.runtime.config.database_url
    # As the threads executor's process sizes its pool for ``threads`` invocations.
    options = pool_options({"pool_timeout": POOL_TIMEOUT}, make_url(url), threads)
    runtime = Runtime(ChildConfig(url, options, setup.runtime.config.dialect))
    together = threading.Barrier(threads)
    results: list[Result] = []

    def run(index: int) -> None:
        runtime.held.take()  # every thread holds what it keeps, all at once
        together.wait()
        results.append(runtime.run(setup.tasks[index]))

    try:
        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        runtime.dispose()
    assert sorted(r.kind for r in results) == [ResultKind.FAILED] * threads, results
    assert setup.effects() == {}, "a failed handler's writes rolled back"
