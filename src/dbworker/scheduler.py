"""The scheduling loop: the imperative shell around core, dialect and executors.

One thread per coordinator. Each pass it collects handler results, renews held
leases, enforces timeouts and claims new work for workers with free slots, then
sleeps until the next of: a result, a renewal, a poll. Database errors never end
the loop: a failed write is retried until it lands, and polling backs off.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from sqlalchemy import Connection, Engine

from .core.errors import HandlerTimeout
from .core.timing import PollBackoff, Timings
from .dialects import Dialect, ErrorInfo, Owner
from .executors import Executor, Result, ResultKind
from .worker import Worker

log = logging.getLogger("dbworker")

#: Recent watermarks kept for the sweep that finds rows committed out of key order.
SWEEP_HORIZON_SECONDS = 120.0
SWEEP_EVERY_SECONDS = 5.0
#: A full anti-join sweep (cost grows with the source table) runs this rarely.
FULL_SWEEP_EVERY_SECONDS = 600.0
#: Wait after a database error before trying again (doubling up to the cap).
DB_RETRY_SECONDS = 0.5
DB_RETRY_MAX_SECONDS = 10.0


@dataclass(slots=True)
class Held:
    token: int
    attempt: int
    failures: int
    started: float
    #: The record's crash count as claimed: a takeover of the item raises it.
    crashes: int = 0


@dataclass(slots=True)
class Lane:
    """One worker's scheduling state."""

    worker: Worker
    executor: Executor
    backoff: PollBackoff
    next_poll: float = 0.0
    held: dict[Any, Held] = field(default_factory=dict)
    #: Runs that completed in the database (Unfinished, a retry) and were claimed
    #: again before their result was read, by (source_id, token).
    completing: dict[tuple[Any, int], Held] = field(default_factory=dict)
    watermarks: collections.deque[tuple[float, Any]] = field(default_factory=collections.deque)
    next_sweep: float = 0.0
    next_full_sweep: float = 0.0
    next_discovery: float = 0.0


@dataclass(slots=True)
class PendingWrite:
    """A transition the database has not accepted yet (it was down): retried each pass."""

    description: str
    apply: Callable[[Connection], object]
    #: The item the write concerns (worker, source_id, attempt), for its log records.
    extra: dict[str, Any] | None = None


@dataclass(slots=True)
class Health:
    running: bool = False
    database_ok: bool = True
    last_error: str | None = None
    last_error_at: float | None = None
    claimed: int = 0
    completed: int = 0
    #: Set if the scheduler itself stopped on an unexpected error (a bug).
    crashed: str | None = None


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        dialect: Dialect,
        lanes: list[Lane],
        timings: Timings,
        owner: Owner,
    ) -> None:
        self.engine = engine
        self.dialect = dialect
        self.lanes = {lane.worker.name: lane for lane in lanes}
        self.timings = timings
        self.owner = owner
        self.health = Health()
        self._pending: list[PendingWrite] = []
        self._stopping = threading.Event()
        self._kill_at: float | None = None
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._next_renewal = time.monotonic() + timings.renew_every
        self._db_wait = 0.0
        self._db_blocked_until = 0.0
        self.thread = threading.Thread(target=self._run, name="dbworker-scheduler")

    # -- control (any thread) ------------------------------------------------------

    def start(self) -> None:
        for lane in self.lanes.values():
            lane.executor.start()
        self.health.running = True
        self.thread.start()

    def request_stop(self, kill_after: float | None) -> None:
        if kill_after is not None:
            self._kill_at = time.monotonic() + kill_after
        self._stopping.set()
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                now = time.monotonic()
                self._collect()
                self._flush_pending()
                if self._stopping.is_set():
                    if self._kill_at is not None and now >= self._kill_at:
                        self._kill_running()
                    if not self._busy():
                        break
                self._enforce_timeouts(now)
                if now >= self._next_renewal:
                    self._renew()
                for lane in self.lanes.values():
                    # Checked per lane: a stop requested during one lane's poll must
                    # keep the next lane from claiming.
                    if (
                        not self._stopping.is_set()
                        and lane.executor.free_slots()
                        and now >= lane.next_poll
                    ):
                        self._poll(lane, now)
                self._sleep()
        except BaseException as exc:  # pragma: no cover - a bug; say so loudly, then clean up
            log.exception("dbworker scheduler stopped by an unexpected error")
            self.health.crashed = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            for lane in self.lanes.values():
                lane.executor.shutdown()
            self.health.running = False
            self._wake_read.close()
            self._wake_write.close()

    def _busy(self) -> bool:
        return bool(self._pending) or any(lane.held for lane in self.lanes.values())

    def _sleep(self) -> None:
        now = time.monotonic()
        deadlines = [self._next_renewal]
        if not self._stopping.is_set():
            deadlines += [
                lane.next_poll for lane in self.lanes.values() if lane.executor.free_slots()
            ]
        else:
            deadlines.append(now + 0.1)
        if self._pending:
            deadlines.append(self._db_blocked_until)
        for lane in self.lanes.values():
            if lane.worker.timeout is not None:
                deadlines += [h.started + lane.worker.timeout for h in lane.held.values()]
        if self._kill_at is not None:
            deadlines.append(self._kill_at)
        timeout = max(0.0, min(deadlines) - now)
        handles: list[Any] = [self._wake_read]
        for lane in self.lanes.values():
            handles.extend(lane.executor.wait_handles())
        if wait(handles, timeout):
            try:
                while self._wake_read.recv(4096):
                    pass
            except (BlockingIOError, OSError):
                pass

    # -- database access with resilience ---------------------------------------------

    def _transaction(
        self,
        description: str,
        action: Callable[[Connection], Any],
        extra: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``action`` in one transaction; on a database error log it and raise _Deferred.

        ``extra`` names the item the transaction is about, for the log records.
        """
        if time.monotonic() < self._db_blocked_until:
            raise _Deferred
        try:
            with self.engine.begin() as conn:
                result = action(conn)
        except Exception as exc:
            self._database_error(description, exc, extra)
            raise _Deferred from exc
        if not self.health.database_ok:
            log.warning("dbworker: database reachable again (%s)", description, extra=extra)
        self.health.database_ok = True
        self._db_wait = 0.0
        return result

    def _database_error(
        self, description: str, exc: Exception, extra: dict[str, Any] | None = None
    ) -> None:
        transient = self.dialect.is_transient(exc)
        if self.health.database_ok or not transient:
            # Once per incident: the first error of an outage, and every non-transient one.
            log.error(
                "dbworker: database error while %s (%s); retrying",
                description,
                "transient" if transient else "not transient",
                exc_info=exc,
                extra=extra,
            )
        self.health.database_ok = False
        self.health.last_error = f"{type(exc).__name__}: {exc}"[:2000]
        self.health.last_error_at = time.time()
        self._db_wait = min(max(self._db_wait * 2, DB_RETRY_SECONDS), DB_RETRY_MAX_SECONDS)
        self._db_blocked_until = time.monotonic() + self._db_wait

    def _write(
        self,
        description: str,
        apply: Callable[[Connection], object],
        extra: dict[str, Any] | None = None,
    ) -> None:
        """A transition that must land eventually, in order, even across an outage."""
        self._pending.append(PendingWrite(description, apply, extra))
        self._flush_pending()

    def _flush_pending(self) -> None:
        while self._pending:
            write = self._pending[0]
            try:
                self._transaction(write.description, write.apply, write.extra)
            except _Deferred:
                return
            self._pending.pop(0)

    # -- results ---------------------------------------------------------------------

    def _collect(self) -> None:
        for lane in self.lanes.values():
            for result in lane.executor.collect():
                self._handle(lane, result)

    def _handle(self, lane: Lane, result: Result) -> None:
        _, source_id, token = result.task_key
        held = lane.held.get(source_id)
        if held is not None and held.token == token:
            del lane.held[source_id]
        else:
            # Claimed again before this result was read, or a run whose claim was lost.
            held = lane.completing.pop((source_id, token), None)
        where, extra = _item(lane, source_id, held.attempt if held else "?")
        kind = result.kind
        self.health.completed += 1
        # A finished item may make another worker's items eligible; look again soon.
        for other in self.lanes.values():
            other.backoff.reset()
            other.next_poll = min(other.next_poll, time.monotonic())
        if kind in (ResultKind.FINISHED, ResultKind.UNFINISHED):
            log.info("%s %s in %.3fs", where, kind.value, result.duration, extra=extra)
        elif kind in (ResultKind.FAILED, ResultKind.RETRYING):
            log.warning("%s %s: %s", where, kind.value, result.error, extra=extra)
        elif kind is ResultKind.LOST:
            log.warning("%s lost its claim; its writes were rolled back", where, extra=extra)
        elif kind is ResultKind.UNRECORDED:
            log.warning("%s failed: %s", where, result.error, extra=extra)
            error = ErrorInfo(result.error or "unknown error", result.error_type, result.traceback)
            self._write(
                f"recording the failure of {where}",
                lambda conn: self.dialect.fail(
                    conn, lane.worker.table, source_id, token, error, result.retry_delay
                ),
                extra,
            )
        elif kind is ResultKind.CRASHED:
            log.error("%s: %s", where, result.error, extra=extra)
            self._release(
                lane, source_id, token, extra["attempt"], result.error or "crashed", crashed=True
            )

    def _release(
        self,
        lane: Lane,
        source_id: Any,
        token: int,
        attempt: int | str,
        message: str,
        crashed: bool,
    ) -> None:
        error = ErrorInfo(message, "dbworker.WorkerCrashed" if crashed else None)
        where, extra = _item(lane, source_id, attempt)
        self._write(
            f"releasing {where}",
            lambda conn: self.dialect.release(
                conn, lane.worker.table, source_id, token, error, lane.worker.max_crashes, crashed
            ),
            extra,
        )

    # -- renewal, timeouts, stopping ---------------------------------------------------

    def _renew(self) -> None:
        self._next_renewal = time.monotonic() + self.timings.renew_every
        for lane in self.lanes.values():
            if not lane.held:
                continue
            held = [(source_id, h.token) for source_id, h in lane.held.items()]
            try:
                lost = self._transaction(
                    f"renewing the leases of worker={lane.worker.name}",
                    functools.partial(self._renew_lane, lane=lane, held=held),
                )
            except _Deferred:
                # Try again as soon as the database may answer, not a renewal period
                # later: after an outage longer than the lease, the renewal must come
                # before the next claim, or this coordinator takes over its own items.
                self._next_renewal = min(self._next_renewal, self._db_blocked_until)
                continue
            for source_id in lost:
                # Fenced renewal failed: another holder has the item. Stop this one so
                # it does not keep working beside the new holder.
                lost_claim = lane.held.pop(source_id, None)
                if lost_claim is not None:
                    lane.executor.kill((lane.worker.name, source_id, lost_claim.token))
                    where, extra = _item(lane, source_id, lost_claim.attempt)
                    log.warning("%s lost its claim; handler stopped", where, extra=extra)

    def _renew_lane(self, conn: Connection, lane: Lane, held: list[tuple[Any, int]]) -> list[Any]:
        missed = self.dialect.renew(conn, lane.worker.table, held, self.timings.lease_seconds)
        tokens = dict(held)
        # A handler that just completed also fails the renewal (no longer WORKING),
        # with its token still current: that is not a lost claim.
        return [
            source_id
            for source_id in missed
            if self.dialect.current_token(conn, lane.worker.table, source_id) != tokens[source_id]
        ]

    def _enforce_timeouts(self, now: float) -> None:
        for lane in self.lanes.values():
            limit = lane.worker.timeout
            if limit is None:
                continue
            for source_id, held in list(lane.held.items()):
                if now - held.started < limit:
                    continue
                if not lane.executor.kill((lane.worker.name, source_id, held.token)):
                    continue
                lane.held.pop(source_id)
                exc = HandlerTimeout(
                    f"handler of worker {lane.worker.name!r} ran longer than its timeout "
                    f"of {limit}s and was killed"
                )
                retry = lane.worker.retry
                delay = (
                    retry.delay(held.failures)
                    if retry and retry.applies(exc, held.failures)
                    else None
                )
                error = ErrorInfo(f"HandlerTimeout: {exc}", "dbworker.HandlerTimeout")
                where, extra = _item(lane, source_id, held.attempt)
                log.warning("%s timed out after %ss", where, limit, extra=extra)
                self._write(
                    f"recording the timeout of {where}",
                    functools.partial(
                        self.dialect.fail,
                        worker=lane.worker.table,
                        source_id=source_id,
                        token=held.token,
                        error=error,
                        retry_delay=delay,
                    ),
                    extra,
                )

    def _kill_running(self) -> None:
        for lane in self.lanes.values():
            for source_id, held in list(lane.held.items()):
                if lane.executor.kill((lane.worker.name, source_id, held.token)):
                    lane.held.pop(source_id)
                    where, extra = _item(lane, source_id, held.attempt)
                    log.warning("%s stopped by coordinator shutdown; released", where, extra=extra)
                    self._release(
                        lane,
                        source_id,
                        held.token,
                        held.attempt,
                        "stopped by coordinator shutdown",
                        crashed=False,
                    )

    # -- polling and claiming --------------------------------------------------------

    def _poll(self, lane: Lane, now: float) -> None:
        worker = lane.worker
        try:
            if now >= lane.next_discovery:
                # While claims come back full, known records feed them: look for new
                # rows once per poll interval (the latency of an idle worker's poll),
                # not before every claim.
                self._discover(lane, now)
                lane.next_discovery = now + self.timings.poll_seconds
            free = lane.executor.free_slots()
            claims = self._transaction(
                f"claiming for worker={worker.name}",
                lambda conn: self.dialect.claim(
                    conn,
                    worker.table,
                    worker.eligible_query(),
                    free,
                    self.timings.lease_seconds,
                    self.owner,
                ),
            )
        except _Deferred:
            lane.next_poll = max(self._db_blocked_until, now + lane.backoff.next_wait())
            return
        if len(claims) < free:
            lane.next_discovery = now  # known work ran short: look for new rows first
        if not claims:
            lane.next_poll = now + lane.backoff.next_wait()
            return
        lane.backoff.reset()
        lane.next_poll = now
        self.health.claimed += len(claims)
        for claim in claims:
            where, extra = _item(lane, claim.source_id, claim.attempts)
            previous = lane.held.pop(claim.source_id, None)
            if previous is not None and claim.crashes > previous.crashes:
                # A takeover (it counted a crash) of our own expired lease: renewals
                # could not reach the database in time. The earlier run is fenced off
                # now; stop it rather than leave it running untracked beside the new one.
                lane.executor.kill((worker.name, claim.source_id, previous.token))
                log.warning(
                    "%s took over the item from this coordinator's own expired claim "
                    "(attempt %s); the earlier run was stopped",
                    where,
                    previous.attempt,
                    extra=extra,
                )
            elif previous is not None:
                # The earlier run completed (Unfinished, a retry) and its result is on
                # its way: keep it to report under its own attempt.
                lane.completing[(claim.source_id, previous.token)] = previous
            if claim.crashes >= worker.max_crashes:
                # The lease ran out under a holder that vanished, max_crashes times.
                message = (
                    f"the item's holder vanished {claim.crashes} times (lease expired without "
                    "renewal); giving up"
                )
                log.error("%s failed: %s", where, message, extra=extra)
                error = ErrorInfo(message, "dbworker.WorkerCrashed")
                self._write(
                    f"failing {where}",
                    functools.partial(
                        self.dialect.fail,
                        worker=worker.table,
                        source_id=claim.source_id,
                        token=claim.token,
                        error=error,
                    ),
                    extra,
                )
                continue
            lane.held[claim.source_id] = Held(
                claim.token, claim.attempts, claim.failures, time.monotonic(), claim.crashes
            )
            lane.executor.submit(worker.task(claim))

    def _discover(self, lane: Lane, now: float) -> None:
        worker = lane.worker
        if now >= lane.next_full_sweep:
            self._transaction(
                f"sweeping all rows of worker={worker.name}",
                lambda conn: _drain(lambda: self.dialect.sweep(conn, worker.table)),
            )
            lane.next_full_sweep = now + FULL_SWEEP_EVERY_SECONDS
            lane.next_sweep = now + SWEEP_EVERY_SECONDS
        elif worker.table.monotonic_keys and now >= lane.next_sweep:
            # Rows whose inserts committed after a larger key was discovered sit
            # below the watermark; re-check the keys discovered recently.
            # Keep the newest watermark older than the horizon: keys above it were
            # handed out within the horizon.
            while len(lane.watermarks) > 1 and lane.watermarks[1][0] < now - SWEEP_HORIZON_SECONDS:
                lane.watermarks.popleft()
            if lane.watermarks:
                seen_at, oldest = lane.watermarks[0]
                # Until a watermark is older than the horizon, a key handed out before
                # the first one was seen can still commit below it: sweep every key.
                above = oldest if seen_at <= now - SWEEP_HORIZON_SECONDS else None
                self._transaction(
                    f"sweeping recent rows of worker={worker.name}",
                    lambda conn: self.dialect.sweep(conn, worker.table, above=above),
                )
            lane.next_sweep = now + SWEEP_EVERY_SECONDS
        if worker.table.monotonic_keys:
            watermark = self._transaction(
                f"discovering rows of worker={worker.name}",
                lambda conn: (
                    self.dialect.discover(conn, worker.table),
                    self.dialect.watermark(conn, worker.table),
                )[1],
            )
            if watermark is not None and (
                not lane.watermarks or lane.watermarks[-1][1] != watermark
            ):
                lane.watermarks.append((now, watermark))
        else:
            self._transaction(
                f"discovering rows of worker={worker.name}",
                lambda conn: self.dialect.discover(conn, worker.table),
            )


def _item(lane: Lane, source_id: Any, attempt: int | str) -> tuple[str, dict[str, Any]]:
    """How log records name an item: in the message and as attributes (``extra``), so
    log pipelines can filter by worker, source_id and attempt."""
    where = f"worker={lane.worker.name} source_id={source_id!r} attempt={attempt}"
    return where, {"worker": lane.worker.name, "source_id": source_id, "attempt": attempt}


class _Deferred(Exception):
    """A database step did not happen now; the loop carries on and tries later."""


def _drain(step: Callable[[], int]) -> int:
    total = 0
    while True:
        added = step()
        total += added
        if added == 0:
            return total
