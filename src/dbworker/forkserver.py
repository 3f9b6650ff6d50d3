"""What multiprocessing's fork server imports ahead of a coordinator's handler processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable

from sqlalchemy.engine import URL

from .invocation import ProcessRunner
from .logs import logger
from .schema import PRELOAD_MODULES
from .worker import Registration

log = logger()


def preload_forkserver(url: URL, workers: Iterable[Registration]) -> None:
    """Have the fork server import what every handler process needs before its first task.

    Handler processes fork from multiprocessing's fork server: modules it has imported
    are ready in every child at no cost (it only takes effect before the fork server
    starts, i.e. for the first coordinator of a process).
    """
    sql_dialect = url.get_dialect()
    # What a handler process imports before its first task: the runner's modules,
    # what the execution table's definition loads, and the database driver (the
    # slowest import of all).
    modules = {
        ProcessRunner.__module__,
        *PRELOAD_MODULES,
        sql_dialect.__module__,
        sql_dialect.import_dbapi().__name__,
    }
    for worker in workers:
        modules |= {worker.handler.__module__, worker.source.__module__}
    modules.discard("__main__")
    log.debug("fork server preloads %s", ", ".join(sorted(modules)))
    multiprocessing.set_forkserver_preload(["__main__", *sorted(modules)])
