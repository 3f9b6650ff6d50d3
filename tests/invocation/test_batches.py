"""``AsyncBatches``: what is added ``later`` (reads for tasks waiting for a slot) goes
after everything else, never in the same batch, and only in a batch that runs alone;
``hurry`` makes it like the others, ``drop`` takes it out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dbworker.invocation.batches import AsyncBatches


@dataclass(eq=False)
class _Item:
    name: str
    ended: bool = False


class _Recorder:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()

    async def run(self, batch: list[_Item]) -> None:
        self.batches.append([item.name for item in batch])
        await self.release.wait()
        for item in batch:
            item.ended = True


async def _passes() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_items_added_later_wait_for_a_batch_alone_after_the_others() -> None:
    async def scenario() -> list[list[str]]:
        recorder = _Recorder()
        batches: AsyncBatches[_Item] = AsyncBatches(recorder.run, 2, 100)
        items = {name: _Item(name) for name in ("a1", "a2", "now1", "now2")}
        batches.add(items["a1"], later=True)
        batches.add(items["now1"])
        batches.add(items["a2"], later=True)
        batches.add(items["now2"])
        await _passes()
        assert recorder.batches == [["now1", "now2"]], "the others first, without later ones"
        recorder.release.set()
        await asyncio.gather(*(batches.wait(i, settle_first=False) for i in items.values()))
        return recorder.batches

    assert asyncio.run(scenario()) == [["now1", "now2"], ["a1", "a2"]]


def test_a_later_item_hurried_goes_with_the_others_and_a_dropped_one_not_at_all() -> None:
    async def scenario() -> list[list[str]]:
        recorder = _Recorder()
        batches: AsyncBatches[_Item] = AsyncBatches(recorder.run, 2, 100)
        busy, hurried, dropped, later = (_Item(n) for n in ("busy", "hurried", "dropped", "a"))
        batches.add(busy, later=True)  # runs alone: nothing else waits
        await _passes()
        for item in (hurried, dropped, later):
            batches.add(item, later=True)
        batches.hurry(hurried)
        batches.drop(dropped)
        await _passes()
        assert recorder.batches == [["busy"], ["hurried"]], "hurried: a batch of its own now"
        recorder.release.set()
        await asyncio.gather(*(batches.wait(i, settle_first=False) for i in (busy, hurried, later)))
        assert not dropped.ended
        return recorder.batches

    assert asyncio.run(scenario()) == [["busy"], ["hurried"], ["a"]]
