"""Lease, renewal and backoff arithmetic. Pure: ``now`` is always an argument."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .errors import ConfigurationError

#: Renew a held claim when a third of its lease has passed, so two renewals can
#: fail (a slow query, a brief outage) before the lease runs out.
RENEW_FRACTION = 1 / 3
#: At most this many tasks claimed ahead per slot of the threads and asyncio executors
#: (``executors.multiplexed``), whose handler processes read their rows meanwhile
#: (``invocation.reading``). With one, a wave of I/O-bound handlers left part of the
#: next wave unclaimed: its handlers' starts reach the scheduler in two or three
#: bursts, and it tops the tasks up only once half their room is free (one claim for
#: many), so the rest of the room waited for the next wave, whose slots then waited
#: for a claim (``benchmarks.io``: 17-24 of 50 slots started 5-10 ms late at every
#: wave).
AHEAD_PER_SLOT = 2


def require_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Timings:
    lease_seconds: float = 30.0
    poll_seconds: float = 0.25
    max_poll_seconds: float = 10.0

    def __post_init__(self) -> None:
        require_positive("lease_seconds", self.lease_seconds)
        require_positive("poll_seconds", self.poll_seconds)
        require_positive("max_poll_seconds", self.max_poll_seconds)
        if self.max_poll_seconds < self.poll_seconds:
            raise ConfigurationError(
                f"max_poll_seconds ({self.max_poll_seconds}) must be >= "
                f"poll_seconds ({self.poll_seconds})"
            )
        if self.lease_seconds < 1:
            raise ConfigurationError(
                f"lease_seconds must be at least 1 second (got {self.lease_seconds}): "
                "renewals need time to reach the database before the lease runs out"
            )

    @property
    def renew_every(self) -> float:
        return self.lease_seconds * RENEW_FRACTION


@dataclass(slots=True)
class PollBackoff:
    """Exponential wait between empty polls: poll_seconds, doubling, capped.

    A successful claim resets it so a backlog drains without waiting.
    """

    initial: float
    maximum: float
    _current: float = field(init=False)

    def __post_init__(self) -> None:
        self._current = self.initial

    def reset(self) -> None:
        self._current = self.initial

    def next_wait(self) -> float:
        """The wait after one more empty poll."""
        wait = self._current
        self._current = min(self._current * 2, self.maximum)
        return wait


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Opt-in retries of handler exceptions, with exponential backoff and jitter.

    ``max_retries`` retries follow the first failure; ``retry_on`` limits which
    exceptions are retried (all ``Exception`` subclasses by default).
    """

    max_retries: int = 3
    base_delay: float = 1.0
    max_delay: float = 300.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ConfigurationError(f"max_retries must be an int, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ConfigurationError(f"max_retries must be >= 0, got {self.max_retries}")
        require_positive("base_delay", self.base_delay)
        require_positive("max_delay", self.max_delay)
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter <= 1
        ):
            raise ConfigurationError(f"jitter must be between 0 and 1, got {self.jitter}")
        if not self.retry_on or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on
        ):
            raise ConfigurationError("retry_on must be a non-empty tuple of exception classes")

    def applies(self, exc: BaseException, failures_so_far: int) -> bool:
        return failures_so_far < self.max_retries and isinstance(exc, self.retry_on)

    def delay(self, failures_so_far: int, rng: random.Random | None = None) -> float:
        """Backoff before retry number ``failures_so_far + 1``."""
        base = min(self.base_delay * (2**failures_so_far), self.max_delay)
        spread = base * self.jitter
        jitter = (rng or random).uniform(-spread, spread)
        return max(0.0, float(base + jitter))
