"""Endings together: invocations of one process (the asyncio and threads executors)
that end about the same time commit in one transaction, a savepoint each.

I/O-bound handlers started together end together: a wave of them. Each ending alone
is a transaction of its own (its flush, the fenced status change, a COMMIT with its
flush to disk), and a wave's endings queue for the event loop and the server one after
the other.

Which endings: one whose handler holds no transaction when it returns. Its row was
read apart (``AsyncRuntime`` reads it so; threads where the dialect does,
``Dialect.source_read_apart``) and it sent no statement since, or it released its
transaction (``session.rollback()``): all it has left is what its
session would flush. It is handed over as a ``Parting``, and its slot takes the next
task at once (``multiplexed_child``). Only where the dialect groups commits
(``Dialect.group_commit``: not SQLite, whose one writer gains nothing, nor a Galera
node, where a COMMIT that loses certification would run every handler again). A
handler that holds a transaction ends alone, as before: its locks and its snapshot
are its own, and would be held for the others' endings too.

How: as a group commit ends its items (``group.py``). One transaction on one
connection; each parting's session joins it in a savepoint of its own, where its
writes are flushed and an UNFINISH is recorded, fenced (a lost claim rolls back that
savepoint only: ``LOST``); the FINISHes are recorded together before the COMMIT
(``Dialect.finish_all``). A flush that raises is that handler's: its savepoint is
rolled back and its failure recorded in another. Where a parting's session holds only
new objects of a plain mapping and nobody listens for its flush, they are written with
Core INSERTs instead (``plain_inserts.py``), and the finished partings of a batch
that write the same columns of one table in one statement, in a savepoint of its own:
if it fails, each of them is written alone, as above. The common batch, where every
parting finished and they all write the same columns of one table, has no savepoint
at all (``_end_in_one``: BEGIN, the INSERT, the FINISHes, COMMIT); if its INSERT
fails, the batch is rolled back and ends again as above. When the transaction fails as a
whole (``finish_all`` matched fewer rows, so a claim was lost; the connection; the
COMMIT), nothing of it is known to have committed, and each parting's invocation runs
again alone from the start (its handler called again, as a group's items are), where
one whose work did commit after all finds its claim spent and commits nothing twice.

Who runs them, on the event loop (``AsyncPartings``): while fewer than
``ENDING_AT_ONCE`` batches are under way, a parting starts one, which takes every
parting waiting (at most ``GROUP_MAX_ITEMS``); the others wait for their result. A
lone ending is thus not delayed, and the rest of a wave queue meanwhile and go in the
next batch.

On threads (``ThreadEndings``) the handler's thread hands its parting over and takes
its next task; threads of their own commit the batches and send each result. (A
thread that waited for its batch could not start its next task meanwhile:
``benchmarks.io`` drained later that way than with endings in turns, 2.09-2.10 s
against 2.00-2.08.)
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Insert
from sqlalchemy.ext.asyncio import AsyncConnection

from ..core.outcomes import Finished, Unfinished
from ..core.policy import Ending, decide
from ..core.tasks import Result, ResultKind, Task
from ..dialects import Dialect, WorkerTable
from .batches import AsyncBatches
from .group import (
    GROUP_MAX_ITEMS,
    ClaimLost,
    GroupBroken,
    end_in_savepoint,
    record_failure_in,
    roll_back_item,
)
from .plain_inserts import PlainInserts
from .savepoints import commit_kept, driver_savepoints
from .session import HandlerSession
from .turns import ENDING_AT_ONCE


@dataclass(eq=False, slots=True)
class Parting:
    """An invocation whose handler returned ``outcome`` holding no transaction: what
    its ``session`` would flush, to be committed with the status change."""

    task: Task
    worker: WorkerTable
    session: HandlerSession
    outcome: Finished | Unfinished
    #: Set once its batch is over: its result, or None to run it again alone.
    result: Result | None = None
    ended: bool = False


def end_together(dialect: Dialect, conn: Connection, partings: Sequence[Parting]) -> list[Result]:
    """Commit ``partings`` in one transaction on ``conn`` (see the module's docstring);
    their results, in order. Raises when the transaction failed as a whole (rolled
    back): then none of them ended."""
    driver_savepoints(conn.engine)
    planned = [(parting, _PLAIN.rows(parting.session)) for parting in partings]
    whole = _in_one_statement(planned)
    if whole is not None and _end_in_one(dialect, conn, whole, partings):
        return [Result(parting.task.key, ResultKind.FINISHED) for parting in partings]
    results: list[Result] = []
    finishing: dict[int, tuple[WorkerTable, list[Task]]] = {}
    with _rolled_back_on_error(conn):
        conn.begin()
        ended: dict[int, Result] = {}
        for group in _plain_groups(planned):
            ended.update(_end_plain_group(dialect, conn, group, finishing))
        for index, (parting, writes) in enumerate(planned):
            if index in ended:
                results.append(ended[index])
                continue
            session = parting.session
            # It holds no connection: its flush joins this transaction, in a savepoint.
            session.bind = conn
            session.join_transaction_mode = "create_savepoint"
            _, finished = finishing.setdefault(id(parting.worker.table), (parting.worker, []))
            try:
                if writes is not None:
                    result = _end_plainly(dialect, writes, parting, conn, finished)
                else:
                    result = end_in_savepoint(
                        dialect,
                        session,
                        parting.task,
                        parting.worker,
                        conn,
                        parting.outcome,
                        finished,
                    )
            except GroupBroken:
                raise
            except Exception as exc:
                session._dbworker_guarded = False
                if writes is None:  # a plain ending rolled its savepoint back already
                    roll_back_item(session)
                result = record_failure_in(dialect, parting.task, parting.worker, conn, exc)
            results.append(result)
        _finish_and_commit(dialect, conn, finishing)
    return results


def _in_one_statement(
    planned: Sequence[tuple[Parting, tuple[Insert, list[dict[str, Any]]] | None]],
) -> tuple[Insert, list[dict[str, Any]]] | None:
    """The INSERT and all its rows when every parting of a batch finished and writes
    plain inserts of one statement with the same columns; else None."""
    statement: Insert | None = None
    columns: tuple[str, ...] | None = None
    rows: list[dict[str, Any]] = []
    for parting, writes in planned:
        if writes is None or not isinstance(parting.outcome, Finished):
            return None
        insert_, own = writes
        for row in own:
            keys = tuple(sorted(row))
            if statement is None:
                statement, columns = insert_, keys
            elif insert_ is not statement or keys != columns:
                return None
        rows.extend(own)
    return None if statement is None else (statement, rows)


def _end_in_one(
    dialect: Dialect,
    conn: Connection,
    whole: tuple[Insert, list[dict[str, Any]]],
    partings: Sequence[Parting],
) -> bool:
    """The common batch, with no savepoint: BEGIN, one INSERT of every parting's rows,
    the FINISHes, COMMIT (a savepoint and its release were two round trips of six).
    True once committed. False when the INSERT failed (one row's constraint, say): it
    was rolled back, nothing of the batch is written, and the batch ends again a
    savepoint each, where a failure is its own parting's. Raises, as ``end_together``,
    when the transaction failed otherwise."""
    statement, rows = whole
    with _rolled_back_on_error(conn):
        conn.begin()
        try:
            dialect.insert_rows(conn, statement, rows)
        except Exception:
            conn.rollback()
            return False
        finishing: dict[int, tuple[WorkerTable, list[Task]]] = {}
        for parting in partings:
            _, tasks = finishing.setdefault(id(parting.worker.table), (parting.worker, []))
            tasks.append(parting.task)
        _finish_and_commit(dialect, conn, finishing)
    return True


@contextlib.contextmanager
def _rolled_back_on_error(conn: Connection) -> Iterator[None]:
    """A batch's transaction on ``conn``, rolled back if anything in it raises."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            conn.rollback()
        raise


def _finish_and_commit(
    dialect: Dialect, conn: Connection, finishing: dict[int, tuple[WorkerTable, list[Task]]]
) -> None:
    """A batch's FINISHes, one statement per worker, then its COMMIT; ``ClaimLost`` when
    one matched fewer rows than it named."""
    for worker, tasks in finishing.values():
        held = [(task.source_id, task.token) for task in tasks]
        if held and dialect.finish_all(conn, worker, held) != len(held):
            raise ClaimLost()
    conn.commit()


#: Partings whose writes go in one statement: (their index in the batch, the parting,
#: its rows), all with the same INSERT and the same columns.
_PlainGroup = tuple[Insert, list[tuple[int, Parting, list[dict[str, Any]]]]]


def _plain_groups(
    planned: Sequence[tuple[Parting, tuple[Insert, list[dict[str, Any]]] | None]],
) -> list[_PlainGroup]:
    """The finished partings of a batch whose writes are plain inserts, by statement and
    columns: each group's rows go in one executemany (two at least)."""
    groups: dict[tuple[int, tuple[str, ...]], _PlainGroup] = {}
    for index, (parting, writes) in enumerate(planned):
        if writes is None or not isinstance(parting.outcome, Finished):
            continue
        statement, rows = writes
        columns = {tuple(sorted(row)) for row in rows}
        if len(columns) != 1:
            continue
        key = (id(statement), columns.pop())
        groups.setdefault(key, (statement, []))[1].append((index, parting, rows))
    return [group for group in groups.values() if len(group[1]) > 1]


def _end_plain_group(
    dialect: Dialect,
    conn: Connection,
    group: _PlainGroup,
    finishing: dict[int, tuple[WorkerTable, list[Task]]],
) -> dict[int, Result]:
    """Write a group's rows in one statement, in a savepoint of their own: their
    results by index. If it fails (one row's constraint, say), the savepoint is rolled
    back and nothing is ended here: each parting then ends alone, where a failure is
    its own."""
    statement, members = group
    savepoint = conn.begin_nested()
    try:
        dialect.insert_rows(conn, statement, [row for _, _, rows in members for row in rows])
    except Exception:
        roll_back_item(savepoint)
        return {}
    commit_kept(conn, savepoint.commit)
    ended: dict[int, Result] = {}
    for index, parting, _ in members:
        _, finished = finishing.setdefault(id(parting.worker.table), (parting.worker, []))
        finished.append(parting.task)
        ended[index] = Result(parting.task.key, ResultKind.FINISHED)
    return ended


def _end_plainly(
    dialect: Dialect,
    writes: tuple[Insert, list[dict[str, Any]]],
    parting: Parting,
    conn: Connection,
    finished: list[Task],
) -> Result:
    """``end_in_savepoint`` for a parting whose writes are plain inserts
    (``plain_inserts.py``): they run in a savepoint of their own, with an UNFINISH
    fenced there; a FINISH is left to ``finished``. An exception is the item's, its
    savepoint rolled back already."""
    task = parting.task
    statement, rows = writes
    savepoint = conn.begin_nested()
    try:
        for row in rows:
            conn.execute(statement, row)
        if isinstance(parting.outcome, Unfinished):
            decision = decide(Ending.UNFINISHED, delay=parting.outcome.delay)
            if not dialect.record(conn, parting.worker, task.source_id, task.token, decision):
                roll_back_item(savepoint)
                return Result(task.key, ResultKind.LOST)
    except BaseException:
        roll_back_item(savepoint)
        raise
    commit_kept(conn, savepoint.commit)  # as a flushed session's: the COMMIT ends it
    if isinstance(parting.outcome, Unfinished):
        return Result(task.key, ResultKind.UNFINISHED)
    finished.append(task)
    return Result(task.key, ResultKind.FINISHED)


#: Which mappings' new objects a parting's ending inserts without the ORM's flush.
_PLAIN = PlainInserts()


def _settle(batch: Sequence[Parting], results: Sequence[Result] | None) -> None:
    for index, parting in enumerate(batch):
        parting.result = None if results is None else results[index]
        parting.ended = True


class ThreadEndings:
    """Endings together for the threads executor: ``submit`` hands a parting over and
    returns at once; ``at_once`` threads of their own commit the partings in batches on
    connections from ``connect`` and hand each result to the parting's ``deliver``. A
    parting whose batch failed as a whole is run again alone (``rerun``) there."""

    def __init__(
        self,
        dialect: Callable[[], Dialect],
        connect: Callable[[], Connection],
        rerun: Callable[[Task], Result],
        at_once: int = ENDING_AT_ONCE,
    ) -> None:
        self._dialect = dialect
        self._connect = connect
        self._rerun = rerun
        self._at_once = at_once
        self._changed = threading.Condition()
        self._waiting: collections.deque[Parting] = collections.deque()
        self._deliver: dict[int, Callable[[Result], None]] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, parting: Parting, deliver: Callable[[Result], None]) -> None:
        with self._changed:
            if not self._threads:
                for number in range(self._at_once):
                    thread = threading.Thread(
                        target=self._serve, name=f"dbworker-endings-{number}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
            self._deliver[id(parting)] = deliver
            self._waiting.append(parting)
            self._changed.notify()

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._closed:
                    self._changed.wait()
                if not self._waiting:
                    return
                batch = _take(self._waiting)
                delivers = [self._deliver.pop(id(parting)) for parting in batch]
            results: list[Result] | None = None
            try:
                with self._connect() as conn:
                    results = end_together(self._dialect(), conn, batch)
            except Exception:
                results = None
            for index, (parting, deliver) in enumerate(zip(batch, delivers, strict=True)):
                with contextlib.suppress(Exception):
                    parting.session.close()
                if results is None:
                    deliver(self._rerun(parting.task))
                else:
                    deliver(results[index])

    def close(self) -> None:
        """Commit what waits, then let the threads end."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout=30)


def _take(waiting: collections.deque[Parting]) -> list[Parting]:
    return [waiting.popleft() for _ in range(min(len(waiting), GROUP_MAX_ITEMS))]


class AsyncPartings:
    """Endings together on an event loop: each batch is a task of its own, on a
    connection of its own, so that cancelling one invocation (its timeout, a stop)
    never interrupts the others' COMMIT."""

    def __init__(
        self,
        dialect: Dialect,
        connect: Callable[[], Awaitable[AsyncConnection]],
        give_back: Callable[[AsyncConnection, bool], Awaitable[None]],
        at_once: int = ENDING_AT_ONCE,
    ) -> None:
        self._dialect = dialect
        self._connect = connect
        self._give_back = give_back
        self._batches: AsyncBatches[Parting] = AsyncBatches(
            self._end_batch, at_once, GROUP_MAX_ITEMS
        )

    async def end(self, parting: Parting) -> Result | None:
        """``parting``'s result once committed with others, or None: it must run again
        alone. Cancelled while its batch runs, it waits for that batch first."""
        self._batches.add(parting)
        await self._batches.wait(parting, settle_first=True)
        return parting.result

    async def _end_batch(self, batch: list[Parting]) -> None:
        results: list[Result] | None = None
        conn = None
        try:
            conn = await self._connect()
            results = await conn.run_sync(end_together_on, self._dialect, batch)
        except Exception:
            results = None
        finally:
            if conn is not None:
                await self._give_back(conn, results is not None)
            _settle(batch, results)

    async def close(self) -> None:
        """Wait for batches under way (before the engine is disposed of)."""
        await self._batches.close()


def end_together_on(
    conn: Connection, dialect: Dialect, partings: Sequence[Parting]
) -> list[Result]:
    """``end_together`` in ``run_sync``'s argument order."""
    return end_together(dialect, conn, partings)
