"""What the scheduler reports about items: the kinds of ``dbworker.Event``.

Plain data in the core, because the transition table names the event each of its rows
reports (``core.transitions``); ``dbworker.events`` holds the events themselves.
"""

from __future__ import annotations

import enum


class EventKind(enum.StrEnum):
    #: The scheduler claimed the item (a new attempt).
    CLAIMED = "claimed"
    #: The handler returned Finished() and it was recorded.
    FINISHED = "finished"
    #: The handler returned Unfinished(): another invocation follows.
    UNFINISHED = "unfinished"
    #: The handler raised and no retry is left: the item is FAILED.
    FAILED = "failed"
    #: The handler raised and the retry policy runs it again later.
    RETRIED = "retried"
    #: The handler's process died (or its holder vanished too often).
    CRASHED = "crashed"
    #: The handler ran past its timeout and was killed.
    TIMED_OUT = "timed_out"
    #: The claim was taken over by another holder; the handler's writes rolled back.
    LOST = "lost"
    #: A stopping coordinator gave the item back, claimable at once by anyone: its
    #: handler was killed at the stop's deadline, or it had not started.
    RELEASED = "released"
    #: The item was cancelled (``coordinator.cancel``): FAILED with ``dbworker.Cancelled``,
    #: its handler (if one ran) stopped and its writes rolled back.
    CANCELLED = "cancelled"
    #: A coordination transaction failed (the database was unreachable, a deadlock).
    DATABASE_ERROR = "database_error"
    #: A coordination transaction lost to a concurrent one (a deadlock; on a Galera
    #: cluster, a certification conflict at commit) and is tried again: contention,
    #: not a failure of the database.
    CONTENTION = "contention"
    #: A handler blocked its event loop (the asyncio executor): ``duration`` is for how
    #: long the other handlers on that loop could not run; no ``source_id``.
    LOOP_LAG = "loop_lag"
