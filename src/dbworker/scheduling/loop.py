"""The scheduling loop: the imperative shell around core, dialect and executors.

One thread per coordinator. Each pass it collects handler results, renews held
leases, enforces timeouts and claims new work for workers with free slots, then
sleeps until the next of: a result, a renewal, a poll. Database errors never end
the loop: a failed write waits in the outbox until it lands, and polling backs off.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import select
import socket
import threading
import time
from typing import Any

from sqlalchemy import Connection, Engine

from ..core.timing import Timings
from ..dialects import Dialect, Owner
from ..events import Event, EventKind, Events
from ..wakeups import Wakeups
from ..wakeups.cancels import cancelled_workers
from .outbox import Deferred, Outbox, SchedulerHealth
from .outcomes import Outcomes
from .polling import Polls
from .state import WorkerState
from .ticks import Ticker

log = logging.getLogger("dbworker")

#: Completions are announced to other coordinators' dependent workers at most this
#: often: a dependent elsewhere waits up to this long more, and a busy coordinator
#: sends a few announcements a second rather than one per pass of its loop.
ANNOUNCE_EVERY_SECONDS = 0.005
#: The shortest period of the check of held items for cancels that no wake-up named: a
#: latency-minded max_poll_seconds (50 ms) made it a read every pass of a busy loop
#: (20 a second) for a fallback that wake-ups and renewals mostly make unneeded.
HELD_CHECK_FLOOR = 1.0


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        dialect: Dialect,
        states: list[WorkerState],
        timings: Timings,
        owner: Owner,
        events: Events | None = None,
        wakeups: Wakeups | None = None,
    ) -> None:
        self.dialect = dialect
        #: Where the scheduler reports what happens to items (``dbworker.events``).
        self.events = events if events is not None else Events()
        self.states = {state.worker.name: state for state in states}
        self.timings = timings
        self.owner = owner
        self.health = SchedulerHealth()
        self.outbox = Outbox(engine, dialect, self.health, self.events)
        self.outcomes = Outcomes(self.outbox, dialect, self.states, self.health, self.events)
        self.polls = Polls(self.outbox, dialect, timings, owner, self.health, self.outcomes)
        #: Periodic workers' ticks, made before each pass's polls.
        self.ticker = Ticker(self.outbox, dialect, states)
        self._stopping = threading.Event()
        self._kill_at: float | None = None
        #: Whether the items claimed ahead were given back after a stop was requested.
        self._withdrawn = False
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._next_renewal = time.monotonic() + timings.renew_every
        #: When held items are next checked for cancels (every ``_held_check_every``;
        #: a cancel's wake-up brings its worker's check forward).
        self._held_check_every = max(timings.max_poll_seconds, HELD_CHECK_FLOOR)
        self._next_held_check = time.monotonic() + self._held_check_every
        #: Workers whose held items a wake-up said were cancelled.
        self._cancels: set[str] = set()
        self._waiter = _Waiter()
        self.wakeups = wakeups
        #: Workers a wake-up named since the last pass (None in it: all of them).
        self._woken: set[str | None] = set()
        self._woken_lock = threading.Lock()
        #: How many wake-ups arrived (for tests and diagnostics).
        self.wakeups_received = 0
        #: Dependent workers to announce to other coordinators, and when next.
        self._to_announce: set[str] = set()
        self._next_announce = 0.0
        self.thread = threading.Thread(target=self._run, name="dbworker-scheduler")

    # -- control (any thread) ------------------------------------------------------

    def start(self) -> None:
        for state in self.states.values():
            state.executor.start()
        self.health.running = True
        if self.wakeups is not None:
            self.wakeups.start(self.wake_workers, self._received)
        self.thread.start()

    def request_stop(self, kill_after: float | None) -> None:
        if kill_after is not None:
            self._kill_at = time.monotonic() + kill_after
        self._stopping.set()
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    def wake_workers(self, names: set[str] | None) -> None:
        """New work may be there for ``names`` (None: every worker): poll them now."""
        self._received(names)
        self.wake()

    def _received(self, names: set[str] | None) -> None:
        """``wake_workers`` from this loop's own thread, which needs no waking."""
        with self._woken_lock:
            self.wakeups_received += 1
            if names is None:
                self._woken.add(None)
            else:
                self._woken |= names

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                now = time.monotonic()
                self._take_wakeups(now)
                self._collect()
                self.outbox.flush()
                if self._stopping.is_set():
                    if not self._withdrawn:
                        self._withdrawn = True
                        self.outcomes.withdraw_waiting()
                    if self._kill_at is not None and now >= self._kill_at:
                        self.outcomes.kill_running()
                    if not self._busy():
                        break
                self.outcomes.enforce_timeouts(now)
                if now >= self._next_renewal:
                    self._renew()
                self._check_held(now)
                if not self._stopping.is_set():
                    self.ticker.make(now)
                for state in self.states.values():
                    # Checked per worker: a stop requested during one worker's poll must
                    # keep the next one from claiming.
                    if (
                        not self._stopping.is_set()
                        and state.executor.free_slots()
                        and now >= state.next_poll
                    ):
                        self.polls.poll(state, now)
                    elif not self._stopping.is_set():
                        state.discovery.ahead(self.outbox, self.dialect, state.worker.table, now)
                self._sleep()
        except BaseException as exc:  # pragma: no cover - a bug; say so loudly, then clean up
            log.exception("dbworker scheduler stopped by an unexpected error")
            self.health.crashed = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.wakeups is not None:
                self.wakeups.stop()
            self.outbox.close()
            for state in self.states.values():
                state.executor.shutdown()
            self.health.running = False
            self._wake_read.close()
            self._wake_write.close()

    def _busy(self) -> bool:
        return bool(self.outbox.pending) or any(state.held for state in self.states.values())

    def _sleep(self) -> None:
        now = time.monotonic()
        deadlines = [self._next_renewal]
        if not self._stopping.is_set():
            deadlines += [
                state.next_poll for state in self.states.values() if state.executor.free_slots()
            ]
            if self.ticker.due is not None:
                deadlines.append(self.ticker.due)  # the next slot of a periodic worker
        else:
            deadlines.append(now + 0.1)
        if self.outbox.pending:
            deadlines.append(self.outbox.blocked_until)
        for state in self.states.values():
            timeout = state.worker.timeout
            if timeout is None:
                continue
            name = state.worker.name
            for source_id, held in state.held.items():
                started = state.executor.started((name, source_id, held.token))
                if started is not None:
                    deadlines.append(started + timeout)
        for state in self.states.values():
            collect_by = state.executor.collect_by()
            if collect_by is not None:
                deadlines.append(collect_by)
        if self._to_announce:
            deadlines.append(self._next_announce)
        if self._kill_at is not None:
            deadlines.append(self._kill_at)
        if any(state.held for state in self.states.values()):
            deadlines.append(self._next_held_check)
        wait_for = max(0.0, min(deadlines) - now)
        wake_fd = self._wake_read.fileno()
        fds = [wake_fd]
        received = [] if self.wakeups is None else self.wakeups.wait_handles()
        fds += received
        for state in self.states.values():
            fds += [_fileno(handle) for handle in state.executor.wait_handles()]
        ready = self._waiter.wait(fds, wait_for)
        # Only what poll() reported is read: after an idle spell each system call on
        # the way to a claim costs tens of microseconds, not one or two.
        if wake_fd in ready:
            try:
                while self._wake_read.recv(4096):
                    pass
            except (BlockingIOError, OSError):
                pass
        if self.wakeups is not None and not ready.isdisjoint(received):
            self.wakeups.receive()

    def _collect(self) -> None:
        completed: set[str] = set()
        for state in self.states.values():
            for result in state.executor.collect():
                self.outcomes.handle(state, result)
                completed.add(state.worker.name)
            for lag in state.executor.loop_lags():
                self.events.emit(Event(EventKind.LOOP_LAG, state.worker.name, duration=lag))
        if completed and self.wakeups is not None:
            # This coordinator's own dependents are polled at once (Outcomes.handle);
            # others serving them hear of it through the database or this host.
            self._to_announce |= self.wakeups.to_announce(completed)
        self._announce()

    def _announce(self) -> None:
        """Tell other coordinators of completions, at most every ANNOUNCE_EVERY_SECONDS:
        each announcement is a transaction, and a busy loop completes items in most of
        its passes."""
        now = time.monotonic()
        if not self._to_announce or self.wakeups is None or now < self._next_announce:
            return
        names, self._to_announce = self._to_announce, set()
        self._next_announce = now + ANNOUNCE_EVERY_SECONDS
        with contextlib.suppress(Deferred):
            self.wakeups.announce(names, self.outbox.transaction)

    def _take_wakeups(self, now: float) -> None:
        with self._woken_lock:
            woken, self._woken = self._woken, set()
        if not woken:
            return
        self._cancels |= cancelled_workers(woken)
        for name, state in self.states.items():
            if None in woken or name in woken:
                state.poll_now(now)

    # -- renewal ---------------------------------------------------------------------

    def _renew(self) -> None:
        self._next_renewal = time.monotonic() + self.timings.renew_every
        for state in self.states.values():
            if not state.held:
                continue
            held = [(source_id, h.token) for source_id, h in state.held.items()]
            try:
                found = self.outbox.transaction(
                    f"renewing the leases of worker={state.worker.name}",
                    functools.partial(self._renew_worker, state=state, held=held),
                )
            except Deferred:
                # Try again as soon as the database may answer, not a renewal period
                # later: after an outage longer than the lease, the renewal must come
                # before the next claim, or this coordinator takes over its own items.
                self._next_renewal = min(self._next_renewal, self.outbox.blocked_until)
                continue
            lost, cancelled = found
            for source_id in lost:
                # Fenced renewal failed: another holder has the item. Stop this one so
                # it does not keep working beside the new holder.
                self.outcomes.lost(state, source_id)
            for source_id in cancelled:
                self.outcomes.cancelled(state, source_id)

    def _renew_worker(
        self, conn: Connection, state: WorkerState, held: list[tuple[Any, int]]
    ) -> tuple[list[Any], list[Any]]:
        """Renew ``held``: the ids whose claim was taken over, and those cancelled."""
        table = state.worker.table
        missed = self.dialect.renew(conn, table, held, self.timings.lease_seconds)
        tokens = dict(held)
        # A handler that just completed also fails the renewal (no longer WORKING),
        # with its token still current: that is not a lost claim. Nor is a cancel
        # (FAILED, the token unchanged), which the record tells apart.
        lost: list[Any] = []
        ours: list[Any] = []
        for source_id in missed:
            current = self.dialect.current_token(conn, table, source_id)
            (ours if current == tokens[source_id] else lost).append(source_id)
        cancelled = self.dialect.cancelled(conn, table, [(i, tokens[i]) for i in ours])
        return lost, cancelled

    # -- cancels ----------------------------------------------------------------------

    def _check_held(self, now: float) -> None:
        """Stop the handlers of held items that were cancelled: at once for the workers
        a cancel's wake-up named, and every ``max_poll_seconds`` (at least a second
        apart) for all: a cancel on another host of a database without NOTIFY wakes no
        one."""
        due = now >= self._next_held_check
        if due:
            self._next_held_check = now + self._held_check_every
        names, self._cancels = self._cancels, set()
        for name, state in self.states.items():
            if not state.held or not (due or name in names):
                continue
            held = [(source_id, h.token) for source_id, h in state.held.items()]
            try:
                cancelled = self.outbox.transaction(
                    f"checking the held items of worker={name} for cancels",
                    functools.partial(self.dialect.cancelled, worker=state.worker.table, held=held),
                    read_only=True,
                )
            except Deferred:
                continue
            for source_id in cancelled:
                self.outcomes.cancelled(state, source_id)


def _fileno(handle: Any) -> int:
    return handle if isinstance(handle, int) else int(handle.fileno())


class _Waiter:
    """Waits for any of a set of file descriptors to become readable.

    The set rarely changes (processes are replaced now and then), so one poll object
    is kept and changed only when it does, instead of a selector built for each wait.
    """

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: set[int] = set()

    def wait(self, fds: list[int], timeout: float) -> set[int]:
        """The descriptors that became readable (none: the timeout passed)."""
        wanted = set(fds)
        if wanted != self._fds:
            for fd in self._fds - wanted:
                self._poll.unregister(fd)
            for fd in wanted - self._fds:
                self._poll.register(fd, select.POLLIN)
            self._fds = wanted
        # poll() takes milliseconds; round up so a deadline is not missed by a hair.
        return {fd for fd, _ in self._poll.poll(max(0, math.ceil(timeout * 1000)))}
