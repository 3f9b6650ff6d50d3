"""What runs an ``async def`` handler: one invocation on an event loop, recorded under
its token in the handler's own transaction (the same guarantee as ``runtime.py``).

The handler gets an ``AsyncSession`` on its own connection of an async engine
(psycopg's async mode, aiosqlite, aiomysql). The fenced status change is the
dialect's own statement, run on the session's connection through ``run_sync``, so
the handler's writes and the status change commit together or not at all, and no
SQL is written twice. Many invocations run at once on one loop; each has its own
connection and transaction. Cancelling one (its timeout, a lost claim) discards its
connection, so the server rolls its transaction back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from ..core.errors import HandlerContractError
from ..core.outcomes import Finished, Unfinished
from ..core.policy import FINISHED, Decision, Ending, decide
from ..core.tasks import ErrorInfo, Result, ResultKind, Task
from ..dialects import Dialect, WorkerTable, for_engine
from ..dialects.terms import READ_ONLY_OPTION
from .connections import pool_options
from .failures import HandlerFailure
from .loading import SourceLoader
from .runtime import KEPT_AFTER, ChildConfig, worker_table
from .session import HandlerSession
from .turns import (
    ENDING_AT_ONCE,
    ENDING_TURN_WAIT,
    STARTING_AT_ONCE,
    AsyncEndingTurns,
    StartingTurn,
)

#: The asyncio driver used for each backend unless ``AsyncIO(driver=...)`` names one,
#: and the dbworker extra that installs it.
ASYNC_DRIVERS = {
    "postgresql": ("psycopg", "postgresql"),
    "sqlite": ("aiosqlite", "async"),
    "mysql": ("aiomysql", "async"),
    "mariadb": ("aiomysql", "async"),
}


def async_url(url: str | URL, driver: str | None = None) -> URL:
    """``url`` (a synchronous driver's) with its backend's asyncio driver."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    chosen = driver or ASYNC_DRIVERS.get(backend, (None, None))[0]
    if chosen is None:
        return parsed  # a third-party backend: its URL is used as it is
    return parsed.set(drivername=f"{backend}+{chosen}")


class AsyncRuntime:
    """Per-process state of the asyncio executor: one async engine and the dialect."""

    def __init__(self, config: ChildConfig, driver: str | None = None, capacity: int = 1) -> None:
        self.config = config
        self.driver = driver
        self.capacity = capacity
        self._engine: AsyncEngine | None = None
        self._dialect: Dialect | None = None
        self._tables: dict[tuple[str, type[Any], bool], WorkerTable] = {}
        self._loaders: dict[type[Any], SourceLoader] = {}
        self._starting: asyncio.Semaphore | None = None
        self._ending: AsyncEndingTurns | None = None
        #: Connections kept checked out between invocations (as ``connections.py`` does
        #: for threads): a checkout and check-in cost two trips through the greenlet and
        #: the pool's events per invocation, all on the loop every invocation waits on.
        self._idle: list[AsyncConnection] = []

    @property
    def starting(self) -> asyncio.Semaphore:
        """Turns to start an invocation (see STARTING_AT_ONCE); made on the running loop."""
        if self._starting is None:
            self._starting = asyncio.Semaphore(STARTING_AT_ONCE)
        return self._starting

    @property
    def ending(self) -> AsyncEndingTurns:
        """Turns to end an invocation (see ENDING_AT_ONCE); made on the running loop."""
        if self._ending is None:
            self._ending = AsyncEndingTurns(ENDING_AT_ONCE, ENDING_TURN_WAIT)
        return self._ending

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            url = async_url(self.config.database_url, self.driver)
            options = pool_options(dict(self.config.engine_options), url, self.capacity)
            engine = create_async_engine(url, **options)
            chosen = self.config.dialect
            dialect = chosen() if chosen is not None else for_engine(engine.sync_engine)
            dialect.configure_async_engine(engine.sync_engine)
            self._engine, self._dialect = engine, dialect
        return self._engine

    @property
    def dialect(self) -> Dialect:
        _ = self.engine
        assert self._dialect is not None
        return self._dialect

    def prepare(self, worker: str, source: type[Any], keyed: bool = False) -> WorkerTable:
        key = (worker, source, keyed)
        if key not in self._tables:
            self._tables[key] = worker_table(worker, source, keyed)
        return self._tables[key]

    async def warm_up(self) -> None:
        """Import the driver and connect once, before the process says it is ready (a
        failure is left for the first invocation, which reports it)."""
        with contextlib.suppress(Exception):
            async with self.engine.connect():
                pass

    async def dispose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.close()
        if self._engine is not None:
            with contextlib.suppress(Exception):
                await self._engine.dispose()

    async def run(self, task: Task) -> Result:
        started = time.monotonic()
        result = await self._run(task)
        return replace(result, duration=time.monotonic() - started)

    async def _run(self, task: Task) -> Result:
        worker = self.prepare(task.worker, task.source, task.keyed)
        turn = StartingTurn(self.starting)
        await turn.take()
        try:
            return await self._connected(task, worker, turn)
        finally:
            turn.end()

    async def _connected(self, task: Task, worker: WorkerTable, turn: StartingTurn) -> Result:
        try:
            conn = await self._take()
        except Exception as exc:
            turn.end()
            return await self.record_failure(task, worker, exc)
        session = AsyncSession(bind=conn, sync_session_class=HandlerSession, expire_on_commit=False)
        handler_session = session.sync_session
        assert isinstance(handler_session, HandlerSession)
        kept = False
        try:
            result = await self._invoke(task, worker, session, handler_session, turn)
            kept = result.kind in KEPT_AFTER
            return result
        except BaseException:
            # Cancelled (a timeout, a lost claim, a stop) mid-statement, perhaps: the
            # connection's state is unknown, so it is discarded, and the server rolls
            # the transaction back.
            with contextlib.suppress(Exception):
                await conn.invalidate()
            raise
        finally:
            handler_session._dbworker_guarded = False
            with contextlib.suppress(Exception):
                await session.close()
            if kept and self.keeps_connections:
                self._idle.append(conn)
            else:  # whatever went wrong may have left the connection unusable
                with contextlib.suppress(Exception):
                    await conn.close()

    @property
    def keeps_connections(self) -> bool:
        # With no pool the user asked for a connection per use: nothing is kept.
        return not isinstance(self.engine.pool, NullPool)

    async def _take(self) -> AsyncConnection:
        """A kept connection, else one from the pool. One idle for a while is pinged
        when its next transaction begins (``dialects.liveness``), as the pool would at
        checkout; one left closed, invalidated or in a transaction is given back."""
        while self._idle:
            conn = self._idle.pop()
            if not (conn.closed or conn.invalidated or conn.in_transaction()):
                return conn
            with contextlib.suppress(Exception):
                await conn.close()
        return await self.engine.connect()

    async def _invoke(
        self,
        task: Task,
        worker: WorkerTable,
        session: AsyncSession,
        guarded: HandlerSession,
        turn: StartingTurn,
    ) -> Result:
        try:
            if self.dialect.source_read_apart:
                source = await self._load_apart(session, task)
            else:
                # As the threads' runtime loads it (``loading.py``), in one trip
                # through the greenlet.
                loader = self._loader(task.source, worker)
                source = await session.run_sync(loader.load, task.source_id)
            guarded._dbworker_guarded = True
            if source is None:
                raise LookupError(
                    f"source row {task.source_id!r} of {task.source.__name__} no longer exists"
                )
            turn.end()
            outcome = await task.handler(source, session)
            if guarded._dbworker_misuse is not None:
                raise HandlerContractError(
                    f"{guarded._dbworker_misuse}; dbworker owns the session's commit and cleanup"
                )
            if not isinstance(outcome, Finished | Unfinished):
                raise HandlerContractError(
                    f"handler of worker {task.worker!r} returned {outcome!r}; it must "
                    "return Finished() or Unfinished()"
                )
            if isinstance(outcome, Finished):
                decision, kind = FINISHED, ResultKind.FINISHED
            else:
                decision = decide(Ending.UNFINISHED, delay=outcome.delay)
                kind = ResultKind.UNFINISHED
            # The flush, the fenced ending and the commit (or rollback) in one trip
            # through the greenlet: each trip is a pass of the loop, shared with every
            # invocation in flight.
            async with self.ending.turn():
                done = await session.run_sync(_finish, self.dialect, worker, task, decision)
            return Result(task.key, kind if done else ResultKind.LOST)
        except Exception as exc:
            turn.end()
            guarded._dbworker_guarded = False
            with contextlib.suppress(Exception):
                await session.rollback()
            return await self.record_failure(task, worker, exc)

    def _loader(self, source: type[Any], worker: WorkerTable) -> SourceLoader:
        loader = self._loaders.get(source)
        if loader is None:
            loader = self._loaders[source] = SourceLoader(source, worker.source_pk)
        return loader

    async def _load_apart(self, session: AsyncSession, task: Task) -> Any:
        """The source row read on a connection of its own, outside the handler's
        transaction (``Dialect.source_read_apart``: on SQLite that transaction holds the
        database's write lock, which must not be taken for the handler's waits), then
        placed in ``session`` as ``session.get`` would have loaded it."""
        async with self.engine.connect() as read:
            await read.execution_options(**{READ_ONLY_OPTION: True})
            async with AsyncSession(bind=read, expire_on_commit=False) as reading:
                # Closing (not rolling back) ends the read and leaves the row loaded.
                found = await reading.get(task.source, task.source_id)
        return None if found is None else await session.merge(found, load=False)

    async def record_failure(self, task: Task, worker: WorkerTable, exc: BaseException) -> Result:
        failure = HandlerFailure.of(task, exc, transient=self.dialect.is_transient(exc))
        try:
            async with self.engine.begin() as conn:
                done = await conn.run_sync(
                    _record_on, self.dialect, worker, task, failure.decision, failure.info
                )
        except asyncio.CancelledError:
            raise
        except Exception as db_exc:  # the coordinator will record it instead
            return failure.unrecorded(db_exc)
        return failure.written(done)


def _finish(
    session: Session, dialect: Dialect, worker: WorkerTable, task: Task, decision: Decision
) -> bool:
    """Inside ``run_sync``: the handler's writes first (their errors are its own), then
    the dialect's fenced ending on the session's connection, committed with them; if
    the fence failed (the claim was lost), everything rolls back. Whether it held."""
    assert isinstance(session, HandlerSession)
    session.flush()
    done = dialect.record(session.connection(), worker, task.source_id, task.token, decision)
    session._dbworker_guarded = False
    if not done:
        session.rollback()
        return False
    session.commit()
    return True


def _record_on(
    conn: Any,
    dialect: Dialect,
    worker: WorkerTable,
    task: Task,
    decision: Decision,
    info: ErrorInfo | None,
) -> bool:
    return dialect.record(conn, worker, task.source_id, task.token, decision, info)
