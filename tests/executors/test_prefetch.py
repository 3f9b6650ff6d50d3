"""Items claimed ahead (prefetch): while invocations are short, a persistent process
has claimed items waiting for it. They wait without their timeouts running, run in
claim order, go to another process when theirs dies, and are given back by a stop."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from dbworker import ExecutionStatus
from dbworker.executors import prefetch as policy
from waiting import DEADLINE, wait_until

from .support import Rig, make_choice
from .test_executors import take_over

WORKING, UNFINISHED, FINISHED = (
    ExecutionStatus.WORKING,
    ExecutionStatus.UNFINISHED,
    ExecutionStatus.FINISHED,
)
#: The executors whose processes outlive a task, so tasks can wait for them.
PREFETCHING = ("pool", "subprocess")
DEFAULT_HORIZON = policy.PREFETCH_HORIZON_SECONDS


@pytest.fixture(autouse=True)
def prefetch_whatever_the_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    # How deep the queues get depends on how long recent invocations took, which on a
    # loaded machine varies; these tests are about what happens to waiting items, so
    # every process gets its whole prefetch once any duration is known.
    monkeypatch.setattr(policy, "PREFETCH_HORIZON_SECONDS", 3600.0)


def warm(rig: Rig, coordinator: object) -> None:
    """Run a few short items first: prefetch starts once invocations are seen to be short."""
    ids = rig.add("finish", "finish", "finish")
    rig.wait_status(coordinator, ids, FINISHED)  # type: ignore[arg-type]


def claimed_ahead(rig: Rig, coordinator: object, *plans: str) -> tuple[int, list[int]]:
    """Add a gated item and ``plans`` behind it; wait until the gated one runs and the
    others are claimed (WORKING) without having started."""
    first, *rest = rig.add("gate", *plans)
    rig.wait_run(first, 1)
    rig.wait_status(coordinator, rest, WORKING)  # type: ignore[arg-type]
    assert all(rig.runs(i) == [] for i in rest), "claimed ahead, so not started yet"
    return first, rest


@pytest.mark.parametrize("executor", PREFETCHING)
def test_items_claimed_ahead_wait_and_run_in_claim_order(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor, prefetch=2))
    coordinator.start()
    warm(rig, coordinator)
    first, rest = claimed_ahead(rig, coordinator, "finish", "finish")
    rig.open_gate(first, 1)
    rig.wait_status(coordinator, [first, *rest], FINISHED)
    assert [e.item_id for e in rig.effects()][-3:] == [first, *rest]


@pytest.mark.parametrize("executor", PREFETCHING)
def test_a_crash_hands_the_waiting_items_to_another_process(
    rig: Rig, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No groups: a process that dies inside one is charged to none of its items (each
    # runs again alone; tests/crash/test_group_crash.py), and the victim's second run
    # here finishes, so whether it crashed alone would depend on how tasks arrived.
    monkeypatch.setattr(policy, "GROUP_TYPICAL_SECONDS", 0.0)
    coordinator = rig.coordinator(make_choice(executor, prefetch=2))
    coordinator.start()
    warm(rig, coordinator)
    [victim, *rest] = rig.add("gate+exit3;finish", "finish", "finish")
    victim_pid = rig.wait_run(victim, 1)
    rig.wait_status(coordinator, rest, WORKING)
    rig.open_gate(victim, 1)
    rig.wait_status(coordinator, [victim, *rest], FINISHED)
    for item in rest:
        state = rig.state(coordinator, item)
        assert state is not None
        # Not run in the process that died, and not counted as its crash.
        assert (state["attempts"], state["crashes"]) == (1, 0), state
        assert rig.runs(item) != [victim_pid]
    victim_state = rig.state(coordinator, victim)
    assert victim_state is not None and victim_state["crashes"] == 1


@pytest.mark.parametrize("executor", PREFETCHING)
def test_stop_gives_back_the_items_claimed_ahead(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor, prefetch=2))
    coordinator.start()
    warm(rig, coordinator)
    first, rest = claimed_ahead(rig, coordinator, "finish", "finish")
    stopper = threading.Thread(target=coordinator.stop, name="stopper")
    stopper.start()
    # Given back at once, while the running handler still holds its item.
    rig.wait_status(coordinator, rest, UNFINISHED)
    assert stopper.is_alive(), "stop() returned while a handler was still running"
    for item in rest:
        state = rig.state(coordinator, item)
        assert state is not None and state["crashes"] == 0, state
        assert rig.runs(item) == [], "an item given back must not have run"
    rig.open_gate(first, 1)
    stopper.join(DEADLINE)
    assert not stopper.is_alive()
    assert rig.status(coordinator, first) is FINISHED
    assert all(rig.status(coordinator, item) is UNFINISHED for item in rest)
    assert all(rig.runs(item) == [] for item in rest)


@pytest.mark.parametrize("executor", PREFETCHING)
def test_a_timeout_counts_from_the_handlers_start_not_its_claim(rig: Rig, executor: str) -> None:
    # Each gated item runs 2 s of a 3 s timeout; the last waits 4 s from its claim.
    coordinator = rig.coordinator(make_choice(executor, prefetch=2), timeout=3.0)
    coordinator.start()
    warm(rig, coordinator)
    first, second, last = rig.add("gate", "gate", "finish")
    rig.wait_run(first, 1)
    rig.wait_status(coordinator, [second, last], WORKING)
    time.sleep(2.0)
    rig.open_gate(first, 1)
    rig.wait_run(second, 1)
    time.sleep(2.0)
    rig.open_gate(second, 1)
    rig.wait_status(coordinator, [first, second, last], FINISHED)
    for item in (first, second, last):
        state = rig.state(coordinator, item)
        assert state is not None and state["attempts"] == 1 and state["error"] is None, state


@pytest.mark.parametrize("executor", PREFETCHING)
def test_no_prefetch_claims_only_for_an_idle_process(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor, prefetch=0))
    coordinator.start()
    warm(rig, coordinator)
    first, waiting = rig.add("gate", "finish")
    rig.wait_run(first, 1)
    # Give a wrong claim the time to show itself; nothing is asserted about time.
    time.sleep(0.5)
    assert rig.status(coordinator, waiting) is None
    rig.open_gate(first, 1)
    rig.wait_status(coordinator, [first, waiting], FINISHED)


def test_prefetch_is_validated() -> None:
    from dbworker import ConfigurationError, Pool, Subprocess

    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigurationError, match="prefetch"):
            Pool(prefetch=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="prefetch"):
            Subprocess(prefetch=bad)  # type: ignore[arg-type]


def steal(rig: Rig, coordinator: Any, caplog: pytest.LogCaptureFixture, item_id: int) -> Any:
    """Another holder takes ``item_id`` over; once a renewal has noticed (the coordinator
    logged the lost claim), the thief's record."""
    take_over(rig, coordinator, item_id)
    thief = rig.state(coordinator, item_id)
    wait_until(
        lambda: any(
            "lost its claim" in r.getMessage() and r.__dict__.get("source_id") == item_id
            for r in caplog.records
        ),
        "a renewal to notice the lost claim",
    )
    return thief


@pytest.mark.parametrize("executor", PREFETCHING)
def test_a_waiting_item_whose_claim_is_lost_never_starts(
    rig: Rig, executor: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dbworker")
    # Renewals every second (a third of the lease) notice the takeover quickly.
    coordinator = rig.coordinator(make_choice(executor, prefetch=2), lease_seconds=3)
    coordinator.start()
    warm(rig, coordinator)
    first, (stolen, other) = claimed_ahead(rig, coordinator, "finish", "finish")
    thief_token = steal(rig, coordinator, caplog, stolen)
    rig.open_gate(first, 1)
    rig.wait_status(coordinator, [first, other], FINISHED)
    assert rig.runs(stolen) == [], "a waiting item whose claim was lost must not start"
    # Still the thief's: nothing of ours touched it.
    assert rig.state(coordinator, stolen) == thief_token


@pytest.mark.parametrize("executor", PREFETCHING)
def test_nothing_waits_behind_a_long_running_handler(
    rig: Rig, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "PREFETCH_HORIZON_SECONDS", DEFAULT_HORIZON)
    coordinator = rig.coordinator(make_choice(executor, prefetch=4), concurrency=2)
    coordinator.start()
    warm(rig, coordinator)
    [long] = rig.add("gate")
    long_pid = rig.wait_run(long, 1)
    time.sleep(2 * DEFAULT_HORIZON)  # it has now run longer than short ones do
    quick = rig.add(*["finish"] * 6)
    # All of them through the other process while the long one still runs.
    rig.wait_status(coordinator, quick, FINISHED)
    assert all(rig.runs(i) != [long_pid] for i in quick)
    assert rig.status(coordinator, long) is WORKING
    rig.open_gate(long, 1)
    rig.wait_status(coordinator, [long], FINISHED)
