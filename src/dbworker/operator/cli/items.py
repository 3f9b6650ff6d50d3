"""The commands about items: ``show`` (one record with its traceback), ``failed``
(the failed items with their errors) and ``retry`` (reset failed items)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ...coordinator import Coordinator
from ...core.errors import ConfigurationError
from ..display import record_fields
from .loading import EXIT_ERROR, EXIT_OK, UsageError
from .output import as_json, one_line, table


def cmd_show(coordinator: Coordinator, args: argparse.Namespace) -> int:
    operations = coordinator.operations
    operations.check_tables([args.worker])  # known, and its table exists
    try:
        source_id = operations.source_id(args.worker, args.id)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    found = operations.record(args.worker, source_id)
    if found is None:
        print(f"dbworker: worker {args.worker} has no record of {source_id!r}", file=sys.stderr)
        return EXIT_ERROR
    record = record_fields(found)
    if args.json:
        print(as_json(record))
        return EXIT_OK
    traceback_text = record.pop("traceback", None)
    width = max(len(key) for key in record)
    for key, value in record.items():
        print(f"{key.ljust(width)}  {'-' if value is None else value}")
    if traceback_text:
        print("\ntraceback:\n" + traceback_text.rstrip())
    return EXIT_OK


def cmd_failed(coordinator: Coordinator, args: argparse.Namespace) -> int:
    operations = coordinator.operations
    items: list[dict[str, Any]] = []
    for worker in operations.check_tables(args.worker):
        for failed in operations.failed_items(worker.name, args.limit):
            fields = dataclasses.asdict(failed)
            del fields["traceback"]  # not read: the list shows one line of each error
            items.append({"worker": worker.name, **fields})
    if args.json:
        print(as_json(items))
    else:
        rows = [
            [i["worker"], i["source_id"], i["attempts"], i["crashes"], one_line(i["error"])]
            for i in items
        ]
        print(table(["worker", "source_id", "attempts", "crashes", "error"], rows))
    return EXIT_OK


def cmd_retry(coordinator: Coordinator, args: argparse.Namespace) -> int:
    operations = coordinator.operations
    operations.check_tables([args.worker])
    if not args.all and not args.ids:
        raise UsageError("name the ids to retry, or --all")
    ids: list[Any] | None = None
    if not args.all:
        try:
            ids = [operations.source_id(args.worker, text) for text in args.ids]
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
    reset = operations.retry_failed(args.worker, ids)
    skipped = [source_id for source_id in ids or () if source_id not in reset]
    if args.json:
        print(as_json({"reset": reset, "not_failed": skipped}))
    else:
        print(f"reset {len(reset)} failed item(s) of {args.worker}")
        if skipped:
            print("not failed (left alone): " + ", ".join(map(str, skipped)))
    return EXIT_OK
