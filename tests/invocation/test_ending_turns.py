"""Turns to end an invocation of the threads and asyncio executors (``turns.py``): at most
``turns`` held at once, handed on in order, and a wait bounded so that an ending waiting
on a lock held by one that waits for a turn cannot wait for ever."""

from __future__ import annotations

import asyncio
import threading

from dbworker.invocation.turns import AsyncEndingTurns, EndingTurns


async def _held_until(turns: AsyncEndingTurns, release: asyncio.Event) -> None:
    async with turns.turn():
        await release.wait()


def test_turns_are_held_at_most_n_at_once_and_handed_on_in_order() -> None:
    async def scenario() -> tuple[int, list[int], list[bool]]:
        turns = AsyncEndingTurns(2, wait=10.0)
        inside = peak = 0
        order: list[int] = []
        held: list[bool] = []

        async def end(n: int) -> None:
            nonlocal inside, peak
            async with turns.turn() as got:
                held.append(got)
                inside += 1
                peak = max(peak, inside)
                order.append(n)
                await asyncio.sleep(0.01)
                inside -= 1

        await asyncio.gather(*(end(n) for n in range(6)))
        return peak, order, held

    peak, order, held = asyncio.run(scenario())
    assert peak == 2
    assert order == list(range(6))
    assert all(held)


def test_a_wait_for_a_turn_is_bounded_and_a_late_turn_is_not_taken() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        turns = AsyncEndingTurns(1, wait=0.05)
        release = asyncio.Event()

        holding = asyncio.create_task(_held_until(turns, release))
        await asyncio.sleep(0)
        async with turns.turn() as second:
            pass  # ran without a turn, while the holder still holds the only one
        release.set()
        await holding
        async with turns.turn() as third:
            pass  # the holder's turn came back; the second took none to give back
        async with turns.turn() as fourth:
            pass
        return second, third, fourth

    assert asyncio.run(scenario()) == (False, True, True)


def test_a_cancelled_wait_takes_no_turn() -> None:
    async def scenario() -> bool:
        turns = AsyncEndingTurns(1, wait=10.0)
        release = asyncio.Event()

        async def holder() -> None:
            async with turns.turn():
                await release.wait()

        async def waiter() -> None:
            async with turns.turn():
                pass

        holding = asyncio.create_task(holder())
        await asyncio.sleep(0)
        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        release.set()
        await holding
        async with turns.turn() as got:
            return got

    assert asyncio.run(scenario())


def test_threads_take_turns_and_a_wait_for_one_is_bounded() -> None:
    turns = EndingTurns(1, wait=0.05)
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with turns.turn():
            holding.set()
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    holding.wait()
    with turns.turn() as second:
        pass
    release.set()
    thread.join()
    with turns.turn() as third:
        pass
    assert (second, third) == (False, True)


def test_a_wait_without_a_transaction_is_not_bounded() -> None:
    """An invocation that holds no transaction holds no lock another ending may wait
    for: it waits for its turn however long that takes (bounded, a wave of them went
    into SQLite's busy handler all at once)."""

    async def scenario() -> tuple[bool, bool, float]:
        turns = AsyncEndingTurns(1, wait=0.02)
        release = asyncio.Event()

        holding = asyncio.create_task(_held_until(turns, release))
        await asyncio.sleep(0)
        async with turns.turn(holding=True) as bounded:
            pass  # past the bound, without a turn
        loop = asyncio.get_running_loop()
        began = loop.time()
        loop.call_later(0.1, release.set)
        async with turns.turn(holding=False) as patient:
            waited = loop.time() - began
        await holding
        return bounded, patient, waited

    bounded, patient, waited = asyncio.run(scenario())
    assert bounded is False
    assert patient is True, "it waited for the holder's turn"
    assert waited >= 0.05, "well past the bound"


def test_threads_a_wait_without_a_transaction_is_not_bounded() -> None:
    turns = EndingTurns(1, wait=0.02)
    release = threading.Event()
    taken = threading.Event()

    def holder() -> None:
        with turns.turn():
            taken.set()
            release.wait(timeout=30)

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(timeout=30)
    with turns.turn(holding=True) as bounded:
        pass
    threading.Timer(0.1, release.set).start()
    with turns.turn(holding=False) as patient:
        pass
    thread.join(timeout=30)
    assert (bounded, patient) == (False, True)
