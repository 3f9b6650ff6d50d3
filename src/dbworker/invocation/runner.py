"""The runner the coordinator hands an executor: what runs in each handler process.

Executors know processes, not databases: they start a process, hand it this
runner (pickled by reference to its class, with the configuration), and move
task messages to it and results back. Everything that touches the database in a
handler process happens behind these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import configure_mappers

from ..core.tasks import Result, Task, TaskKey
from ..dialects.liveness import used_elsewhere
from .connections import pool_options
from .group import run_group
from .inherited import refuse_inherited_connections
from .lending import LentConnections
from .lone_finishes import run_lone_finishes
from .runtime import ChildConfig, Runtime
from .turns import ENDING_AT_ONCE

if TYPE_CHECKING:
    # Imported where used: SQLAlchemy's asyncio layer and greenlet (1.8 MiB) are loaded
    # only by processes that run async def handlers, not by every coordinator.
    from .async_runtime import AsyncRuntime

#: Exit status of a handler process whose lent connection had to be replaced.
LANE_REPLACED = 75


class ProcessRunner:
    """Runs invocations in the process it lives in, on that process's own engine."""

    def __init__(
        self, config: ChildConfig, workers: Sequence[tuple[str, type[Any], bool]] = ()
    ) -> None:
        self.config = config
        #: (name, source, keyed) of each worker it runs: what ``for_fork`` prepares.
        self._workers = tuple(workers)
        self._fork_template: ProcessRunner | None = None
        #: The coordinator's process: a handler process forked from it (its pid differs)
        #: must not use the pooled connections it inherited (``inherited.py``).
        self._origin = os.getpid()
        self._runtime: Runtime | None = None
        self._lending: LentConnections | None = None
        self._async: AsyncRuntime | None = None
        #: Where ``run`` runs an ``async def`` handler (``drain()``): a loop of its own.
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the configuration crosses to a new process; engines never do.
        return {"config": self.config, "origin": self._origin}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config = state["config"]
        self._origin = state["origin"]
        self._workers = ()
        self._fork_template = None
        self._runtime = None
        self._lending = None
        self._async = None
        self._loop = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime(self.config)
        return self._runtime

    def for_fork(self) -> ProcessRunner:
        """What each process forked from this one runs: a copy holding only the
        configuration, prepared once here (the driver imported, the mappers configured,
        each worker's statements compiled and rehearsed, as ``learn`` does for a
        template) and holding no connection. Forked processes share the memory of that
        work rather than each doing it again (``benchmarks.throughput``, PostgreSQL,
        concurrency 2: the worker tree's PSS 85 -> 80 MiB)."""
        if self._fork_template is None:
            template = pickle.loads(pickle.dumps(self))
            runtime = template.runtime
            # Whatever fails here, the first invocation meets again and reports.
            with contextlib.suppress(Exception):
                runtime.warm_up()
                configure_mappers()
                for worker, source, keyed in self._workers:
                    # No source row has the key None, no execution row a never-issued token.
                    runtime.rehearse(worker, source, None, keyed=keyed)
            runtime.dispose()  # no connection may cross a fork
            self._fork_template = template
        return self._fork_template

    # -- every handler process ---------------------------------------------------------

    def warm_up(self) -> None:
        self._refuse_inherited()
        self.runtime.warm_up()

    def _refuse_inherited(self) -> None:
        if os.getpid() != self._origin:  # not drain(), in the coordinator's own process
            refuse_inherited_connections()

    def run_later(self, task: Task, later: Callable[[Result], None]) -> Result | None:
        """``run``, except that an ending handed over to go with others' returns None
        at once and ``later`` gets its result once committed (threads)."""
        return self.runtime.run_later(task, later)

    def run(self, task: Task) -> Result:
        if inspect.iscoroutinefunction(task.handler):
            # An async def handler called synchronously (``drain()``): on a loop kept
            # for such calls, where its engine's connections stay usable.
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(self.async_runtime.run(task))
        return self.runtime.run(task)

    def run_group(
        self, tasks: Sequence[Task], withdrawn: Callable[[TaskKey], bool]
    ) -> list[Result]:
        """Run the first of ``tasks`` and as many after it as one transaction takes
        (``group.py``), or whose FINISHes one statement records (``lone_finishes.py``);
        their results, once committed."""
        dialect = self.runtime.dialect
        if not dialect.group_commit and dialect.groups_lone_finishes:
            return run_lone_finishes(self.runtime, tasks, withdrawn)
        return run_group(self.runtime, tasks, withdrawn)

    def dispose(self) -> None:
        if self._runtime is not None:
            self._runtime.dispose()
        if self._loop is not None:
            self._loop.run_until_complete(self.dispose_async())
            self._loop.close()
            self._loop = None

    # -- several invocations at once in one process (threads, or an event loop) -------

    def concurrent(self, count: int) -> None:
        """This process will run up to ``count`` invocations at once: size its
        connection pool for them (before it connects)."""
        url = make_url(self.config.database_url)
        # Kept besides: the ending threads' connections and the one reading ahead.
        options = pool_options(dict(self.config.engine_options), url, count, ENDING_AT_ONCE + 1)
        self.config = replace(self.config, engine_options=options)
        self.runtime.end_together()

    @property
    def async_runtime(self) -> AsyncRuntime:
        if self._async is None:
            from .async_runtime import AsyncRuntime

            self._async = AsyncRuntime(self.config)
        return self._async

    async def start_async(self, capacity: int, driver: str | None) -> None:
        """Before an event loop's first invocation: the asyncio driver to use (None:
        the backend's default), how many invocations run at once; connect."""
        from .async_runtime import AsyncRuntime

        self._refuse_inherited()
        self._async = AsyncRuntime(self.config, driver, capacity)
        await self._async.warm_up()

    async def run_async(self, task: Task, returned: Callable[[], None] | None = None) -> Result:
        return await self.async_runtime.run(task, returned)

    def prepare_waiting(self, task: Task) -> None:
        if self._async is not None:
            self._async.read_ahead(task)
        else:
            self.runtime.read_ahead(task)

    def prepare_start(self, task: Task) -> None:
        if self._async is None:  # the event loop's starts read together already
            self.runtime.read_ahead(task, starting=True)

    def forget_waiting(self, key: TaskKey) -> None:
        if self._async is not None:
            self._async.forget_ahead(key)
        else:
            self.runtime.forget_ahead(key)

    async def dispose_async(self) -> None:
        if self._async is not None:
            await self._async.dispose()

    # -- a spawn-per-task template and the processes it forks ------------------------------

    def prepare_template(self) -> None:
        """Pay, once for every process the template will fork, for imports and the
        SQLAlchemy dialect's start-up queries; keep no connection (none may cross a fork)."""
        self.runtime.warm_up()
        self.runtime.dispose()
        self._lending = LentConnections(self.runtime)

    def learn(self, worker: str, payload: bytes, source_id: Any) -> None:
        """Do once, for every later process, what a worker's invocations all do first:
        import the handler, configure the mappers, build the execution table, compile
        the statements (about half of a fresh process's work for a trivial handler)."""
        with contextlib.suppress(Exception):  # an invocation meets it again and reports it
            _handler, source, _retry, keyed = pickle.loads(payload)
            configure_mappers()
            self.runtime.rehearse(worker, source, source_id, keyed=keyed)
        self.runtime.dispose()
        if self._lending is not None:
            self._lending.learned()

    def lend(self, limit: int) -> tuple[Engine | None, bool]:
        """A connection for the next forked process (at most ``limit`` lent at once), and
        whether it is new; None: the process connects itself."""
        assert self._lending is not None, "prepare_template() first"
        return self._lending.lend(limit)

    def lent_to(self, pid: int, lane: Engine | None) -> None:
        assert self._lending is not None, "prepare_template() first"
        self._lending.lent_to(pid, lane)

    def exited(self, pid: int, exitcode: int) -> None:
        """A forked process exited: take back (or close) the connection it had."""
        if self._lending is not None:
            self._lending.returned(pid, exitcode)

    def forked(self, lane: Engine | None) -> Any:
        """In a forked process, before it says ready: connect, or take over ``lane``."""
        runtime = self.runtime
        lent = None
        if lane is not None:
            runtime.use_engine(lane)  # connected, its session warm
            assert self._lending is not None
            returned_at = self._lending.returned_at(lane)
            if returned_at is not None:
                used_elsewhere(lane, returned_at)
            lent = _dbapi_connection(lane)  # pinged if it idled: alive, or replaced
        else:
            runtime.connect()  # all else was prepared in the template
        if lane is None and runtime.dialect.new_connection_is_cold:
            # Once more, on this process's own connection and before it says ready:
            # the server loads what these statements need into the new session now,
            # off the item's time.
            runtime.rehearse_all()
        return lent

    def leave(self, lane: Engine | None, lent: Any) -> int:
        """In a forked process, after its invocation: the exit status to leave with."""
        runtime = self.runtime
        runtime.release()
        if lane is None:
            runtime.dispose()
            return 0
        # Leave the connection open for the template to lend again, its session as
        # new; if that fails, the exit status tells the template to close it.
        with runtime.engine.connect() as db:
            runtime.dialect.reset_session(db)
            # A connection the pool replaced (the lent one had died) is this process's
            # alone; the template must not lend its dead one again.
            kept = db.connection.dbapi_connection is lent
        return 0 if kept else LANE_REPLACED


def _dbapi_connection(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.connection.dbapi_connection
