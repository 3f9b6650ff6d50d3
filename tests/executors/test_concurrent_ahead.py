"""Items claimed ahead on the threads and asyncio executors: they wait in the handler
process (not started, their timeouts not running) and start there as its slots free,
in claim order; a stop gives them back, a lost claim keeps one from starting, and a
process that dies hands them to its replacement without charging them its crash."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from dbworker import AsyncIO, ExecutionStatus, Threads
from dbworker.executors import ExecutorChoice, multiplexed
from waiting import DEADLINE

from . import async_app
from .support import Rig
from .test_prefetch import steal

WORKING, UNFINISHED, FINISHED = (
    ExecutionStatus.WORKING,
    ExecutionStatus.UNFINISHED,
    ExecutionStatus.FINISHED,
)
MODES = ("threads", "asyncio")


@pytest.fixture(autouse=True)
def claim_ahead_whatever_the_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    # How many are claimed ahead depends on how long recent invocations took, which on
    # a loaded machine varies; these tests are about what happens to the waiting items,
    # so every slot gets one ahead once any duration is known.
    monkeypatch.setattr(multiplexed, "CLAIM_AHEAD_SECONDS", 3600.0)


def setup(mode: str) -> tuple[ExecutorChoice, Callable[..., Any]]:
    if mode == "threads":
        return Threads(), async_app.handle_sync
    return AsyncIO(), async_app.handle


def started(rig: Rig, mode: str, concurrency: int = 1, **options: Any) -> Any:
    """A started coordinator whose invocations have been timed (three short ones ran)."""
    choice, handler = setup(mode)
    coordinator = rig.coordinator(choice, concurrency=concurrency, handler=handler, **options)
    coordinator.start()
    warm = rig.add("finish", "finish", "finish")
    rig.wait_status(coordinator, warm, FINISHED)
    return coordinator


def claimed_ahead(
    rig: Rig, coordinator: Any, gated: int, *plans: str
) -> tuple[list[int], list[int]]:
    """Add ``gated`` gated items (one per slot) and ``plans`` behind them; wait until the
    gated ones run and the others are claimed (WORKING) without having started."""
    ids = rig.add(*["gate"] * gated, *plans)
    first, rest = ids[:gated], ids[gated:]
    for item_id in first:
        rig.wait_run(item_id, 1)
    rig.wait_status(coordinator, rest, WORKING)
    assert all(rig.runs(i) == [] for i in rest), "claimed ahead, so not started yet"
    return first, rest


@pytest.mark.parametrize("mode", MODES)
def test_items_claimed_ahead_start_in_the_process_as_its_slots_free(rig: Rig, mode: str) -> None:
    coordinator = started(rig, mode, concurrency=2)
    gated, ahead = claimed_ahead(rig, coordinator, 2, "finish", "finish")
    pid = rig.runs(gated[0])[0]
    rig.open_gate(gated[0], 1)
    # One slot freed: both run on it, in claim order, while the other gate stays shut.
    rig.wait_status(coordinator, [gated[0], *ahead], FINISHED)
    assert rig.status(coordinator, gated[1]) is WORKING
    assert [e.item_id for e in rig.effects()][-3:] == [gated[0], *ahead]
    assert {rig.runs(i)[0] for i in ahead} == {pid}, "run where they waited"
    rig.open_gate(gated[1], 1)
    rig.wait_status(coordinator, gated, FINISHED)
    assert Counter(e.item_id for e in rig.effects() if e.item_id in gated + ahead) == Counter(
        gated + ahead
    ), "every write committed exactly once"


@pytest.mark.parametrize("mode", MODES)
def test_a_timeout_counts_from_the_handlers_start_not_its_claim(rig: Rig, mode: str) -> None:
    # Each gated item runs 2 s of a 3 s timeout; the second waits 4 s from its claim.
    coordinator = started(rig, mode, timeout=3.0)
    [first], [second] = claimed_ahead(rig, coordinator, 1, "gate")
    time.sleep(2.0)
    rig.open_gate(first, 1)
    rig.wait_run(second, 1)
    time.sleep(2.0)
    rig.open_gate(second, 1)
    rig.wait_status(coordinator, [first, second], FINISHED)
    for item in (first, second):
        state = rig.state(coordinator, item)
        assert state is not None and state["attempts"] == 1 and state["error"] is None, state


@pytest.mark.parametrize("mode", MODES)
def test_an_item_claimed_ahead_is_timed_once_it_starts(rig: Rig, mode: str) -> None:
    # The process says when a task that waited starts; its timeout runs from then.
    coordinator = started(rig, mode, timeout=1.5)
    [first], [hung] = claimed_ahead(rig, coordinator, 1, "hang")
    rig.open_gate(first, 1)
    rig.wait_run(hung, 1)
    rig.wait_status(coordinator, [first], FINISHED)
    rig.wait_status(coordinator, [hung], ExecutionStatus.FAILED)
    state = rig.state(coordinator, hung)
    assert state is not None and state["error_type"] == "dbworker.HandlerTimeout", state


@pytest.mark.parametrize("mode", MODES)
def test_stop_gives_back_the_items_claimed_ahead(rig: Rig, mode: str) -> None:
    coordinator = started(rig, mode)
    [first], [waiting] = claimed_ahead(rig, coordinator, 1, "finish")
    stopper = threading.Thread(target=coordinator.stop, name="stopper")
    stopper.start()
    # Given back at once, while the running handler still holds its item.
    rig.wait_status(coordinator, [waiting], UNFINISHED)
    assert stopper.is_alive(), "stop() returned while a handler was still running"
    state = rig.state(coordinator, waiting)
    assert state is not None and state["crashes"] == 0, state
    rig.open_gate(first, 1)
    stopper.join(DEADLINE)
    assert not stopper.is_alive()
    assert rig.status(coordinator, first) is FINISHED
    assert rig.status(coordinator, waiting) is UNFINISHED
    assert rig.runs(waiting) == [], "an item given back must not have run"


@pytest.mark.parametrize("mode", MODES)
def test_a_waiting_item_whose_claim_is_lost_never_starts(
    rig: Rig, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dbworker")
    # Renewals every second (a third of the lease) notice the takeover quickly.
    coordinator = started(rig, mode, lease_seconds=3)
    [first], [stolen] = claimed_ahead(rig, coordinator, 1, "finish")
    thief_token = steal(rig, coordinator, caplog, stolen)
    rig.open_gate(first, 1)
    rig.wait_status(coordinator, [first], FINISHED)
    [after] = rig.add("finish")  # runs once the slot is free: the stolen one was dropped
    rig.wait_status(coordinator, [after], FINISHED)
    assert rig.runs(stolen) == [], "a waiting item whose claim was lost must not start"
    assert rig.state(coordinator, stolen) == thief_token, "still the thief's"


@pytest.mark.parametrize("mode", MODES)
def test_a_crash_hands_the_waiting_items_to_the_new_process(rig: Rig, mode: str) -> None:
    coordinator = started(rig, mode)
    [victim, waiting] = rig.add("gate+exit3;finish", "finish")
    victim_pid = rig.wait_run(victim, 1)
    rig.wait_status(coordinator, [waiting], WORKING)
    assert rig.runs(waiting) == []
    rig.open_gate(victim, 1)
    rig.wait_status(coordinator, [victim, waiting], FINISHED)
    state = rig.state(coordinator, waiting)
    assert state is not None
    # Not run in the process that died, and not counted as its crash.
    assert (state["attempts"], state["crashes"]) == (1, 0), state
    assert rig.runs(waiting) != [victim_pid]
    victim_state = rig.state(coordinator, victim)
    assert victim_state is not None and victim_state["crashes"] == 1
    assert Counter(e.item_id for e in rig.effects() if e.item_id in (victim, waiting)) == Counter(
        [victim, waiting]
    )
