"""Group commit: consecutive short invocations in one transaction, one COMMIT.

When several claimed items wait for a handler process and recent invocations were
short (the pool's prefetch policy decides, ``executors/prefetch.py``), the process
runs them one after another in one transaction on its kept connection, each in a
SAVEPOINT of its own, and commits once:

- Each item runs as on the single path (``Runtime._invoke``): load, handler, flush,
  and an UNFINISH fenced at once, all inside the item's savepoint, which is kept when
  that matched and rolled back when it did not (the claim was lost: ``LOST``) or when
  the handler raised. The finished items are recorded together just before the
  COMMIT, in one UPDATE fenced by each item's (source id, token) pair
  (``Dialect.finish_all``): a round trip per item less. If it matches fewer rows than
  there are finished items, a claim was lost: the group is rolled back as a whole and
  each of its items runs again alone, where the lost one finds its claim spent. A
  raising handler's failure is then recorded, fenced, in a savepoint of its own in
  the same transaction: the handler's writes are gone, the FAIL or RETRY commits
  with the group.
- Where the driver can send a statement as a transaction of its own
  (``Dialect.autocommitting``: PostgreSQL through psycopg, whose BEGIN is a round
  trip), the rows are read so, and when no item sent a statement after them, the
  FINISH of all is so too and names the rows it matched: the group then costs two
  round trips, not four, and an item it did not match (its claim was lost) wrote
  nothing and is told ``LOST``, while the others' FINISH stands.
- Results are handed back only after the COMMIT. A process that dies mid-group
  commits nothing of it; its items are still held under their tokens and run again
  (the pool runs each of them alone then, so a crash is charged to the item that
  caused it). Nothing is reported that a crash could still roll back.
- The group stops growing after ``GROUP_SECONDS`` of work or ``GROUP_MAX_ITEMS``
  items, so a transaction (on SQLite, the database's write lock) is never held long
  by design; an idle process gets one item at a time and takes the single path.
- ``session.rollback()`` is allowed to a handler and ends its transaction (the
  single path begins a new one for what follows). Inside a group it would end every
  earlier item's work too, and a savepoint's rollback keeps the locks the handler
  wanted to let go of. So a grouped handler that calls it is stopped right there
  (``_RunsAlone``), its savepoint rolled back, the group committed without it, and
  it runs again alone; its worker's items are not grouped again in this process.
- When the group's transaction fails as a whole (the connection dropped, MariaDB
  rolled a deadlock's whole transaction back and the savepoint is gone, the COMMIT
  failed), nothing of it is known to have committed: each item that ran in it runs
  again alone on the single path, which records whatever happens then. Every fenced
  write carries the item's token, so an item whose work did commit after all finds
  its claim spent (``LOST``) and commits nothing twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection

from ..core.errors import HandlerContractError
from ..core.outcomes import Finished, Unfinished
from ..core.policy import Ending, decide
from ..core.tasks import Result, ResultKind, Task, TaskKey
from ..dialects import Dialect, WorkerTable
from .failures import HandlerFailure
from .savepoints import commit_kept, driver_savepoints, savepoints_begun
from .session import HandlerSession, listened

if TYPE_CHECKING:
    from .runtime import Runtime

#: At most this many items per transaction.
GROUP_MAX_ITEMS = 16
#: No item is added to a group that has already run this long.
GROUP_SECONDS = 0.02


class _RunsAlone(BaseException):
    """Raised from a grouped handler's ``session.rollback()``. A BaseException, so
    that a handler's ``except Exception`` does not swallow it."""


class GroupedSession(HandlerSession):
    """A handler's session inside a group: a SAVEPOINT of the group's transaction
    (``join_transaction_mode="create_savepoint"``), whose rollback by the handler
    takes the item out of the group."""

    _dbworker_released = False

    def rollback(self) -> None:
        if self._dbworker_guarded:
            self._dbworker_released = True
            raise _RunsAlone()
        super().rollback()


class ClaimLost(Exception):
    """A finished item's claim was lost before the group's COMMIT: nothing of the group
    commits, and each of its items runs again alone."""


class GroupBroken(Exception):
    """The group's transaction can no longer be trusted (a savepoint could not be
    rolled back): nothing of it may commit."""


def run_group(
    runtime: Runtime, tasks: Sequence[Task], withdrawn: Callable[[TaskKey], bool]
) -> list[Result]:
    """Run ``tasks`` (one worker's, in claim order) as far as a group allows, and
    return the results of those that ran, in order, once their transaction committed.

    At least the first task runs. ``withdrawn(key)`` is asked before each later one:
    True (the coordinator withdrew it, or wants the process back) ends the group
    before it. Tasks left over are the caller's to run next.
    """
    first = tasks[0]
    if len(tasks) < 2 or first.worker in runtime.alone:
        return [runtime.run(first)]
    worker = runtime.prepare(first.worker, first.source, first.keyed)
    try:
        driver_savepoints(runtime.engine)
        held = runtime.held.take()
    except Exception:
        return [runtime.run(first)]  # the single path meets it again and reports it
    conn = held.write
    pending: list[Result] = []
    finished: list[Task] = []
    started = time.monotonic()
    ran = 0
    read: dict[TaskKey, tuple[GroupedSession, Any]] = {}
    try:
        conn.begin()
        savepoints_begun(conn, forget=True)
        with runtime.dialect.autocommitting(conn):  # it reads consistently by itself
            read = _read_rows(runtime, worker, conn, tasks[:GROUP_MAX_ITEMS])
        for task in tasks[:GROUP_MAX_ITEMS]:
            if pending and (
                time.monotonic() - started > GROUP_SECONDS
                or task.worker != first.worker
                or task.worker in runtime.alone
                or withdrawn(task.key)
            ):
                break
            ran += 1
            began = time.monotonic()
            early = read.pop(task.key, None)
            if early is not None and savepoints_begun(conn):
                # An item before it sent statements (it began a savepoint), which may
                # have changed this row: it is read again, after them.
                runtime.writing.add(task.worker)
                early[0].close()
                early = None
            result = _run_item(runtime, task, worker, conn, finished, early)
            if result is None:  # it released its transaction: it runs alone, later
                ran -= 1
                runtime.alone.add(task.worker)
                break
            pending.append(replace(result, duration=time.monotonic() - began))
        committing = time.monotonic()
        if finished:
            pending = _finish(runtime.dialect, conn, worker, finished, pending)
        conn.commit()
    except Exception:
        runtime.held.drop()  # rolled back with the connection, whatever state it is in
        return [runtime.run(task) for task in tasks[: max(ran, 1)]]
    except BaseException:
        runtime.held.drop()
        raise
    finally:
        for session, _ in read.values():  # read for items the group stopped before
            session.close()
    runtime.held.done()
    if not pending:  # the first released its transaction: the single path runs it
        return [runtime.run(first)]
    share = (time.monotonic() - committing) / len(pending)
    return [replace(result, duration=result.duration + share) for result in pending]


def _finish(
    dialect: Dialect,
    conn: Connection,
    worker: WorkerTable,
    finished: list[Task],
    pending: list[Result],
) -> list[Result]:
    """Record the ``finished`` items of the group on ``conn``, just before its COMMIT;
    ``pending`` with the items whose claim was lost, if any, told LOST.

    When no item sent a statement (the driver connection holds no transaction: the
    rows were read by a statement of their own), the FINISH of all is all there is to
    commit, and it is a transaction of its own (``Dialect.autocommitting``): an item
    whose claim was lost is one it did not match, and it wrote nothing. Otherwise the
    FINISH joins the items' writes, and a lost claim rolls the group back (``ClaimLost``).
    """
    held = [(task.source_id, task.token) for task in finished]
    with dialect.autocommitting(conn) as alone:
        if alone:
            matched = dialect.finish_all_returning(conn, worker, held)
            lost = {task.key for task in finished if task.source_id not in matched}
            return [
                replace(result, kind=ResultKind.LOST) if result.task_key in lost else result
                for result in pending
            ]
    if dialect.finish_all(conn, worker, held) != len(finished):
        raise ClaimLost()
    return pending


def _session(conn: Connection) -> GroupedSession:
    return GroupedSession(
        bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False
    )


def _read_rows(
    runtime: Runtime, worker: WorkerTable, conn: Connection, tasks: Sequence[Task]
) -> dict[TaskKey, tuple[GroupedSession, Any]]:
    """The rows of the items the group may run, read in one statement as it begins,
    each into the session its item will get (task key -> session, row or None if
    gone); empty if the mapping needs the ORM's load. Read by each item in its own
    savepoint instead, a no-op handler's item cost two round trips (the SAVEPOINT
    and the SELECT) and now costs none: its savepoint begins with the handler's
    first statement, if any. The row is at most ``GROUP_SECONDS`` older, read in the
    same transaction. Once an item has sent statements (which may have written a later
    item's row), the later items read theirs again, and the worker's groups read by
    item from then on (``Runtime.writing``)."""
    first = tasks[0]
    if first.worker in runtime.writing:
        return {}
    same = [task for task in tasks if task.worker == first.worker]
    sessions = [_session(conn) for _ in same]
    wanted = [(session, task.source_id) for session, task in zip(sessions, same, strict=True)]
    found = runtime.load_many(wanted, worker, first.source, conn)
    if found is None:
        for session in sessions:
            session.close()
        return {}
    return {
        task.key: (session, row) for task, session, row in zip(same, sessions, found, strict=True)
    }


def _run_item(
    runtime: Runtime,
    task: Task,
    worker: WorkerTable,
    conn: Connection,
    finished: list[Task],
    read: tuple[GroupedSession, Any] | None = None,
) -> Result | None:
    """One item in its own savepoint of the group's transaction on ``conn``; None if
    its handler released its transaction (nothing of it is left). A finished item is
    added to ``finished``, to be recorded with the others before the COMMIT.
    ``read``: its session and row, read with the group's (``_read_rows``)."""
    with read[0] if read is not None else _session(conn) as session:
        try:
            if read is not None:
                source = read[1]
            else:
                source = runtime.load(session, worker, task.source, task.source_id)
            session._dbworker_guarded = True
            if source is None:
                raise LookupError(
                    f"source row {task.source_id!r} of {task.source.__name__} no longer exists"
                )
            outcome = task.handler(source, session)
            if session._dbworker_released:
                raise _RunsAlone()  # it caught the first one
            if session._dbworker_misuse is not None:
                raise HandlerContractError(
                    f"{session._dbworker_misuse}; dbworker owns the session's commit and cleanup"
                )
            if not isinstance(outcome, Finished | Unfinished):
                raise HandlerContractError(
                    f"handler of worker {task.worker!r} returned {outcome!r}; it must "
                    "return Finished() or Unfinished()"
                )
            return end_in_savepoint(runtime.dialect, session, task, worker, conn, outcome, finished)
        except _RunsAlone:
            session._dbworker_guarded = False
            roll_back_item(session)
            return None
        except GroupBroken:
            raise
        except Exception as exc:
            session._dbworker_guarded = False
            roll_back_item(session)
            return record_failure_in(runtime.dialect, task, worker, conn, exc)


def end_in_savepoint(
    dialect: Dialect,
    session: HandlerSession,
    task: Task,
    worker: WorkerTable,
    conn: Connection,
    outcome: Finished | Unfinished,
    finished: list[Task],
) -> Result:
    """After the handler returned ``outcome``: its writes flushed in its savepoint of
    the transaction on ``conn``; an UNFINISH recorded there, fenced (its savepoint
    rolled back if the claim was lost); a FINISH left to ``finished``, recorded with
    the others before the COMMIT. The savepoint is kept for the COMMIT. An exception
    is the item's, for the caller to roll its savepoint back and record."""
    session.flush()
    if isinstance(outcome, Finished):
        finished.append(task)
        kind = ResultKind.FINISHED
    else:
        decision = decide(Ending.UNFINISHED, delay=outcome.delay)
        kind = ResultKind.UNFINISHED
        if not dialect.record(session.connection(), worker, task.source_id, task.token, decision):
            session._dbworker_guarded = False
            roll_back_item(session)
            return Result(task.key, ResultKind.LOST)
    session._dbworker_guarded = False
    # A session that began no savepoint (it sent no statement) has nothing to commit:
    # unless someone listens for its transaction's end, its commit would only run the
    # ORM's bookkeeping (8-9 µs, about a sixteenth of a no-op item's CPU here).
    if conn.in_nested_transaction() or listened(session.dispatch, _END_EVENTS):
        commit_kept(conn, session.commit)
    return Result(task.key, kind)


#: Session events a commit fires, or a close in its place: while any is listened for,
#: a session's commit is not left out.
_END_EVENTS = (
    "before_commit",
    "after_commit",
    "after_rollback",
    "after_soft_rollback",
    "after_transaction_end",
)


class _RollsBack(Protocol):
    def rollback(self) -> None: ...


def roll_back_item(item: _RollsBack) -> None:
    """Roll the item's savepoint back (its session's, or the ``NestedTransaction``
    itself); if that fails, the group's transaction is gone (MariaDB rolls a
    deadlock's whole transaction back, savepoints included)."""
    try:
        item.rollback()
    except Exception as exc:
        raise GroupBroken() from exc


def record_failure_in(
    dialect: Dialect, task: Task, worker: WorkerTable, conn: Connection, exc: Exception
) -> Result:
    """Record a grouped handler's failure as the single path does
    (``Runtime.record_failure``), but in a savepoint of the group's transaction: a
    transaction of its own would wait for the group's locks (on SQLite, its write
    lock) until the group committed."""
    failure = HandlerFailure.of(task, exc, transient=dialect.is_transient(exc))
    savepoint = conn.begin_nested()
    try:
        done = dialect.record(
            conn, worker, task.source_id, task.token, failure.decision, failure.info
        )
    except Exception as db_exc:  # the coordinator will record it instead
        roll_back_item(savepoint)
        return failure.unrecorded(db_exc)
    savepoint.commit()
    return failure.written(done)
