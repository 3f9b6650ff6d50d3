"""Cancelling an invocation whose ending was handed over to go with others'
(``together.AsyncPartings``): one still waiting for a batch leaves the queue at once
and is in no batch; one already in a batch waits until that batch is settled (its
COMMIT is never interrupted) and only then ends as cancelled. No database: the batch
is a stand-in that finishes when told."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dbworker.core.outcomes import Finished
from dbworker.core.tasks import Result, ResultKind, Task
from dbworker.invocation.together import AsyncPartings, Parting


def _parting(n: int) -> Parting:
    task = Task("w", n, 1, 1, 0, print, object)
    return Parting(task, None, None, Finished())  # type: ignore[arg-type]


class _Batches:
    """Stands in for the batch's connection: each batch waits for ``release``."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.given_back = 0

    async def connect(self) -> Any:
        return self

    async def give_back(self, conn: Any, usable: bool) -> None:
        self.given_back += 1

    async def run_sync(self, fn: Any, dialect: Any, batch: list[Parting]) -> list[Result]:
        self.batches.append([p.task.source_id for p in batch])
        await self.release.wait()
        return [Result(p.task.key, ResultKind.FINISHED) for p in batch]


async def _passes() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_cancelled_parting_leaves_the_queue_or_waits_for_its_batch() -> None:
    async def scenario() -> None:
        stand_in = _Batches()
        partings = AsyncPartings(None, stand_in.connect, stand_in.give_back, at_once=1)  # type: ignore[arg-type]
        first, second, third = _parting(1), _parting(2), _parting(3)
        ending_first = asyncio.ensure_future(partings.end(first))
        await _passes()
        assert stand_in.batches == [[1]], "a lone ending goes at once"
        waiting = [asyncio.ensure_future(partings.end(p)) for p in (second, third)]
        await _passes()
        # The first is in a batch under way; the other two wait for the next.
        ending_first.cancel()
        waiting[0].cancel()
        await _passes()
        assert waiting[0].done(), "cancelled while waiting: it leaves at once"
        assert not ending_first.done(), "in a batch: it waits for the batch's end"
        stand_in.release.set()
        await _passes()
        with pytest.raises(asyncio.CancelledError):
            await ending_first
        assert first.ended and first.result is not None, "its batch settled it"
        assert await waiting[1] == Result(third.task.key, ResultKind.FINISHED)
        assert stand_in.batches == [[1], [3]], "the cancelled one was in no batch"
        assert not second.ended
        await partings.close()
        assert stand_in.given_back == 2

    asyncio.run(scenario())
