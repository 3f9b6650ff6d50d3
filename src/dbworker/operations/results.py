"""What ``coordinator.operations`` answers with: frozen snapshots, taken when asked.

Times read from the database are on its clock (one clock for every host): epoch
seconds in the registry's and the backlog's figures (as ``Health.last_error_at``),
timezone-aware UTC datetimes in execution records (as ``Worker.state()``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from ..core.status import ExecutionStatus
from ..records import ClaimOwner


@dataclasses.dataclass(frozen=True, slots=True)
class ServedWorker:
    """A worker as a coordinator's registry row describes it."""

    name: str
    concurrency: int
    #: The executor's class name (``"Pool"``, ``"Subprocess"``, ...).
    executor: str


@dataclasses.dataclass(frozen=True, slots=True)
class RegisteredCoordinator:
    """A coordinator's row in the registry (``dbworker_coordinators``)."""

    #: A random id per start (host and pid repeat: containers often run as pid 1).
    id: str
    host: str
    pid: int
    #: The dbworker version it runs.
    version: str
    workers: tuple[ServedWorker, ...]
    #: Its ``database_url``, password masked.
    database: str | None
    #: Epoch seconds on the database's clock.
    started_at: float
    heartbeat_at: float
    #: Seconds since its last heartbeat, and since it started.
    heartbeat_age: float
    uptime: float
    #: False once it missed a few heartbeats (stale): it vanished, killed or its host
    #: gone, and any live coordinator deletes its row after a while.
    alive: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Backlog:
    """One worker's work as the database holds it (``dbworker status``).

    Counting ``waiting`` reads the whole eligible set, so unless asked to count live
    these come from a running coordinator's recent count, with its ``age``.
    """

    worker: str
    #: Records per status (``None``: discovered, never claimed); absent: none.
    counts: Mapping[ExecutionStatus | None, int]
    #: Source rows that match ``eligible`` now and are not claimed, discovered or
    #: not; None when the source table does not exist (yet).
    waiting: int | None
    #: The age of the oldest of those (None: nothing waits, or nothing dates it).
    oldest_waiting_seconds: float | None
    #: Records held under a live lease.
    running: int
    finished_last_minute: int
    #: Items finished in each minute of the last hour, oldest first.
    history: tuple[int, ...]
    #: When counted (epoch seconds, the database's clock), and how long ago.
    measured_at: float
    age: float
    #: True if a running coordinator counted them (refreshed every few seconds, less
    #: often when counting is slow); False if counted for this call.
    cached: bool


@dataclasses.dataclass(frozen=True, slots=True)
class FailedRecord:
    """A FAILED execution record, in the order ``failed_items`` lists them."""

    source_id: Any
    #: The last error (``"ValueError: ..."``) and its exception class.
    error: str | None
    error_type: str | None
    attempts: int
    crashes: int
    updated_at: dt.datetime | None
    #: The formatted traceback, when asked for (``tracebacks=True``).
    traceback: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ItemRecord:
    """One execution record in full, as ``dbworker show`` prints it."""

    worker: str
    source_id: Any
    #: An ``ExecutionStatus`` value, or ``"pending"`` for a row discovered but not
    #: claimed yet.
    status: str
    attempts: int
    failures: int
    crashes: int
    #: The coordinator that made the last claim.
    owner: ClaimOwner | None
    discovered_at: dt.datetime | None
    claimed_at: dt.datetime | None
    not_before: dt.datetime | None
    lease_expires_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime | None
    error_type: str | None
    error: str | None
    traceback: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's handlers in this coordinator, now."""

    #: Its concurrency.
    slots: int
    #: Handlers running.
    running: int
    #: Claims held, including items claimed ahead of a free slot.
    held: int

    @property
    def free(self) -> int:
        """Slots with no handler running."""
        return max(0, self.slots - self.running)


@dataclasses.dataclass(frozen=True, slots=True)
class LiveGauges:
    """What this coordinator's process knows without asking the database: its
    handlers, and the latest cached backlog its heartbeat read or counted."""

    workers: Mapping[str, WorkerLoad]
    #: Per worker of whichever coordinator counted them (empty until this one's
    #: heartbeat has read or made a count: it runs only while started).
    backlog: Mapping[str, Backlog]
    #: Seconds since that count (None: none yet).
    backlog_age: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class LimitFigures:
    """One limited worker's limits (issue 26) and what they hold back now
    (``Operations.limits``; an item both key-busy and rate-limited counts in both)."""

    worker: str
    #: The ``exclusive_by`` key expression's SQL text (``"jobs.customer"``), or None.
    exclusive_by: str | None
    #: The rate (``"5/s"``), and the ``rate_limit_by`` key expression's text, or None.
    rate_limit: str | None
    rate_limit_by: str | None
    #: Items waiting (eligible now, not claimed) whose exclusive key a WORKING record
    #: holds: they wait for it to end. None without ``exclusive_by``, or without the
    #: source table.
    key_busy: int | None
    #: Rate slots used in the current window (summed over keys with ``rate_limit_by``),
    #: and the slots each key has per window (N); None without ``rate_limit``.
    rate_slots_used: int | None
    rate_slots: int | None
    #: Items waiting whose key has used all its slots this window: rate-limited until
    #: a slot's window passes. None without ``rate_limit``, or without the source table.
    rate_limited: int | None
    #: When counted (epoch seconds, the database's clock).
    measured_at: float
