"""Source rows read together: the asyncio executor's invocations that start about the
same time read their rows in one statement.

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

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import Session

from .batches import AsyncBatches
from .loading import SourceLoader

#: Reads under way at once.
READS_AT_ONCE = 2
#: Rows one read takes at most.
READ_MAX_ROWS = 100


@dataclass(eq=False, slots=True)
class _Wanted:
    loader: SourceLoader
    session: Session
    source_id: Any
    found: Any = None
    error: BaseException | None = None
    ended: bool = False


class AsyncReads:
    """Reads of source rows together, on an event loop (see the module's docstring)."""

    def __init__(
        self,
        reader: Callable[[], Awaitable[tuple[AsyncConnection, bool]]],
        keep: Callable[[AsyncConnection], None],
    ) -> None:
        self._reader = reader
        self._keep = keep
        self._batches: AsyncBatches[_Wanted] = AsyncBatches(
            self._read_batch, READS_AT_ONCE, READ_MAX_ROWS
        )

    async def load(self, loader: SourceLoader, session: Session, source_id: Any) -> Any:
        """The row ``source_id`` as ``session`` holds it (None if it is gone)."""
        wanted = _Wanted(loader, session, source_id)
        self._batches.add(wanted)
        await self._batches.wait(wanted, settle_first=False)
        if wanted.error is not None:
            raise wanted.error
        return wanted.found

    async def _read_batch(self, batch: list[_Wanted]) -> None:
        try:
            await self._read(batch)
        except Exception as exc:
            for wanted in batch:
                wanted.error = exc
        finally:
            for wanted in batch:
                wanted.ended = True

    async def _read(self, batch: list[_Wanted]) -> None:
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


def _read_all(read: Connection, batch: Sequence[_Wanted]) -> None:
    """Inside ``run_sync``: each source's rows in one statement where its mapping allows."""
    by_loader: dict[int, list[_Wanted]] = {}
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
