"""What ``Coordinator.health()`` returns: a snapshot of the scheduler's state."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    """The scheduler's health when ``Coordinator.health()`` was called."""

    #: Whether the scheduling thread runs.
    running: bool = False
    #: False from a database error until the next transaction that succeeds.
    database_ok: bool = True
    last_error: str | None = None
    #: When ``last_error`` happened (seconds since the epoch).
    last_error_at: float | None = None
    claimed: int = 0
    completed: int = 0
    #: Set if the scheduler itself stopped on an unexpected error (a bug).
    crashed: str | None = None

    @classmethod
    def of(cls, live: Any) -> Health:
        """A snapshot of ``live`` (the scheduler's counters, which it keeps changing)."""
        return cls(**{f.name: getattr(live, f.name) for f in dataclasses.fields(cls)})
