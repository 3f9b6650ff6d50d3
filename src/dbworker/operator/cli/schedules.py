"""The ``schedules`` command: each periodic worker's schedule, the last slot made and
how its tick stands, and the next slot."""

from __future__ import annotations

import argparse

from ...coordinator import Coordinator
from ..schedule_display import last_status_text, schedule_fields, slot_text
from .loading import EXIT_OK
from .output import as_json, table

HEADERS = ("worker", "schedule", "catch_up", "last_slot", "status", "next_slot")


def cmd_schedules(coordinator: Coordinator, args: argparse.Namespace) -> int:
    found = coordinator.operations.schedules()
    if args.json:
        print(as_json([schedule_fields(state) for state in found]))
        return EXIT_OK
    rows = [
        [
            state.worker,
            state.schedule,
            state.catch_up,
            slot_text(state.last_slot),
            last_status_text(state),
            slot_text(state.next_slot),
        ]
        for state in found
    ]
    if not rows:
        print("no periodic workers registered")
        return EXIT_OK
    print(table(HEADERS, rows))
    print("times in UTC, on the database's clock")
    return EXIT_OK
