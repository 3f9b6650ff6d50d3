"""The overview's Schedules section: each periodic worker's schedule, its last slot
made and that tick's status, and its next slot, as the template reads them."""

from __future__ import annotations

from typing import Any

from ...operations import Operations
from ..schedule_display import last_status_text, slot_text


def schedule_rows(operations: Operations) -> list[dict[str, Any]]:
    """One row per periodic worker; none (and no query) without periodic workers, so
    the page leaves the section out."""
    return [
        {
            "worker": state.worker,
            "schedule": state.schedule,
            "catch_up": state.catch_up,
            "last_slot": slot_text(state.last_slot),
            "last_tick": state.last_tick,
            "status": last_status_text(state),
            "next_slot": slot_text(state.next_slot),
            # Machine-readable, for <time datetime=...>.
            "next_slot_iso": state.next_slot.isoformat(),
        }
        for state in operations.schedules()
    ]
