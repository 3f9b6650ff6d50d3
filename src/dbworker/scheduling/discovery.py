"""When each worker looks for new source rows, and for rows committed out of key order.

Discovery adds pending records above the watermark (the largest known key). Rows
whose inserts commit after a larger key was discovered land below it: a sweep of
the keys discovered recently (within ``SWEEP_HORIZON_SECONDS``) finds them, and
a full sweep, rarely, anything older.

Through a backlog (a discovery round came back full), the next round runs ahead, on
a pass of the loop that does not poll the worker (the executor has no room for a claim,
or the poll is not due yet), once fewer than ``AHEAD_BATCHES``
rounds' worth of the records discovered are left unclaimed here: waited for until a
claim came back short, each round of a backlog held the next claim up by its own
length (10-20 ms for a round of 1,000 on PostgreSQL, busy), and every handler process
emptied its pipe meanwhile.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from ..dialects import Dialect, WorkerTable
from .outbox import Deferred, Outbox

#: Recent watermarks kept for the sweep that finds rows committed out of key order.
SWEEP_HORIZON_SECONDS = 120.0
SWEEP_EVERY_SECONDS = 5.0
#: A full anti-join sweep (cost grows with the source table) runs this rarely.
FULL_SWEEP_EVERY_SECONDS = 600.0
#: While claims come back full, the known records feed them and discovery waits for
#: them to run short; but at least this often, so that rows an ``eligible`` order puts
#: first (a priority, not the key) wait at most this long behind a backlog.
BUSY_DISCOVERY_SECONDS = 1.0
#: Through a backlog, discovery runs ahead once fewer records than this many rounds'
#: worth (``Dialect.discovery_batch``) are left unclaimed.
AHEAD_BATCHES = 2


@dataclass(slots=True)
class DiscoverySchedule:
    """One worker's discovery and sweep schedule (times are ``time.monotonic()``)."""

    watermarks: collections.deque[tuple[float, Any]] = field(default_factory=collections.deque)
    next_sweep: float = 0.0
    next_full_sweep: float = 0.0
    next_discovery: float = 0.0
    #: The last poll claimed nothing, and no wake-up came since: the next may probe.
    idle: bool = False
    #: The last discovery round came back full: more rows wait above the watermark.
    backlog: bool = False
    #: Records that rounds since the backlog began found and claims here have not taken
    #: (an estimate: other coordinators claim too, and a round counts keys it found).
    unclaimed: int = 0

    def due(self, now: float) -> bool:
        return now >= self.next_discovery

    def ran_short(self, now: float) -> None:
        """A claim came back short (or empty): look for new rows before the next one."""
        self.next_discovery = now

    def took(self, count: int) -> None:
        """A claim here took ``count`` records."""
        self.unclaimed = max(0, self.unclaimed - count)

    def ahead(self, outbox: Outbox, dialect: Dialect, table: WorkerTable, now: float) -> None:
        """Through a backlog, run the next round (in a transaction of its own) once fewer
        than ``AHEAD_BATCHES`` rounds' worth are left unclaimed, where the dialect allows
        (``Dialect.discovers_ahead``); called on each pass of the loop that does not poll
        the worker (no room for a claim, or its poll not due).
        A round deferred (the database is away) is tried again at a later call."""
        if (
            dialect.discovers_ahead
            and self.backlog
            and self.unclaimed < AHEAD_BATCHES * dialect.discovery_batch
        ):
            with contextlib.suppress(Deferred):
                self.run(outbox, dialect, table, now)

    def claims_full(self, now: float, poll_seconds: float) -> None:
        """Discovery just ran and the claim after it came back full: known records feed
        the next claims, so the next discovery waits until they run short."""
        self.next_discovery = now + max(poll_seconds, BUSY_DISCOVERY_SECONDS)

    def probe_above(self, now: float) -> Any:
        """The watermark above which an idle poll may probe instead of discovering and
        claiming; None when a full poll is due. Only once the watermark has stood still
        for the sweep horizon (then the recent-rows sweep covers what discovery does)
        and no full sweep is due."""
        if not self.idle or not self.watermarks or now >= self.next_full_sweep:
            return None
        seen_at, watermark = self.watermarks[-1]
        return watermark if seen_at <= now - SWEEP_HORIZON_SECONDS else None

    def run(self, outbox: Outbox, dialect: Dialect, table: WorkerTable, now: float) -> None:
        """Discover (and sweep, when due) in transactions of ``outbox``; raises Deferred."""
        self.sweep(outbox, dialect, table, now)
        found = outbox.transaction(
            f"discovering rows of worker={table.name}",
            lambda conn: self.discover(conn, dialect, table),
        )
        self.discovered(found, now, dialect.discovery_batch)

    def sweep(self, outbox: Outbox, dialect: Dialect, table: WorkerTable, now: float) -> int:
        """The sweeps that are due, each in a transaction of ``outbox``; the records they
        added. Raises Deferred."""
        name = table.name
        added = 0
        if now >= self.next_full_sweep:
            added = outbox.transaction(
                f"sweeping all rows of worker={name}",
                lambda conn: repeat_while_adding(lambda: dialect.sweep(conn, table)),
            )
            self.next_full_sweep = now + FULL_SWEEP_EVERY_SECONDS
            self.next_sweep = now + SWEEP_EVERY_SECONDS
        elif table.monotonic_keys and now >= self.next_sweep:
            # Keep the newest watermark older than the horizon: keys above it were
            # handed out within the horizon.
            watermarks = self.watermarks
            while len(watermarks) > 1 and watermarks[1][0] < now - SWEEP_HORIZON_SECONDS:
                watermarks.popleft()
            if watermarks:
                seen_at, oldest = watermarks[0]
                # Until a watermark is older than the horizon, a key handed out before
                # the first one was seen can still commit below it: sweep every key.
                above = oldest if seen_at <= now - SWEEP_HORIZON_SECONDS else None
                added = outbox.transaction(
                    f"sweeping recent rows of worker={name}",
                    lambda conn: dialect.sweep(conn, table, above=above),
                )
            self.next_sweep = now + SWEEP_EVERY_SECONDS
        return int(added or 0)

    def discover(
        self, conn: Connection, dialect: Dialect, table: WorkerTable, claim_follows: bool = False
    ) -> tuple[int, Any]:
        """Add the pending records of new rows in ``conn``'s transaction (the claim's,
        so that a wake-up's rows are discovered and claimed with one COMMIT, when
        ``claim_follows``); how many rows the round found and the new watermark, for
        ``discovered`` once that transaction committed."""
        if not table.monotonic_keys:
            return dialect.discover(conn, table), None
        if claim_follows:
            return dialect.discover_for_claim(conn, table)
        return dialect.discover_to_watermark(conn, table)

    def discovered(self, found: tuple[int, Any], now: float, batch: int) -> None:
        """The transaction of ``discover`` committed with ``found`` (a round of at most
        ``batch`` rows)."""
        count, watermark = found
        self.unclaimed = self.unclaimed + count if self.backlog else count
        self.backlog = count >= batch
        if watermark is not None and (not self.watermarks or self.watermarks[-1][1] != watermark):
            self.watermarks.append((now, watermark))


def repeat_while_adding(step: Callable[[], int]) -> int:
    """Run ``step`` (which adds records and says how many) until it adds none."""
    total = 0
    while True:
        added = step()
        total += added
        if added == 0:
            return total
