"""What runs inside a handler process: one invocation, recorded under its token.

The handler's writes and the status transition share one transaction, so they
commit together or not at all; a handler whose claim was taken over finds its
token stale at completion and everything it wrote rolls back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Engine, Integer, create_engine, inspect
from sqlalchemy.orm import Session

from ..core.errors import HandlerContractError
from ..core.outcomes import Finished, Unfinished
from ..core.policy import FINISHED, Ending, decide
from ..core.tasks import Result, ResultKind, Task, TaskKey
from ..dialects import Dialect, WorkerTable, for_engine
from ..dialects.terms import NEVER_ISSUED_TOKEN
from ..schema import detached_table
from .connections import HeldConnections, ThreadConnections
from .failures import HandlerFailure
from .loading import SourceLoader
from .reading import ThreadReads, reading_options
from .session import HandlerSession
from .together import Parting, ThreadEndings
from .turns import ENDING_AT_ONCE, ENDING_TURN_WAIT, EndingTurns

#: Outcomes after which a handler process keeps its connection for the next invocation.
KEPT_AFTER = frozenset({ResultKind.FINISHED, ResultKind.UNFINISHED})


@dataclass(frozen=True, slots=True)
class ChildConfig:
    """What every handler process needs to open its own database connections."""

    database_url: str
    engine_options: dict[str, Any]
    #: The dialect class the coordinator resolved (pickled by reference). Without it
    #: a process resolves it again, and a new process pays for scanning every
    #: installed package's entry points: on each invocation under spawn.
    dialect: type[Dialect] | None = None


def worker_table(worker: str, source: type[Any], keyed: bool = False) -> WorkerTable:
    """Worker ``worker``'s execution table, as a handler process writes to it (``keyed``:
    with the ``held_key`` of an exclusive_by worker, which its endings clear)."""
    pk = inspect(source).primary_key[0]
    table = detached_table(worker, pk.type, keyed=keyed)
    return WorkerTable(worker, table, pk, monotonic_keys=False)


class Runtime:
    """Per-process state: one engine and dialect, reused across invocations."""

    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self._engine: Engine | None = None
        self._dialect: Dialect | None = None
        self._tables: dict[tuple[str, type[Any], bool], WorkerTable] = {}
        #: What ``rehearse`` ran with, per worker, to run again in a fresh process.
        self.rehearsals: dict[str, tuple[type[Any], Any, bool]] = {}
        self._loaders: dict[type[Any], SourceLoader] = {}
        self._held: HeldConnections | None = None
        #: Workers whose handlers released their transaction in a group: their items
        #: run alone from then on (``group.py``).
        self.alone: set[str] = set()
        #: Workers whose grouped handlers send statements: their group's rows are read
        #: by each item, after the items before it (``group.py``).
        self.writing: set[str] = set()
        #: Where the process runs many invocations at once (threads), they end in turns.
        self.ending = EndingTurns(ENDING_AT_ONCE, ENDING_TURN_WAIT)
        #: Where the process runs many invocations at once (threads), endings of those
        #: whose handler holds no transaction go together (``together.py``).
        self.endings: ThreadEndings | None = None
        #: There too, the rows of tasks waiting for a thread are read ahead.
        self.reads: ThreadReads | None = None
        #: While a group of lone finishes runs (``lone_finishes.py``, only in a process
        #: that runs one invocation at a time): the finished items that wrote nothing,
        #: whose FINISH is recorded after the group, all in one.
        self.deferred: list[Task] | None = None

    def end_together(self) -> None:
        """Run invocations handed ``later`` with endings together, and read the rows of
        tasks that wait for a thread ahead (before any runs)."""
        if self.endings is None:
            self.endings = ThreadEndings(
                lambda: self.dialect, lambda: self.engine.connect(), self.run
            )
        if self.reads is None:
            self.reads = ThreadReads(self._reading_connection, self._task_loader)

    def read_ahead(self, task: Task, starting: bool = False) -> None:
        """Read ``task``'s row now: it waits for a thread, or (``starting``) one takes
        it at once, and reads with others arriving together (``ThreadReads``). Its
        handler gets the row as read then, before its transaction, as on the event
        loop. A task that carries its row (``Task.row``) has nothing to read."""
        if self.reads is not None and task.row is None:
            self.reads.add(task, HandlerSession(expire_on_commit=False), starting=starting)

    def forget_ahead(self, key: TaskKey) -> None:
        if self.reads is not None:
            self.reads.forget(key)

    def _reading_connection(self) -> Connection:
        conn = self.engine.connect()
        conn.execution_options(**reading_options(self.dialect))
        return conn

    def _task_loader(self, task: Task) -> SourceLoader:
        return self._loader(task.source, self.prepare(task.worker, task.source, task.keyed))

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = self.new_engine()
        return self._engine

    def new_engine(self) -> Engine:
        """An engine as handlers get it: the user's options, set up by the dialect."""
        # The dialect's configure_engine pings pooled connections that idled: a
        # handler process outlives database restarts, and a connection the server
        # dropped would otherwise fail the next handler to use it.
        engine = create_engine(self.config.database_url, **self.config.engine_options)
        if self._dialect is None:
            if self.config.dialect is not None:
                self._dialect = self.config.dialect()
            else:
                self._dialect = for_engine(engine)
        self._dialect.configure_engine(engine, handlers=True)
        return engine

    def use_engine(self, engine: Engine) -> None:
        """Run invocations on ``engine`` (one this process inherited, connected)."""
        self.release()
        self._engine = engine

    @property
    def held(self) -> HeldConnections:
        if self._held is None:
            self._held = HeldConnections(self.engine, self.dialect.source_read_apart)
        return self._held

    def release(self) -> None:
        """Give back the connections kept between invocations (before the engine's
        pool is disposed of, or used by anyone else)."""
        if self._held is not None:
            self._held.close_all()
            self._held = None

    @property
    def dialect(self) -> Dialect:
        _ = self.engine
        assert self._dialect is not None
        return self._dialect

    def prepare(self, worker: str, source: type[Any], keyed: bool = False) -> WorkerTable:
        """The worker's execution table, built once per process (``keyed``: with the
        ``held_key`` of an exclusive_by worker, which its endings clear)."""
        key = (worker, source, keyed)
        if key not in self._tables:
            self._tables[key] = worker_table(worker, source, keyed)
        return self._tables[key]

    def warm_up(self) -> None:
        """Pay a new process's first-use costs before it is given work: importing the
        database driver, loading the SQLAlchemy dialect modules the execution table's
        definition needs, resolving the dbworker dialect, and connecting.

        A process started ahead of its first task (every pool child; spawn's next
        process) then starts the handler at once. A failure here is not an error:
        the first task meets it again and reports it as that task's.
        """
        with contextlib.suppress(Exception):
            detached_table("warm_up", Integer())
        self.connect()
        if self.endings is not None:
            # Whether endings may go together (``Dialect.group_commit``: not on a
            # Galera node), as the coordinator learns it for groups.
            with contextlib.suppress(Exception), self.engine.connect() as conn:
                self.dialect.learn_server(conn)

    def connect(self) -> None:
        """Open a connection and leave it in the engine's pool for the first task."""
        with contextlib.suppress(Exception), self.engine.connect():
            pass

    def rehearse(
        self,
        worker: str,
        source: type[Any],
        source_id: Any,
        engine: Engine | None = None,
        *,
        keyed: bool = False,
    ) -> None:
        """Run an invocation's statements under a token never issued, and roll back.

        Nothing changes (the fenced updates match no row), but SQLAlchemy caches
        their compiled forms (a process forked afterwards starts with them), and the
        database session has loaded what they read.
        """
        table = self.prepare(worker, source, keyed)
        self.rehearsals[worker] = (source, source_id, keyed)
        with HandlerSession(engine or self.engine) as session:
            try:
                self.load(session, table, source, source_id)
                conn = session.connection()
                self.dialect.finish(conn, table, source_id, NEVER_ISSUED_TOKEN)
                self.dialect.unfinish(conn, table, source_id, NEVER_ISSUED_TOKEN, 0.0)
                session.flush()
            finally:
                session.rollback()

    def rehearse_all(self, engine: Engine | None = None) -> None:
        """``rehearse`` again each worker rehearsed so far (on ``engine``, e.g. another
        connection); a failure is left for the invocation that meets it."""
        for worker, (source, source_id, keyed) in self.rehearsals.items():
            with contextlib.suppress(Exception):
                self.rehearse(worker, source, source_id, engine, keyed=keyed)

    def load(
        self,
        session: Session,
        worker: WorkerTable,
        source: type[Any],
        source_id: Any,
        bind: Connection | None = None,
    ) -> Any:
        """The source row as the handler receives it (as ``session.get`` gives it, from
        statements built once per process: a forked handler process then builds no SQL)."""
        return self._loader(source, worker).load(session, source_id, bind)

    def load_many(
        self,
        wanted: Sequence[tuple[Session, Any]],
        worker: WorkerTable,
        source: type[Any],
        conn: Connection,
    ) -> list[Any] | None:
        """``load`` for each (session, source id) of ``wanted`` in one statement on
        ``conn``; None if the mapping needs the ORM's load (each is then loaded alone)."""
        return self._loader(source, worker).load_many(wanted, conn)

    def load_apart(
        self,
        session: Session,
        worker: WorkerTable,
        source: type[Any],
        source_id: Any,
        read: Connection,
    ) -> Any:
        """``load``, read on ``read`` apart from the session's transaction
        (``Dialect.source_read_apart``), which begins with the handler's first statement."""
        return self._loader(source, worker).load_apart(session, source_id, read)

    def _loader(self, source: type[Any], worker: WorkerTable) -> SourceLoader:
        loader = self._loaders.get(source)
        if loader is None:
            loader = self._loaders[source] = SourceLoader(source, worker.source_pk)
        return loader

    def dispose(self) -> None:
        if self.reads is not None:
            self.reads.close()
        if self.endings is not None:
            self.endings.close()
        self.release()
        if self._engine is not None:
            self._engine.dispose()

    def run(self, task: Task) -> Result:
        result = self.run_later(task, None)
        assert result is not None  # nothing is handed over without ``later``
        return result

    def run_later(self, task: Task, later: Callable[[Result], None] | None) -> Result | None:
        """``run``; or None if its ending was handed over to go with others'
        (``end_together``): ``later`` then gets its result once committed."""
        started = time.monotonic()

        def deliver(result: Result) -> None:
            assert later is not None
            later(replace(result, duration=time.monotonic() - started))

        result = self._run(task, None if later is None or self.endings is None else deliver)
        return None if result is None else replace(result, duration=time.monotonic() - started)

    def _run(self, task: Task, parted: Callable[[Result], None] | None = None) -> Result | None:
        worker = self.prepare(task.worker, task.source, task.keyed)
        try:
            held = self.held.take()
        except Exception as exc:
            return self.record_failure(task, worker, exc)
        try:
            result = self._invoke(task, worker, held, parted)
        except BaseException:
            self.held.drop()
            raise
        if result is None or result.kind in KEPT_AFTER:
            self.held.done()
        else:  # whatever went wrong may have left the connection unusable
            self.held.drop()
        return result

    def _invoke(
        self,
        task: Task,
        worker: WorkerTable,
        held: ThreadConnections,
        parted: Callable[[Result], None] | None = None,
    ) -> Result | None:
        early = None if self.reads is None else self.reads.take(task.key)
        if early is None:
            # Nothing reads the instances after the commit: expiring them is wasted work.
            session = HandlerSession(expire_on_commit=False)
        else:  # read ahead: the handler's transaction begins with its first statement
            read_early, source = early
            assert isinstance(read_early, HandlerSession)
            session = read_early
            session.bind = None
        # Its connection is taken at its first statement, if it sends one.
        session._dbworker_lend = held.lend
        handed = False
        try:
            try:
                if early is None and task.row is not None:
                    # Read with its claim (``Task.row``): no statement of its own; a
                    # session that needs the ORM's load reads it below after all.
                    source = self._loader(task.source, worker).instance(session, task.row)
                    if source is not None:
                        early = (session, source)
                if early is None and held.read_apart:
                    # Read the row apart (on a connection kept for reading), so that
                    # the handler's transaction (and the write lock it takes) starts
                    # with the handler's first statement; the instance stays loaded.
                    source = self.load_apart(
                        session, worker, task.source, task.source_id, held.read
                    )
                elif early is None:
                    source = self._load_first(session, worker, task, held.write)
                session._dbworker_guarded = True
                if source is None:
                    raise LookupError(
                        f"source row {task.source_id!r} of {task.source.__name__} no longer exists"
                    )
                outcome = task.handler(source, session)
                if session._dbworker_misuse is not None:
                    raise HandlerContractError(
                        f"{session._dbworker_misuse}; dbworker owns the session's commit and "
                        "cleanup"
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
                if (
                    parted is not None
                    and self.endings is not None
                    and self.dialect.group_commit
                    and not held.holding()
                ):
                    # It holds no transaction: its ending goes with others', and its
                    # thread takes its next task meanwhile.
                    session._dbworker_guarded = False
                    session._dbworker_lend = None
                    session.bind = None
                    self.endings.submit(Parting(task, worker, session, outcome), parted)
                    handed = True
                    return None
                with self.ending.turn(holding=held.holding()):
                    if not held.holding() and not _has_changes(session):
                        # The handler sent no statement (its row was read apart) and
                        # left nothing to flush: the status change is all there is to
                        # commit, in a transaction of its own.
                        session._dbworker_guarded = False
                        if self.deferred is not None and kind is ResultKind.FINISHED:
                            self.deferred.append(task)  # recorded with the group's others
                            return Result(task.key, kind)
                        done = self.dialect.record_alone(
                            held.write, worker, task.source_id, task.token, decision
                        )
                        return Result(task.key, kind if done else ResultKind.LOST)
                    # The handler's own writes first: their errors are the handler's,
                    # and the execution row is then locked only for the final statement.
                    session.flush()
                    done = self.dialect.record(
                        session.connection(), worker, task.source_id, task.token, decision
                    )
                    session._dbworker_guarded = False
                    if not done:
                        session.rollback()
                        return Result(task.key, ResultKind.LOST)
                    session.commit()
                return Result(task.key, kind)
            except Exception as exc:
                session._dbworker_guarded = False
                # The connection may be gone; the failure recorded below says why.
                with contextlib.suppress(Exception):
                    session.rollback()
                return self.record_failure(task, worker, exc)
        finally:
            if not handed:  # a parting's session is closed after its batch
                session.close()

    def _load_first(
        self, session: HandlerSession, worker: WorkerTable, task: Task, bind: Connection
    ) -> Any:
        """The task's row, loaded into ``session`` before its handler runs: as a
        statement of its own on the handler's connection where the dialect sends one so
        (``Dialect.autocommitting``), so that the handler's transaction begins with its
        first statement; otherwise in that transaction."""
        with self.dialect.autocommitting(bind) as alone:
            if not alone:
                return self.load(session, worker, task.source, task.source_id)
            # Begun (no BEGIN is sent) for the check of a connection that idled
            # (``dialects.liveness``), which a begin runs.
            with bind.begin():
                return self.load_apart(session, worker, task.source, task.source_id, bind)

    def record_failure(self, task: Task, worker: WorkerTable, exc: BaseException) -> Result:
        failure = HandlerFailure.of(task, exc, transient=self.dialect.is_transient(exc))
        try:
            with self.engine.begin() as conn:
                done = self.dialect.record(
                    conn, worker, task.source_id, task.token, failure.decision, failure.info
                )
        except Exception as db_exc:  # the coordinator will record it instead
            return failure.unrecorded(db_exc)
        return failure.written(done)


def _has_changes(session: Session) -> bool:
    """Whether a flush of ``session`` could write anything."""
    return bool(session.new or session.dirty or session.deleted)
