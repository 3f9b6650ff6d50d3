"""Items that go together in batches on an event loop (``reading.py``'s reads,
``together.py``'s endings): a lone item goes at once; the rest of a burst queue
meanwhile and go in the next batch.

``add`` queues an item and, while fewer than ``at_once`` batches are under way, starts
one: a task of its own (cancelling an item's waiter never interrupts a batch), which
takes up to ``most`` waiting items at a time and runs ``run_batch`` on them until
none wait. ``run_batch`` settles each item it took (sets its ``ended``), even when it
fails. ``wait`` returns once an item is settled.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar


class Settled(Protocol):
    ended: bool


T = TypeVar("T", bound=Settled)


class AsyncBatches(Generic[T]):
    def __init__(
        self, run_batch: Callable[[list[T]], Awaitable[None]], at_once: int, most: int
    ) -> None:
        self._run_batch = run_batch
        self._at_once = at_once
        self._most = most
        self.waiting: collections.deque[T] = collections.deque()
        self._ended: asyncio.Event | None = None
        #: Batches under way, counted in the same step as a batch's last look at
        #: ``waiting`` (a task's done callback would come a pass of the loop later).
        self._active = 0
        self._runs: set[asyncio.Task[None]] = set()

    def add(self, item: T) -> None:
        self.waiting.append(item)
        if self._active < self._at_once:
            self._active += 1
            run = asyncio.get_running_loop().create_task(self._run())
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)

    async def wait(self, item: T, *, settle_first: bool) -> None:
        """Until ``item`` is settled. Cancelled while it waits for a batch, it leaves
        the queue; cancelled in a batch under way, it waits for that batch first when
        ``settle_first`` (what the batch did to it is known), then is cancelled."""
        try:
            await self._settled(item)
        except asyncio.CancelledError:
            if item in self.waiting:
                self.waiting.remove(item)
            elif settle_first:
                while not item.ended:
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._settled(item)
            raise

    async def _settled(self, item: T) -> None:
        while not item.ended:
            if self._ended is None:
                self._ended = asyncio.Event()
            await self._ended.wait()

    async def _run(self) -> None:
        try:
            while self.waiting:
                count = min(len(self.waiting), self._most)
                batch = [self.waiting.popleft() for _ in range(count)]
                try:
                    await self._run_batch(batch)
                finally:
                    ended, self._ended = self._ended, None
                    if ended is not None:
                        ended.set()
        finally:
            self._active -= 1

    async def close(self) -> None:
        """Wait for batches under way (before the engine is disposed of)."""
        if self._runs:
            await asyncio.gather(*self._runs, return_exceptions=True)
