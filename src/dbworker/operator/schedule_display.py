"""Periodic workers' schedules as people read them, in ``dbworker schedules`` and on
the dashboard alike: slots in UTC to the second, a tick's status by name."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ..operations import ScheduleState
from .display import status_name

#: What a schedule shows for a slot or status that does not exist yet.
NONE_YET = "-"


def slot_text(moment: dt.datetime | None) -> str:
    """A slot in UTC, ``2024-05-01 04:30:00Z``; sub-second slots (``every`` less than a
    second) keep their fraction."""
    if moment is None:
        return NONE_YET
    utc = moment.astimezone(dt.UTC)
    spec = "microseconds" if utc.microsecond else "seconds"
    return utc.replace(tzinfo=None).isoformat(sep=" ", timespec=spec) + "Z"


def last_status_text(state: ScheduleState) -> str:
    """The last tick's status: ``pending`` while it is not claimed, ``-`` with no tick."""
    return NONE_YET if state.last_tick is None else status_name(state.last_status)


def schedule_fields(state: ScheduleState) -> dict[str, Any]:
    """The fields of ``--json``: the dataclass's, the status by name (or None)."""
    fields = dataclasses.asdict(state)
    fields["last_status"] = None if state.last_tick is None else last_status_text(state)
    return fields
