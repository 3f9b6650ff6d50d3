"""The shapes of the execution records dbworker hands to applications.

``Worker.state()`` and ``Worker.failed()`` return plain dicts (they travel into JSON
and templates as they are); these TypedDicts give them types, so that a type checker
knows ``state["attempts"]`` is an int and refuses ``state["attempt"]``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from .core.status import ExecutionStatus


class ClaimOwner(TypedDict):
    """The coordinator that made the last claim."""

    host: str
    pid: int


class ExecutionState(TypedDict):
    """One worker's execution record of one source row (``Worker.state()``).

    Times are timezone-aware UTC datetimes on the database's clock.
    """

    execution_status: ExecutionStatus
    #: The last recorded error ("ValueError: ..."), its exception class and traceback.
    error: str | None
    error_type: str | None
    traceback: str | None
    #: Claims so far; each invocation is one.
    attempts: int
    #: Handler errors retried under the worker's RetryPolicy.
    failures: int
    #: Handler processes that died, and leases that expired under a vanished holder.
    crashes: int
    lease_expires_at: datetime | None
    not_before: datetime | None
    claimed_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime | None
    owner: ClaimOwner | None


class FailedItem(TypedDict):
    """A FAILED record, as ``Worker.failed()`` lists them."""

    source_id: Any
    error: str | None
    error_type: str | None
    attempts: int
    crashes: int
    updated_at: datetime | None
