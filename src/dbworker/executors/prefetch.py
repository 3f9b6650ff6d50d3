"""How far a process pool claims ahead: how many tasks each of its processes may hold
(running, waiting in its pipe, or waiting in the pool), from how long recent
invocations took, and when a busy process's results can wait to be read.

The policy only measures and counts: the pool hands it durations, the time and its
processes' queues, and asks.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

#: Tasks sent ahead into a process's pipe (the one running and up to 63 more): the
#: next starts without waiting for the coordinator to read the result before it, even
#: while the coordinator waits for a core (two handler processes and a database
#: server on two cores) or claims. With three, no-op handlers waited for their next
#: task a third of the time; with ten, an eighth. With 32 and a 0.2 s horizon, no-op
#: throughput on PostgreSQL rose from ~2,130 to ~2,690 items/s and on MariaDB from
#: ~2,120 to ~2,520 (``benchmarks.throughput``, 3,000 items, medians of 3, two runs each;
#: groups of up to 32 as well gained nothing more there and cost SQLite 5%). Once groups
#: ran a no-op item in well under 0.1 ms, each process still waited with nothing to run
#: for about a sixth of a 12,000-item run on PostgreSQL, for the claim after its pipe
#: ran dry (a twelfth with 64 and discovery ahead); with 64 (and ``DEFAULT_PREFETCH``
#: 64), items/s per round over 32's: PostgreSQL 1.21x (median of 7 alternating rounds,
#: every one faster), MariaDB 1.14x, SQLite 1.07x.
#: ``PrefetchPolicy.depth`` bounds it further to ``PREFETCH_HORIZON_SECONDS`` of recent
#: work, and to one after a long invocation (``LONG_INVOCATION_SECONDS``).
PIPE_DEPTH = 64
#: Prefetch only while the tasks waiting for a process would take about this long
#: (and a process that ended a task less than this long ago counts as streaming).
PREFETCH_HORIZON_SECONDS = 0.2
#: A task sent into a pipe waits for the ones before it, however long they turn out.
#: After an invocation of at least LONG_INVOCATION_SECONDS (remembered with this half
#: life) a worker's pipes hold only the running task: a worker whose handlers now and
#: then run long keeps its waiting tasks in the coordinator, for whichever process
#: frees first. (Shorter hiccups, a slow commit, change nothing.)
PEAK_HALF_LIFE_SECONDS = 60.0
LONG_INVOCATION_SECONDS = 1.0
#: Tasks sent to a process may run as a group (several in one transaction, one
#: COMMIT: ``invocation/group.py``) only while recent invocations typically take at
#: most this long, and never after a long one: a group adds each item's time to the
#: transaction of the items before it.
GROUP_TYPICAL_SECONDS = 0.005
#: A process with a full pipe (``pipe_depth`` tasks, at least this many) has work for
#: a while: the coordinator reads its results in batches (waking once for several)
#: until it is expected to be one task down, instead of waking for every result.
BATCHED_READS_FROM = 3


class Occupant(Protocol):
    """What the policy reads of a process: the tasks it holds and its recent timing."""

    @property
    def usable(self) -> bool:
        """Whether it may be given tasks (started and ready)."""

    @property
    def tasks(self) -> Collection[object]:
        """The tasks sent to it, in order: the first is running."""

    @property
    def started(self) -> float:
        """When the first of ``tasks`` started."""

    @property
    def last_done(self) -> float:
        """When it last reported a result."""


def streaming(child: Occupant, now: float) -> bool:
    """Whether ``child`` is working through short tasks one after another (it ended
    one a moment ago): only then may more tasks wait for it. One that has run its
    task for longer, or sat idle, gets one task at a time, so nothing is claimed
    ahead of a handler that may run long (nor in the first claim after a pause)."""
    return now - child.last_done < PREFETCH_HORIZON_SECONDS


class PrefetchPolicy:
    """The measured durations of one pool's invocations, and what they allow.

    ``depth`` is how many tasks each process may hold (running and waiting): one until
    a duration is measured, then as many as fit ``PREFETCH_HORIZON_SECONDS``, up to
    ``1 + prefetch``. ``pipe_depth`` is how many of them may be sent into its pipe.
    Times are ``time.monotonic()`` values the caller passes in.
    """

    __slots__ = ("_peak", "_peak_at", "depth", "groupable", "pipe_depth", "prefetch", "typical")

    def __init__(self, prefetch: int) -> None:
        #: At most this many tasks wait per process.
        self.prefetch = prefetch
        #: Recent invocations' duration (exponentially weighted); None until one ends.
        self.typical: float | None = None
        #: ``depth_for(typical)``, kept: every dispatch and poll reads it.
        self.depth = 1
        self.pipe_depth = 1
        #: Whether tasks sent now may run in a group (``GROUP_TYPICAL_SECONDS``).
        self.groupable = False
        #: The longest recent invocation (decaying, see PEAK_HALF_LIFE_SECONDS), and
        #: when it was last raised or decayed.
        self._peak = 0.0
        self._peak_at = 0.0

    def depth_for(self, typical: float | None) -> int:
        """How many tasks each process may have (running and waiting) when invocations
        typically take ``typical`` seconds."""
        if not self.prefetch or typical is None:
            return 1  # nothing measured yet: the tasks may be long ones
        waiting = int(PREFETCH_HORIZON_SECONDS / max(typical, 1e-6))
        return 1 + max(0, min(self.prefetch, waiting))

    def measured(self, duration: float, now: float) -> None:
        """An invocation took ``duration`` seconds; it ended at ``now``."""
        typical = self.typical
        typical = duration if typical is None else 0.8 * typical + 0.2 * duration
        self.typical = typical
        self.depth = self.depth_for(typical)
        peak = self._peak * 0.5 ** ((now - self._peak_at) / PEAK_HALF_LIFE_SECONDS)
        self._peak, self._peak_at = max(duration, peak), now
        ran_long = self._peak >= LONG_INVOCATION_SECONDS
        self.pipe_depth = 1 if ran_long else min(PIPE_DEPTH, self.depth)
        self.groupable = self.pipe_depth > 1 and typical <= GROUP_TYPICAL_SECONDS

    def room(self, child: Occupant, depth: int, now: float) -> int:
        """How many more tasks ``child`` may have."""
        if not child.usable:
            return 0
        if depth > 1 and streaming(child, now):
            return max(0, depth - len(child.tasks))
        return 0 if child.tasks else 1

    def free_slots(self, children: Sequence[Occupant], waiting: int, slots: int, now: float) -> int:
        """How many tasks a pool of ``slots`` slots, whose processes are ``children``,
        may take now, while ``waiting`` tasks it took wait for whichever frees first."""
        depth = self.depth
        room = sum(self.room(c, depth, now) for c in children)
        held = waiting + sum(len(c.tasks) for c in children)
        free = max(0, min(room - waiting, slots * depth - held))
        if depth == 1 or free >= (slots * depth) // 2:
            return free
        # Claim in batches (one claim feeds several tasks), unless a process idles.
        hungry = any(c.usable and not c.tasks for c in children)
        return free if hungry and not waiting else 0

    def read_by(self, child: Occupant) -> float:
        """When ``child``'s results should be read: at once, unless it has a full pipe
        of short tasks, then when it is expected to be one task down."""
        typical = self.typical
        full = max(BATCHED_READS_FROM, self.pipe_depth)
        if typical is None or len(child.tasks) < full:
            return child.started
        return child.started + (len(child.tasks) - full + 1) * typical
