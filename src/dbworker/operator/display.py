"""Figures and records as people read them, in ``dbworker`` and the dashboard alike:
ages and periods, status names, and one execution record's fields and history."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.status import ExecutionStatus
from ..operations import ItemRecord


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


def record_fields(record: ItemRecord) -> dict[str, Any]:
    """The record's fields in the order they are shown, the owner as ``host pid N``."""
    fields = dataclasses.asdict(record)
    owner = record.owner
    fields["owner"] = None if owner is None else f"{owner['host']} pid {owner['pid']}"
    return fields


def history(record: dict[str, Any]) -> list[tuple[Any, str]]:
    """The record's story from its timestamps, oldest first: what it keeps of the past
    (each record keeps the latest claim and ending; the counters say how many came before)."""
    events: list[tuple[Any, str]] = []
    if record["discovered_at"] is not None:
        events.append((record["discovered_at"], "discovered (pending)"))
    if record["claimed_at"] is not None:
        previous = record["attempts"] - 1
        before = f" after {previous} earlier attempt(s)" if previous > 0 else ""
        who = f" by {record['owner']}" if record["owner"] else ""
        events.append((record["claimed_at"], f"claimed, attempt {record['attempts']}{who}{before}"))
    status = record["status"]
    if status == "finished" and record["finished_at"] is not None:
        events.append((record["finished_at"], "finished"))
    elif status in ("failed", "unfinished") and record["updated_at"] is not None:
        what = "failed" if status == "failed" else "unfinished"
        if record["error"]:
            what += f": {record['error'].splitlines()[0]}"
        events.append((record["updated_at"], what))
    if status == "unfinished" and record["not_before"] is not None:
        events.append((record["not_before"], "due again"))
    if status == "working" and record["lease_expires_at"] is not None:
        events.append((record["lease_expires_at"], "lease runs out unless renewed"))
    return sorted(events, key=lambda item: item[0])
