"""The prefetch policy on its own: how many tasks each process may hold from the
measured durations, how many a pool may claim at once, and when a busy process's
results are due. No processes: stand-ins say what each holds and when it last
finished a task, and every time is passed in."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import pytest

from dbworker.executors.prefetch import (
    BATCHED_READS_FROM,
    LONG_INVOCATION_SECONDS,
    PEAK_HALF_LIFE_SECONDS,
    PIPE_DEPTH,
    PREFETCH_HORIZON_SECONDS,
    PrefetchPolicy,
    streaming,
)

NOW = 1000.0


@dataclass
class Process:
    """What the policy reads of a pool's process."""

    tasks: collections.deque[object] = field(default_factory=collections.deque)
    usable: bool = True
    started: float = NOW
    #: Never by default: an idle process, or one whose task has run a while.
    last_done: float = float("-inf")

    @classmethod
    def streaming(cls, held: int) -> Process:
        """One that ended a task just now and holds ``held`` more."""
        return cls(collections.deque(range(held)), last_done=NOW)


def measured(prefetch: int, *durations: float) -> PrefetchPolicy:
    policy = PrefetchPolicy(prefetch)
    for duration in durations:
        policy.measured(duration, NOW)
    return policy


def test_the_depth_follows_the_measured_durations() -> None:
    policy = PrefetchPolicy(4)
    assert policy.depth == 1, "nothing measured: tasks may be long"
    policy.measured(PREFETCH_HORIZON_SECONDS / 2, NOW)
    assert policy.depth == 3
    for _ in range(50):
        policy.measured(10.0, NOW)
    assert policy.depth == 1


@pytest.mark.parametrize(
    ("prefetch", "typical", "depth"),
    [
        (4, None, 1),  # nothing measured
        (0, 0.001, 1),  # prefetch off
        (4, PREFETCH_HORIZON_SECONDS / 2, 3),
        (4, 0.0, 5),  # bounded by prefetch
        (32, 0.001, 33),
        (4, PREFETCH_HORIZON_SECONDS * 2, 1),  # longer than the horizon: nothing waits
    ],
)
def test_depth_for(prefetch: int, typical: float | None, depth: int) -> None:
    assert PrefetchPolicy(prefetch).depth_for(typical) == depth


def test_the_typical_duration_is_weighted_towards_the_past() -> None:
    policy = measured(4, 0.010)
    assert policy.typical == pytest.approx(0.010)
    policy.measured(0.020, NOW)
    assert policy.typical == pytest.approx(0.8 * 0.010 + 0.2 * 0.020)


def test_the_pipe_holds_up_to_pipe_depth_of_short_tasks() -> None:
    assert measured(4, 0.001).pipe_depth == 5  # the depth
    deep = measured(2 * PIPE_DEPTH, 0.001)  # room for more than a pipe holds
    assert deep.pipe_depth == PIPE_DEPTH < deep.depth
    assert PrefetchPolicy(32).pipe_depth == 1, "nothing measured"


def test_a_long_invocation_leaves_only_the_running_task_in_the_pipe_for_a_while() -> None:
    policy = measured(PIPE_DEPTH, LONG_INVOCATION_SECONDS * 2, *[0.001] * 1000)
    assert policy.depth > 1
    assert policy.pipe_depth == 1
    # Two half lives on, the peak is half the long invocation: long no more.
    policy.measured(0.001, NOW + 2 * PEAK_HALF_LIFE_SECONDS)
    assert policy.pipe_depth == PIPE_DEPTH


def test_a_hiccup_shorter_than_a_long_invocation_keeps_the_pipe() -> None:
    policy = measured(PIPE_DEPTH, 0.001, LONG_INVOCATION_SECONDS / 10, *[0.001] * 100)
    assert policy.pipe_depth == PIPE_DEPTH


def test_streaming_means_a_task_ended_within_the_horizon() -> None:
    process = Process(last_done=NOW)
    assert streaming(process, NOW + PREFETCH_HORIZON_SECONDS / 2)
    assert not streaming(process, NOW + 2 * PREFETCH_HORIZON_SECONDS)
    assert not streaming(Process(), NOW)


def test_room() -> None:
    policy = measured(4, 0.001)
    depth = policy.depth
    assert policy.room(Process(usable=False), depth, NOW) == 0
    assert policy.room(Process(), depth, NOW) == 1, "idle: one task, not a queue"
    busy = Process(collections.deque([1]))
    assert policy.room(busy, depth, NOW) == 0, "running a while: nothing waits behind it"
    assert policy.room(Process.streaming(2), depth, NOW) == depth - 2
    assert policy.room(Process.streaming(depth + 1), depth, NOW) == 0
    assert policy.room(Process.streaming(0), 1, NOW) == 1, "depth one: no queue"


def test_free_slots_before_any_duration_is_one_per_idle_process() -> None:
    policy = PrefetchPolicy(4)
    processes = [Process(), Process(), Process(usable=False)]
    assert policy.free_slots(processes, 0, 2, NOW) == 2
    assert policy.free_slots(processes, 1, 2, NOW) == 1
    processes[0].tasks.append(1)
    assert policy.free_slots(processes, 0, 2, NOW) == 1


def test_free_slots_claims_in_batches_while_prefetching() -> None:
    policy = measured(4, 0.001)
    assert policy.depth == 5
    empty = [Process.streaming(0), Process.streaming(0)]
    assert policy.free_slots(empty, 0, 2, NOW) == 10
    # Room for four more in all: less than half of 2 x 5, and no process idles.
    busy = [Process.streaming(3), Process.streaming(3)]
    assert policy.free_slots(busy, 0, 2, NOW) == 0


def test_free_slots_claims_for_an_idle_process_unless_tasks_wait() -> None:
    policy = measured(4, 0.001)
    processes = [Process(), Process.streaming(3)]
    assert policy.free_slots(processes, 0, 2, NOW) == 3  # one for the idle, two behind
    processes[1].tasks.append(3)
    assert policy.free_slots(processes, 1, 2, NOW) == 0, "what waits goes to the idle one"


def test_results_are_due_at_once_until_the_pipe_is_full() -> None:
    policy = PrefetchPolicy(PIPE_DEPTH)
    full = Process(collections.deque(range(PIPE_DEPTH)), started=NOW)
    assert policy.read_by(full) == NOW, "nothing measured"
    policy.measured(0.001, NOW)
    assert policy.pipe_depth == PIPE_DEPTH
    assert policy.read_by(Process(collections.deque(range(PIPE_DEPTH - 1)))) == NOW
    # A full pipe: read when the process is expected to be one task down.
    assert policy.read_by(full) - NOW == pytest.approx(0.001)
    policy = measured(2, 0.001)  # pipes of three: the least that is read in batches
    assert policy.pipe_depth == BATCHED_READS_FROM
    three = Process(collections.deque(range(BATCHED_READS_FROM)), started=NOW)
    assert policy.read_by(three) - NOW == pytest.approx(0.001)
