"""Items that go together in batches on an event loop (``reading.py``'s reads,
``together.py``'s endings): a lone item goes at once; the rest of a burst queue
meanwhile and go in the next batch.

``add`` queues an item and, while fewer than ``at_once`` batches are under way, starts
one: a task of its own (cancelling an item's waiter never interrupts a batch), which
takes up to ``most`` waiting items at a time and runs ``run_batch`` on them until
none wait. ``run_batch`` settles each item it took (sets its ``ended``), even when it
fails. ``wait`` returns once an item is settled.

An item added ``later`` (a read for a task that waits for a slot) goes after every
other, and only in a batch that runs alone: it never takes the place, nor shares the
statement or the loop's time, of an item something waits on now (a handler's start).
``hurry`` makes it one of those once something does.
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
        self.later: collections.deque[T] = collections.deque()
        #: Who waits for each item (by id) to be settled. One ``asyncio.Event`` for
        #: every batch woke every waiter at each batch's end (50 a wave, twice or more).
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        #: Batches under way, counted in the same step as a batch's last look at
        #: ``waiting`` (a task's done callback would come a pass of the loop later).
        self._active = 0
        self._runs: set[asyncio.Task[None]] = set()

    def add(self, item: T, *, later: bool = False) -> None:
        (self.later if later else self.waiting).append(item)
        self._start()

    def hurry(self, item: T) -> None:
        """``item``, if added ``later`` and still waiting, goes with the others."""
        if item in self.later:
            self.later.remove(item)
            self.waiting.append(item)
            self._start()

    def drop(self, item: T) -> None:
        """``item`` is no longer wanted: it leaves the queue if no batch took it yet."""
        for queue in (self.waiting, self.later):
            if item in queue:
                queue.remove(item)
        self._waiters.pop(id(item), None)  # cancelled with its item, if any

    def _start(self) -> None:
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
            if item in self.waiting or item in self.later:
                self.drop(item)
            elif settle_first:
                while not item.ended:
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._settled(item)
            raise

    async def _settled(self, item: T) -> None:
        while not item.ended:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(id(item), []).append(waiter)
            await waiter

    async def _run(self) -> None:
        try:
            while self.waiting or self.later:
                queue = self.waiting
                if not queue:
                    if self._active > 1:
                        return  # the batch under way takes them after its own
                    queue = self.later
                count = min(len(queue), self._most)
                batch = [queue.popleft() for _ in range(count)]
                try:
                    await self._run_batch(batch)
                finally:
                    for item in batch:
                        for waiter in self._waiters.pop(id(item), ()):
                            if not waiter.done():  # a cancelled waiter's is
                                waiter.set_result(None)
        finally:
            self._active -= 1

    async def close(self) -> None:
        """Wait for batches under way (before the engine is disposed of)."""
        if self._runs:
            await asyncio.gather(*self._runs, return_exceptions=True)
