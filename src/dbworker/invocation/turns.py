"""Turns for the steps of invocations that run many at once in one process (the
threads and asyncio executors): how many take a step together, the others waiting
theirs, first come first served.

Tasks arrive in bursts (a claim's worth at once) and handlers started together end
together. Taken all at once, each step's statements share the process (the event
loop's passes, or the GIL) with every other invocation's: all of a burst finish late,
and the next burst starts together again. In turns, the first finish at once and the
rest in order (``benchmarks.io``, 300 calls of 0.3 s at 50, PostgreSQL, medians of 4:
threads 2.59 s drained with every ending at once, 2.31 s with endings in turns; asyncio
2.67 s and 2.38 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

#: How many invocations of one event loop get their connection and source row at once.
#: These steps wait on no row lock another invocation may hold: their turns are not
#: bounded. (Threads gained nothing from turns here.)
STARTING_AT_ONCE = 4

#: How many invocations of one process run their ending (flush, fenced status change,
#: commit) at once.
ENDING_AT_ONCE = 2
#: An ending may wait on a row lock held by another invocation of the same process that
#: itself waits for a turn to end: a wait for a turn is bounded, and past this many
#: seconds the invocation ends without one. Only for an invocation that holds a
#: transaction (it may hold such a lock): one that holds none waits for its turn. With
#: every wait bounded, a wave of endings on SQLite (one writer) went all at once
#: after 50 ms into SQLite's busy handler, which sleeps up to 100 ms between looks:
#: ``benchmarks.io`` drained in 2.4-3.1 s instead of 1.95.
ENDING_TURN_WAIT = 0.05


class StartingTurn:
    """One invocation's turn at ``STARTING_AT_ONCE``: taken once, given back once (as
    soon as the handler is called, or on any way out before)."""

    __slots__ = ("_held", "_turns")

    def __init__(self, turns: asyncio.Semaphore) -> None:
        self._turns = turns
        self._held = False

    async def take(self) -> None:
        await self._turns.acquire()
        self._held = True

    def end(self) -> None:
        if self._held:
            self._held = False
            self._turns.release()


class AsyncEndingTurns:
    """``ENDING_AT_ONCE`` turns to end an invocation on an event loop, each waited for
    at most ``ENDING_TURN_WAIT`` seconds; made on the running loop."""

    def __init__(self, turns: int, wait: float) -> None:
        self._turns = asyncio.Semaphore(turns)
        self._wait = wait

    @contextlib.asynccontextmanager
    async def turn(self, holding: bool = True) -> AsyncIterator[bool]:
        """Held for the block if it came in time; yields whether it did. ``holding``:
        whether the invocation holds a transaction; if not, it waits as long as it
        takes."""
        held = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._wait if holding else None):
                await self._turns.acquire()
            held = True
        try:
            yield held
        finally:
            if held:
                self._turns.release()


class EndingTurns:
    """``AsyncEndingTurns`` for threads."""

    def __init__(self, turns: int, wait: float) -> None:
        self._turns = threading.Semaphore(turns)
        self._wait = wait

    @contextlib.contextmanager
    def turn(self, holding: bool = True) -> Iterator[bool]:
        held = self._turns.acquire(timeout=self._wait if holding else None)
        try:
            yield held
        finally:
            if held:
                self._turns.release()
