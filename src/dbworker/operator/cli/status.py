"""The commands that show what runs and what waits: ``status`` (per worker: records by
status and the backlog, once or ``--watch``ed) and ``coordinators``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from datetime import datetime
from typing import Any

from ...coordinator import Coordinator
from ...operations import Backlog, LimitFigures, RegisteredCoordinator
from ..display import STATUS_COLUMNS, duration_text, status_name
from .loading import EXIT_OK, UsageError
from .output import as_json, table

#: What ``status`` adds to the counts, per worker (``Backlog`` describes them).
_BACKLOG_FIELDS = ("waiting", "oldest_waiting_seconds", "running", "finished_last_minute")


def _status_report(coordinator: Coordinator, args: argparse.Namespace) -> dict[str, Any]:
    operations = coordinator.operations
    workers = operations.check_tables(args.worker)
    names = [w.name for w in workers]
    figures = operations.backlog(names, live=args.live)
    limits = operations.limits(names)  # counted now: only limited workers cost a query
    # "limits" only for workers that have some: an unlimited worker's report is as before.
    return {
        name: {
            **_status_fields(item),
            **({"limits": _limit_fields(limits[name])} if name in limits else {}),
        }
        for name, item in figures.items()
    }


def _limit_fields(item: LimitFigures) -> dict[str, Any]:
    """A limited worker's limits and what they hold back."""
    fields = dataclasses.asdict(item)
    del fields["worker"], fields["measured_at"]
    return fields


def _status_fields(item: Backlog) -> dict[str, Any]:
    return {
        **{status_name(s): item.counts.get(s, 0) for s in STATUS_COLUMNS},
        **{field: getattr(item, field) for field in _BACKLOG_FIELDS},
        "age_seconds": round(item.age, 3),
        "source": "cache" if item.cached else "live",
    }


def _render_status(report: dict[str, Any]) -> str:
    headers = [
        "worker",
        *(status_name(s) for s in STATUS_COLUMNS),
        "waiting",
        "oldest",
        "running",
        "last_min",
    ]
    rows = [
        [
            name,
            *(item[status_name(s)] for s in STATUS_COLUMNS),
            "-" if item["waiting"] is None else item["waiting"],
            duration_text(item["oldest_waiting_seconds"]),
            item["running"],
            item["finished_last_minute"],
        ]
        for name, item in report.items()
    ]
    ages = [item["age_seconds"] for item in report.values() if item["source"] == "cache"]
    if ages:
        note = (
            f"as counted by a running coordinator {max(ages):.0f}s ago "
            "(--live counts now); waiting: eligible now and not claimed"
        )
    else:
        note = "counted now; waiting: eligible now and not claimed"
    return table(headers, rows) + "\n" + note + _render_limits(report)


def _render_limits(report: dict[str, Any]) -> str:
    """The limited workers' limits, and the waiting items they hold back, counted now."""
    limited = {name: item["limits"] for name, item in report.items() if "limits" in item}
    if not limited:
        return ""

    def shown(value: Any) -> Any:
        return "-" if value is None else value

    rows = [
        [
            name,
            shown(item["exclusive_by"]),
            shown(item["key_busy"]),
            shown(item["rate_limit"]),
            shown(item["rate_limit_by"]),
            "-" if item["rate_slots"] is None else f"{item['rate_slots_used']}",
            shown(item["rate_limited"]),
        ]
        for name, item in limited.items()
    ]
    headers = [
        "worker",
        "exclusive_by",
        "key_busy",
        "rate",
        "rate_by",
        "slots_used",
        "rate_limited",
    ]
    note = (
        "limits, counted now; key_busy: waiting, their key held by a working item; "
        "rate_limited: waiting, their key's rate slots all used this window"
    )
    return "\n\n" + table(headers, rows) + "\n" + note


def cmd_status(coordinator: Coordinator, args: argparse.Namespace) -> int:
    if args.watch is None:
        report = _status_report(coordinator, args)
        print(as_json(report) if args.json else _render_status(report))
        return EXIT_OK
    if args.watch <= 0:
        raise UsageError("--watch takes a positive number of seconds")
    try:
        while True:
            report = _status_report(coordinator, args)
            if args.json:
                print(as_json(report), flush=True)
            else:
                # Clear the screen and home the cursor: the table refreshes in place.
                stamp = datetime.now().astimezone().strftime("%H:%M:%S")
                sys.stdout.write("\x1b[H\x1b[2J" + f"every {args.watch:g}s, {stamp}\n")
                sys.stdout.write(_render_status(report) + "\n")
                sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_coordinators(coordinator: Coordinator, args: argparse.Namespace) -> int:
    found = coordinator.operations.coordinators()
    if args.json:
        print(as_json([_coordinator_fields(item) for item in found]))
        return EXIT_OK
    rows = [
        [
            item.id[:8],
            item.host,
            item.pid,
            item.version,
            ", ".join(f"{w.name}x{w.concurrency} {w.executor}" for w in item.workers),
            duration_text(item.uptime),
            f"{item.heartbeat_age:.0f}s ago",
            "live" if item.alive else "STALE",
        ]
        for item in found
    ]
    headers = ["id", "host", "pid", "version", "workers", "up", "heartbeat", "state"]
    print(table(headers, rows) if rows else "no coordinators registered")
    return EXIT_OK


def _coordinator_fields(item: RegisteredCoordinator) -> dict[str, Any]:
    """A registry row as ``coordinators --json`` prints it."""
    fields = dataclasses.asdict(item)
    alive = fields.pop("alive")
    return {**fields, "stale": not alive}
