"""Figures for people: ages and periods as ``dbworker status`` and the dashboard show them."""

from __future__ import annotations

from .core.status import ExecutionStatus


def duration_text(seconds: float | None) -> str:
    """An age or a period for people: 42s, 15m, 3.5h; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


#: What the command and the dashboard call records discovered but not claimed yet
#: (``None`` in the API), as the demo does.
NOT_CLAIMED = "pending"
#: The status columns, in the order they are shown.
STATUS_COLUMNS: tuple[ExecutionStatus | None, ...] = (None, *ExecutionStatus)


def status_name(status: ExecutionStatus | None) -> str:
    return NOT_CLAIMED if status is None else status.value
