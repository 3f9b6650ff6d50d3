"""When a periodic worker's slots fall, and which missed slots a catch-up policy makes.

A schedule is a cron expression (five fields, read in a timezone, daylight saving time
handled as Debian's cron does: a slot in the hour skipped in spring runs just after
the change, a slot in the hour repeated in autumn runs once) or a fixed interval
(``every``), whose slots are whole multiples of the interval since the Unix epoch, so
that every coordinator computes the same slots without asking anyone. Each slot is
made into one tick row, exactly once, by a unique constraint (``periodic``).

Pure: every moment is an argument (timezone-aware datetimes).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import zoneinfo
from collections.abc import Iterator

from cronsim import CronSim, CronSimError

from .errors import ConfigurationError

UTC = dt.UTC
#: Slots are counted in microseconds since the epoch: exact in every database's
#: integer type, so two coordinators' tick rows for one slot are equal.
MICROSECONDS = 1_000_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
#: The most missed slots ``catch_up="all"`` makes at once (the most recent ones).
MAX_CATCH_UP = 1000


class CatchUp(enum.StrEnum):
    """What a coordinator starting after every coordinator was down makes of the slots
    nobody made meanwhile."""

    LATEST = "latest"  # one tick, for the most recent missed slot
    ALL = "all"  # every missed slot (the most recent MAX_CATCH_UP of them)
    NONE = "none"  # none: the schedule goes on from now


def to_microseconds(moment: dt.datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * MICROSECONDS + delta.microseconds


def from_microseconds(value: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=value)


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    cron: str | None = None
    every: dt.timedelta | None = None
    timezone: str = "UTC"
    catch_up: CatchUp = CatchUp.LATEST

    @classmethod
    def of(
        cls,
        *,
        cron: str | None = None,
        every: dt.timedelta | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
    ) -> Schedule:
        """A schedule from a periodic worker's arguments; a ConfigurationError naming
        the value otherwise."""
        if (cron is None) == (every is None):
            raise ConfigurationError(
                "a periodic worker needs exactly one of cron= (a cron expression) or "
                f"every= (a timedelta); got cron={cron!r}, every={every!r}"
            )
        if cron is not None:
            if not isinstance(cron, str) or len(cron.split()) != 5:
                raise ConfigurationError(
                    f"cron must be a cron expression of five fields (minute hour "
                    f"day-of-month month day-of-week), got {cron!r}"
                )
            try:
                CronSim(cron, _EPOCH)
            except CronSimError as exc:
                raise ConfigurationError(f"malformed cron expression {cron!r}: {exc}") from None
        if every is not None:
            if not isinstance(every, dt.timedelta):
                raise ConfigurationError(f"every must be a datetime.timedelta, got {every!r}")
            if every <= dt.timedelta(0):
                raise ConfigurationError(f"every must be positive, got {every!r}")
            if every % dt.timedelta(microseconds=1):
                raise ConfigurationError(f"every must be whole microseconds, got {every!r}")
        if not isinstance(timezone, str):
            raise ConfigurationError(
                f"timezone must be an IANA name such as 'UTC', got {timezone!r}"
            )
        try:
            zoneinfo.ZoneInfo(timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"unknown timezone {timezone!r} (an IANA name such as 'Europe/Berlin')"
            ) from None
        try:
            policy = CatchUp(catch_up)
        except ValueError:
            known = ", ".join(repr(p.value) for p in CatchUp)
            raise ConfigurationError(f"catch_up must be one of {known}, got {catch_up!r}") from None
        return cls(cron, every, timezone, policy)

    @property
    def zone(self) -> dt.tzinfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.timezone})"
        return f"every {self.every}"

    def _every_us(self) -> int:
        assert self.every is not None
        return self.every // dt.timedelta(microseconds=1)

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``moment``."""
        if self.cron is None:
            step = self._every_us()
            return from_microseconds((to_microseconds(moment) // step + 1) * step)
        return next(CronSim(self.cron, moment.astimezone(self.zone))).astimezone(UTC)

    def latest(self, moment: dt.datetime) -> dt.datetime | None:
        """The last slot at or before ``moment`` (None before the first)."""
        return next(self._backwards(moment), None)

    def _backwards(self, moment: dt.datetime) -> Iterator[dt.datetime]:
        """The slots at or before ``moment``, latest first."""
        if self.cron is None:
            step = self._every_us()
            k = to_microseconds(moment) // step
            while True:
                yield from_microseconds(k * step)
                k -= 1
        # Iterating backwards, cronsim's first candidate is the moment with its
        # microseconds dropped; one microsecond makes "at or before" of "before".
        start = moment.astimezone(self.zone).replace(microsecond=1)
        for slot in CronSim(self.cron, start, reverse=True):
            yield slot.astimezone(UTC)

    def slots(self, after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
        """The slots in (``after``, ``until``], earliest first."""
        found = []
        for slot in self._backwards(until):
            if slot <= after:
                break
            found.append(slot)
        return found[::-1]

    def missed(self, last: dt.datetime | None, now: dt.datetime) -> tuple[list[dt.datetime], int]:
        """The missed slots this schedule's catch-up policy makes, for a coordinator
        starting at ``now`` whose last tick (anyone's) was for ``last``; and how many
        more ``ALL`` left out past ``MAX_CATCH_UP`` (for a cron schedule, 1 when any
        were: counting them could take a walk through years of slots).

        A schedule that never ticked has missed nothing: it starts with the first slot
        after ``now``.
        """
        if last is None or self.catch_up is CatchUp.NONE:
            return [], 0
        if self.catch_up is CatchUp.LATEST:
            latest = self.latest(now)
            return ([latest] if latest is not None and latest > last else []), 0
        found: list[dt.datetime] = []
        for slot in self._backwards(now):
            if slot <= last or len(found) > MAX_CATCH_UP:
                break
            found.append(slot)
        if len(found) <= MAX_CATCH_UP:
            return found[::-1], 0
        found = found[:MAX_CATCH_UP]
        if self.cron is None:
            step = self._every_us()
            total = to_microseconds(now) // step - to_microseconds(last) // step
            return found[::-1], total - MAX_CATCH_UP
        return found[::-1], 1
