"""``dbworker cancel APP WORKER ID``: cancel one item (``Operations.cancel``)."""

from __future__ import annotations

import argparse

from ...coordinator import Coordinator
from ...core.errors import ConfigurationError
from .loading import EXIT_OK, UsageError
from .output import as_json


def cmd_cancel(coordinator: Coordinator, args: argparse.Namespace) -> int:
    operations = coordinator.operations
    operations.check_tables([args.worker])
    try:
        source_id = operations.source_id(args.worker, args.id)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    cancelled = operations.cancel(args.worker, source_id)
    if args.json:
        print(as_json({"worker": args.worker, "source_id": source_id, "cancelled": cancelled}))
    elif cancelled:
        print(f"cancelled item {source_id} of {args.worker}")
    else:
        # Like retry's items that were not failed: nothing to do is not an error.
        print(f"not open (finished or failed; left alone): {source_id}")
    return EXIT_OK
