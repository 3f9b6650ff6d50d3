"""Execution statuses: the public four, plus the internal phase of a discovered row."""

from __future__ import annotations

import enum


class ExecutionStatus(enum.StrEnum):
    """Where one source row stands with one worker.

    The values are what the execution table stores, so SQL and Python agree.
    """

    WORKING = "working"
    UNFINISHED = "unfinished"
    FINISHED = "finished"
    FAILED = "failed"


class Phase(enum.StrEnum):
    """Every value the execution table's ``status`` column can hold.

    ``PENDING`` marks a source row that discovery has seen but no worker has
    claimed yet; the public API reports it as ``None`` ("never claimed").
    """

    PENDING = "pending"
    WORKING = "working"
    UNFINISHED = "unfinished"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def public(self) -> ExecutionStatus | None:
        return None if self is Phase.PENDING else ExecutionStatus(self.value)


TERMINAL: frozenset[Phase] = frozenset({Phase.FINISHED, Phase.FAILED})
OPEN: frozenset[Phase] = frozenset({Phase.PENDING, Phase.UNFINISHED, Phase.WORKING})
