"""What runs an ``async def`` handler: one invocation on an event loop, recorded under
its token in the handler's own transaction (the same guarantee as ``runtime.py``).

The handler gets an ``AsyncSession`` that takes its own connection of an async engine
(psycopg's async mode, aiosqlite, aiomysql) at its first statement
(``first_statement.py``): a handler that sends none holds none. The fenced status
change is the dialect's own statement, run on the session's connection through ``run_sync``, so
the handler's writes and the status change commit together or not at all, and no
SQL is written twice. Many invocations run at once on one loop; each has its own
connection and transaction. Cancelling one (its timeout, a lost claim) discards its
connection, so the server rolls its transaction back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from ..core.errors import HandlerContractError
from ..core.outcomes import Finished, Unfinished
from ..core.policy import FINISHED, Decision, Ending, decide
from ..core.tasks import ErrorInfo, Result, ResultKind, Task, TaskKey
from ..core.timing import AHEAD_PER_SLOT
from ..dialects import Dialect, WorkerTable, for_engine
from .connections import pool_options
from .failures import HandlerFailure
from .first_statement import AsyncLent
from .loading import SourceLoader
from .reading import READS_AT_ONCE, AsyncReads, Wanted, reading_options
from .runtime import KEPT_AFTER, ChildConfig, worker_table
from .session import HandlerSession
from .together import AsyncPartings, Parting
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
        self._partings: AsyncPartings | None = None
        #: Connections kept for endings together: taken from ``_idle``, they left a
        #: wave's next handlers short, each of which then connected anew (10-15 ms).
        self._enders: list[AsyncConnection] = []
        #: Connections kept for reading source rows apart (``_load_apart``).
        self._readers: list[AsyncConnection] = []
        self._reads: AsyncReads | None = None
        #: Rows of tasks waiting for a slot, read ahead (``read_ahead``).
        self._ahead: dict[TaskKey, _ReadAhead] = {}

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
            options = pool_options(
                dict(self.config.engine_options), url, self.capacity, READS_AT_ONCE + ENDING_AT_ONCE
            )
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
            async with self.engine.connect() as conn:
                # Whether endings may go together (``Dialect.group_commit``: not on a
                # Galera node), as the coordinator learns it for groups.
                await conn.run_sync(self.dialect.learn_server)

    async def dispose(self) -> None:
        ahead, self._ahead = list(self._ahead.values()), {}
        for early in ahead:
            early.read.cancel()
        await asyncio.gather(*(early.read for early in ahead), return_exceptions=True)
        if self._partings is not None:
            await self._partings.close()
        if self._reads is not None:
            await self._reads.close()
        idle, self._idle = self._idle + self._readers + self._enders, []
        self._readers, self._enders = [], []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.close()
        if self._engine is not None:
            with contextlib.suppress(Exception):
                await self._engine.dispose()

    @property
    def partings(self) -> AsyncPartings:
        """Endings together (``together.py``); made on the running loop."""
        if self._partings is None:
            enders = self._enders
            self._partings = AsyncPartings(
                self.dialect,
                lambda: self._take(enders),
                lambda conn, usable: self._give_back(conn, usable, enders),
            )
        return self._partings

    @property
    def reads(self) -> AsyncReads:
        """Source rows read together (``reading.py``); made on the running loop."""
        if self._reads is None:
            self._reads = AsyncReads(self._reader, self._readers.append)
        return self._reads

    async def run(self, task: Task, returned: Callable[[], None] | None = None) -> Result:
        started = time.monotonic()
        result = await self._run(task, True, returned)
        if result is None:  # its ending together failed as a whole: it runs again, alone
            result = await self._run(task, False, None)
        assert result is not None
        return replace(result, duration=time.monotonic() - started)

    async def _run(
        self, task: Task, together: bool, returned: Callable[[], None] | None
    ) -> Result | None:
        worker = self.prepare(task.worker, task.source, task.keyed)
        turn = StartingTurn(self.starting)
        if not together:  # reads together take a burst at once (``reading.py``)
            await turn.take()
        try:
            return await self._connected(task, worker, turn, together, returned)
        finally:
            turn.end()

    async def _connected(
        self,
        task: Task,
        worker: WorkerTable,
        turn: StartingTurn,
        together: bool,
        returned: Callable[[], None] | None,
    ) -> Result | None:
        session = _handler_session()
        source: Any = _UNREAD
        try:
            if together:
                # Read apart, so that the reads of a burst of starts go together, and
                # the handler holds no transaction while it waits: if it sends no
                # statement, its ending joins others'.
                session, source = await self._read_first(task, worker, session)
        except Exception as exc:
            turn.end()
            return await self.record_failure(task, worker, exc)
        handler_session = session.sync_session
        assert isinstance(handler_session, HandlerSession)
        lent = AsyncLent(self._take)
        handler_session._dbworker_lend = lent
        kept = False
        try:
            result = await self._invoke(
                task, worker, lent, session, handler_session, turn, source, returned
            )
            kept = result is not None and result.kind in KEPT_AFTER
            return result
        except BaseException:
            # Cancelled (a timeout, a lost claim, a stop) mid-statement, perhaps: the
            # connection's state is unknown, so it is discarded, and the server rolls
            # the transaction back.
            if lent.conn is not None:
                with contextlib.suppress(Exception):
                    await lent.conn.invalidate()
                lent.conn = None
            raise
        finally:
            handler_session._dbworker_guarded = False
            handler_session._dbworker_lend = None
            with contextlib.suppress(Exception):
                await session.close()
            if lent.conn is None:
                pass  # it took none, or gave it back when its handler returned
            elif kept and self.keeps_connections:
                self._idle.append(lent.conn)
            else:  # whatever went wrong may have left the connection unusable
                with contextlib.suppress(Exception):
                    await lent.conn.close()

    @property
    def keeps_connections(self) -> bool:
        # With no pool the user asked for a connection per use: nothing is kept.
        return not isinstance(self.engine.pool, NullPool)

    async def _take(self, kept: list[AsyncConnection] | None = None) -> AsyncConnection:
        """A kept connection (of ``kept``, else a handler's), else one from the pool.
        One idle for a while is pinged when its next transaction begins
        (``dialects.liveness``), as the pool would at checkout; one left closed,
        invalidated or in a transaction is given back."""
        kept = self._idle if kept is None else kept
        while kept:
            conn = kept.pop()
            if not (conn.closed or conn.invalidated or conn.in_transaction()):
                return conn
            with contextlib.suppress(Exception):
                await conn.close()
        return await self.engine.connect()

    async def _give_back(
        self, conn: AsyncConnection, usable: bool, kept: list[AsyncConnection] | None = None
    ) -> None:
        """Keep ``conn`` for a later use (in ``kept``, else a handler's), or close it if
        it may be unusable."""
        if usable and self.keeps_connections and not conn.in_transaction():
            (self._idle if kept is None else kept).append(conn)
            return
        with contextlib.suppress(Exception):
            if usable:
                await conn.close()
            else:
                await conn.invalidate()

    async def _invoke(
        self,
        task: Task,
        worker: WorkerTable,
        lent: AsyncLent,
        session: AsyncSession,
        guarded: HandlerSession,
        turn: StartingTurn,
        source: Any,
        returned: Callable[[], None] | None,
    ) -> Result | None:
        # Read already (``_connected``): its ending joins others' if it can.
        together = source is not _UNREAD
        try:
            if source is _UNREAD and self.dialect.source_read_apart:
                source = await self._load_apart(session, task, worker)
            elif source is _UNREAD:
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
            if returned is not None:
                returned()
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
            if together and self.dialect.group_commit and not lent.holding():
                guarded._dbworker_guarded = False
                guarded._dbworker_lend = None
                parting = Parting(task, worker, guarded, outcome)
                # Nothing of it is on its connection, if it took one (its batch binds
                # the session to its own): the next invocation may take it at once.
                guarded._dbworker_parted = True
                if lent.conn is not None:
                    conn, lent.conn = lent.conn, None
                    guarded.bind = None
                    await self._give_back(conn, True)
                return await self.partings.end(parting)
            # The flush, the fenced ending and the commit (or rollback) in one trip
            # through the greenlet: each trip is a pass of the loop, shared with every
            # invocation in flight.
            async with self.ending.turn(holding=lent.holding()):
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

    def read_ahead(self, task: Task) -> None:
        """Read ``task``'s row now: it was claimed ahead and waits for a slot, and will
        start at once when one frees. Read at its start instead, a wave's next
        handlers waited for reads that shared the loop with the endings of the wave
        that had just returned (``benchmarks.io``: 6-8 ms a wave). The row is as a
        read apart at the start sees it (a statement of its own, before the
        handler's transaction), only earlier: at most ``CLAIM_AHEAD_SECONDS``, what
        the coordinator claims ahead for (``executors.multiplexed``)."""
        if (
            task.row is not None
            or task.key in self._ahead
            or len(self._ahead) >= AHEAD_PER_SLOT * self.capacity
        ):
            return
        worker = self.prepare(task.worker, task.source, task.keyed)
        session = _handler_session()
        loader = self._loader(task.source, worker)
        wanted = self.reads.want(loader, session.sync_session, task.source_id, ahead=True)
        read = asyncio.get_running_loop().create_task(self.reads.result(wanted))
        read.add_done_callback(_retrieved)
        self._ahead[task.key] = _ReadAhead(session, read, wanted)

    def forget_ahead(self, key: TaskKey) -> None:
        """The task ``key`` was withdrawn before it started: its read is not wanted."""
        early = self._ahead.pop(key, None)
        if early is not None:
            self.reads.drop(early.wanted)
            early.read.cancel()

    async def _read_first(
        self, task: Task, worker: WorkerTable, session: AsyncSession
    ) -> tuple[AsyncSession, Any]:
        """The session and row ``task`` starts with: read ahead (``read_ahead``), read
        with its claim, or now in ``session``. A read ahead that failed or found no row
        is done again."""
        early = self._ahead.pop(task.key, None)
        if early is not None:
            self.reads.hurry(early.wanted)
            with contextlib.suppress(Exception):
                source = await early.read
                if source is not None:
                    return early.session, source
        elif task.row is not None:
            # Read with its claim (``Task.row``): no statement of its own, unless the
            # session needs the ORM's load.
            source = self._loader(task.source, worker).instance(session.sync_session, task.row)
            if source is not None:
                return session, source
        return session, await self._load_apart(session, task, worker)

    async def _load_apart(self, session: AsyncSession, task: Task, worker: WorkerTable) -> Any:
        """The source row read apart, outside the handler's transaction (which then
        begins with the handler's first statement, if any), then placed in ``session``
        as ``session.get`` would have loaded it. On a connection kept for reading, where
        each statement commits by itself: on SQLite no write lock is taken for the
        handler's waits (``Dialect.source_read_apart``); elsewhere a read is one
        statement, with no BEGIN and no ROLLBACK around it."""
        loader = self._loader(task.source, worker)
        return await self.reads.load(loader, session.sync_session, task.source_id)

    async def _reader(self) -> tuple[AsyncConnection, bool]:
        """A connection kept for reading apart (and whether it was kept), else a new one."""
        while self._readers:
            read = self._readers.pop()
            if not (read.closed or read.invalidated or read.in_transaction()):
                return read, True
            with contextlib.suppress(Exception):
                await read.close()
        read = await self.engine.connect()
        await read.execution_options(**reading_options(self.dialect))
        return read, False

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


#: A source row not read yet (``_connected``).
_UNREAD = object()


@dataclass(eq=False, slots=True)
class _ReadAhead:
    """A waiting task's row, being read (``AsyncRuntime.read_ahead``) into ``session``."""

    session: AsyncSession
    read: asyncio.Task[Any]
    wanted: Wanted


def _handler_session() -> AsyncSession:
    return AsyncSession(sync_session_class=HandlerSession, expire_on_commit=False)


def _retrieved(read: asyncio.Task[Any]) -> None:
    # Its failure is met again when its task starts and reads anew; not a stray error.
    if not read.cancelled():
        read.exception()


def _record_on(
    conn: Any,
    dialect: Dialect,
    worker: WorkerTable,
    task: Task,
    decision: Decision,
    info: ErrorInfo | None,
) -> bool:
    return dialect.record(conn, worker, task.source_id, task.token, decision, info)
