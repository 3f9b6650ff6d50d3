"""Source rows read together: the asyncio executor's invocations that start about the
same time read their rows in one statement; the rows of tasks waiting for a slot are
read ahead, on the event loop (``AsyncRuntime.read_ahead``) or by a thread of the
threads executor's process (``ThreadReads``).

Tasks arrive in bursts (a claim's worth, or a wave of I/O-bound handlers whose
waits ended together, each slot taking its next task at once). Read one by one,
each row is a trip through the greenlet and a round trip, and the last of a wave of
50 started 60 ms after the first (``benchmarks.io``). Here a read that finds fewer
than ``READS_AT_ONCE`` under way starts one, which takes every read waiting (of any
source) and reads each source's rows with one ``SELECT ... WHERE key IN (...)`` on a
connection kept for reading apart (``SourceLoader.load_many_apart``; a mapping that
needs the ORM's load is read row by row there). A lone read is not delayed; the
rest of a burst queue meanwhile and go in the next.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import Session

from ..core.tasks import Task, TaskKey
from ..dialects import Dialect
from ..dialects.terms import READ_ONLY_OPTION
from .batches import AsyncBatches
from .loading import SourceLoader

#: Reads under way at once.
READS_AT_ONCE = 2
#: Rows one read takes at most.
READ_MAX_ROWS = 100


@dataclass(eq=False, slots=True)
class Wanted:
    loader: SourceLoader
    session: Session
    source_id: Any
    found: Any = None
    error: BaseException | None = None
    ended: bool = False


def reading_options(dialect: Dialect) -> dict[str, Any]:
    """Execution options of a connection kept for reading rows apart: read-only, and
    each statement committing by itself unless the dialect reads apart already."""
    options: dict[str, Any] = {READ_ONLY_OPTION: True}
    if not dialect.source_read_apart:
        options["isolation_level"] = "AUTOCOMMIT"
    return options


class AsyncReads:
    """Reads of source rows together, on an event loop (see the module's docstring)."""

    def __init__(
        self,
        reader: Callable[[], Awaitable[tuple[AsyncConnection, bool]]],
        keep: Callable[[AsyncConnection], None],
    ) -> None:
        self._reader = reader
        self._keep = keep
        self._batches: AsyncBatches[Wanted] = AsyncBatches(
            self._read_batch, READS_AT_ONCE, READ_MAX_ROWS
        )

    async def load(self, loader: SourceLoader, session: Session, source_id: Any) -> Any:
        """The row ``source_id`` as ``session`` holds it (None if it is gone)."""
        return await self.result(self.want(loader, session, source_id))

    def want(
        self, loader: SourceLoader, session: Session, source_id: Any, *, ahead: bool = False
    ) -> Wanted:
        """Queue the read of ``source_id`` into ``session``; ``result`` waits for it.
        ``ahead``: for a task that waits for a slot, read after the reads of tasks
        starting now, which it would delay (a wave after a quiet spell waited for the
        reads of the next two besides its own), until ``hurry``."""
        wanted = Wanted(loader, session, source_id)
        self._batches.add(wanted, later=ahead)
        return wanted

    def hurry(self, wanted: Wanted) -> None:
        """The read ``wanted`` (queued ``ahead``) is now for a task starting."""
        self._batches.hurry(wanted)

    def drop(self, wanted: Wanted) -> None:
        """The read ``wanted`` is not wanted any more (unless a batch took it already)."""
        self._batches.drop(wanted)

    async def result(self, wanted: Wanted) -> Any:
        await self._batches.wait(wanted, settle_first=False)
        if wanted.error is not None:
            raise wanted.error
        return wanted.found

    async def _read_batch(self, batch: list[Wanted]) -> None:
        try:
            await self._read(batch)
        except Exception as exc:
            for wanted in batch:
                wanted.error = exc
        finally:
            for wanted in batch:
                wanted.ended = True

    async def _read(self, batch: list[Wanted]) -> None:
        for attempt in range(2):
            read, kept = await self._reader()
            try:
                await read.run_sync(_read_all, batch)
            except Exception:
                with contextlib.suppress(Exception):
                    await read.invalidate()
                # One kept while the server restarted fails at its first use (no
                # transaction begins, where an idle connection would be pinged).
                if not kept or attempt:
                    raise
                continue
            self._keep(read)
            return

    async def close(self) -> None:
        """Wait for reads under way (before the engine is disposed of)."""
        await self._batches.close()


class ThreadReads:
    """Rows read ahead for the threads executor: ``add`` queues a task that waits for
    a thread, and a thread of its own reads the rows of what waits in one statement,
    on a connection kept for it (where each statement commits by itself, unless the
    dialect reads apart already). ``take`` gives the thread that starts the task its
    session with the row loaded, or None: the thread then reads the row itself, as
    without reading ahead (not read yet, failed, gone).

    Each thread read its own row as it started, in its transaction (BEGIN and SELECT
    on PostgreSQL and MariaDB), and a wave of 50 threads starting together queued
    for the GIL: the last started 30-40 ms after the first (``benchmarks.io``). Read
    ahead, a start sends nothing, and a handler that sends no statement holds no
    transaction, so its ending goes with others' (``together.py``).

    A task that starts at once is added ``starting``: its thread waits for the read,
    which goes before those of waiting tasks and without them. Each thread of a wave
    that started after a quiet spell read its own row, and the wave's starts spread
    over 27-40 ms (``benchmarks.io``)."""

    def __init__(
        self, connect: Callable[[], Connection], loader: Callable[[Task], SourceLoader]
    ) -> None:
        self._connect = connect
        self._loader = loader
        self._changed = threading.Condition()
        self._queued: collections.deque[Wanted] = collections.deque()
        self._starting: collections.deque[Wanted] = collections.deque()
        self._wanted: dict[TaskKey, Wanted] = {}
        self._thread: threading.Thread | None = None
        self._read: Connection | None = None
        self._closed = False

    def add(self, task: Task, session: Session, *, starting: bool = False) -> None:
        """Read ``task``'s row into ``session`` (an unbound handler's session)."""
        with self._changed:
            if self._closed or task.key in self._wanted:
                return
            wanted = Wanted(self._loader(task), session, task.source_id)
            self._wanted[task.key] = wanted
            (self._starting if starting else self._queued).append(wanted)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="dbworker-reads", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def take(self, key: TaskKey) -> tuple[Session, Any] | None:
        """The session and row read ahead for the task ``key``, once read; None if
        none was (or it failed, or found no row)."""
        with self._changed:
            wanted = self._wanted.pop(key, None)
            if wanted is None:
                return None
            if wanted in self._queued:  # not read yet: the thread reads it now itself
                self._queued.remove(wanted)
                return None
            # Under way, or starting: read next, before anything waiting.
            while not wanted.ended:
                self._changed.wait()
        if wanted.error is not None or wanted.found is None:
            return None
        return wanted.session, wanted.found

    def forget(self, key: TaskKey) -> None:
        """The task ``key`` will not start here: its read is not wanted."""
        with self._changed:
            wanted = self._wanted.pop(key, None)
            for queue in (self._starting, self._queued):
                if wanted is not None and wanted in queue:
                    queue.remove(wanted)

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not (self._starting or self._queued) and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                queue = self._starting or self._queued
                batch = [queue.popleft() for _ in range(min(len(queue), READ_MAX_ROWS))]
            try:
                if self._read is None:
                    self._read = self._connect()
                _read_all(self._read, batch)
            except Exception as exc:
                if self._read is not None:
                    with contextlib.suppress(Exception):
                        self._read.invalidate()
                        self._read.close()
                self._read = None
                for wanted in batch:
                    wanted.error = exc
            with self._changed:
                for wanted in batch:
                    wanted.ended = True
                self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            for wanted in self._wanted.values():
                wanted.ended = True
            self._wanted.clear()
            self._queued.clear()
            self._starting.clear()
            self._changed.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)
        if self._read is not None:
            with contextlib.suppress(Exception):
                self._read.close()
            self._read = None


def _read_all(read: Connection, batch: Sequence[Wanted]) -> None:
    """Inside ``run_sync``: each source's rows in one statement where its mapping allows."""
    by_loader: dict[int, list[Wanted]] = {}
    for wanted in batch:
        by_loader.setdefault(id(wanted.loader), []).append(wanted)
    for group in by_loader.values():
        loader = group[0].loader
        found = None
        if len(group) > 1:
            found = loader.load_many_apart([(w.session, w.source_id) for w in group], read)
        if found is None:
            found = [loader.load_apart(w.session, w.source_id, read) for w in group]
        for wanted, instance in zip(group, found, strict=True):
            wanted.found = instance
