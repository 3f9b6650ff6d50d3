"""The ``dbworker`` command: run a coordinator and look after its work.

Every command names the application's coordinator as ``module:attribute``
(like uvicorn), e.g. ``dbworker run myapp.workers:coordinator``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .coordinator import Coordinator
from .core.errors import DBWorkerError
from .core.status import ExecutionStatus

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

_STATUS_COLUMNS: list[ExecutionStatus | None] = [None, *ExecutionStatus]


def load_coordinator(reference: str) -> Coordinator:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise DBWorkerError(f"expected module:attribute, got {reference!r}")
    sys.path.insert(0, ".")
    try:
        target: Any = importlib.import_module(module_name)
    finally:
        sys.path.remove(".")
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise DBWorkerError(f"{module_name} has no attribute {attribute!r}") from None
    if not isinstance(target, Coordinator):
        raise DBWorkerError(f"{reference} is a {type(target).__name__}, not a dbworker Coordinator")
    return target


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _workers(coordinator: Coordinator, names: Sequence[str] | None) -> list[str]:
    return list(names) if names else list(coordinator.workers)


# -- commands ----------------------------------------------------------------------


def cmd_run(coordinator: Coordinator, args: argparse.Namespace) -> int:
    if args.create_tables:
        coordinator.create_worker_tables()
    signals = {"count": 0}

    def on_signal(signum: int, _frame: object) -> None:
        signals["count"] += 1
        # Ask first, log after: once the line is printed, nothing new is claimed.
        if signals["count"] == 1:
            coordinator.stop(wait=False)
            logging.getLogger("dbworker").warning(
                "%s: stopping after running handlers finish (again to stop at once)",
                signal.Signals(signum).name,
            )
        else:
            coordinator.stop(timeout=0, wait=False)
            logging.getLogger("dbworker").warning(
                "%s again: killing running handlers and releasing their items",
                signal.Signals(signum).name,
            )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    coordinator.start()
    while not coordinator.wait(timeout=0.5):
        pass
    coordinator.stop()
    health = coordinator.health()
    if health.crashed is not None:
        print(f"dbworker: scheduler stopped by an error: {health.crashed}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_create_tables(coordinator: Coordinator, args: argparse.Namespace) -> int:
    coordinator.create_worker_tables()
    names = [worker.execution_table.name for worker in coordinator.workers.values()]
    if args.json:
        print(json.dumps({"tables": names}))
    else:
        print("tables ready: " + ", ".join(names))
    return EXIT_OK


def cmd_status(coordinator: Coordinator, args: argparse.Namespace) -> int:
    report: dict[str, dict[str, int]] = {}
    with coordinator.session_factory() as session:
        for name in _workers(coordinator, args.worker):
            worker = coordinator.workers.get(name)
            if worker is None:
                raise DBWorkerError(f"no worker named {name!r}")
            counts = worker.counts(session)
            report[name] = {_label(s): counts.get(s, 0) for s in _STATUS_COLUMNS}
    if args.json:
        print(json.dumps(report))
    else:
        headers = ["worker", *(_label(s) for s in _STATUS_COLUMNS)]
        rows = [[name, *counts.values()] for name, counts in report.items()]
        print(_table(headers, rows))
    return EXIT_OK


def _label(status: ExecutionStatus | None) -> str:
    return "pending" if status is None else status.value


def cmd_failed(coordinator: Coordinator, args: argparse.Namespace) -> int:
    items: list[dict[str, Any]] = []
    with coordinator.session_factory() as session:
        for name in _workers(coordinator, args.worker):
            worker = coordinator.workers.get(name)
            if worker is None:
                raise DBWorkerError(f"no worker named {name!r}")
            for item in worker.failed(session, args.limit):
                items.append({"worker": name, **item})
    if args.json:
        print(json.dumps(items, default=str))
    else:
        rows = [
            [i["worker"], i["source_id"], i["attempts"], i["crashes"], _one_line(i["error"])]
            for i in items
        ]
        print(_table(["worker", "source_id", "attempts", "crashes", "error"], rows))
    return EXIT_OK


def _one_line(text: str | None, width: int = 100) -> str:
    line = (text or "").splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def cmd_retry(coordinator: Coordinator, args: argparse.Namespace) -> int:
    worker = coordinator.workers.get(args.worker)
    if worker is None:
        raise DBWorkerError(f"no worker named {args.worker!r}")
    if not args.all and not args.ids:
        raise DBWorkerError("name the ids to retry, or --all")
    with coordinator.session_factory() as session:
        if args.all:
            ids = [item["source_id"] for item in worker.failed(session)]
        else:
            parse = coordinator._registration(args.worker).source_id_from_text
            ids = [parse(text) for text in args.ids]
        reset = [source_id for source_id in ids if worker.reset_failed(session, source_id)]
        session.commit()
    skipped = [source_id for source_id in ids if source_id not in reset]
    if args.json:
        print(json.dumps({"reset": reset, "not_failed": skipped}, default=str))
    else:
        print(f"reset {len(reset)} failed item(s) of {args.worker}")
        if skipped:
            print("not failed (left alone): " + ", ".join(map(str, skipped)))
    return EXIT_OK


# -- parsing -------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="dbworker", description=__doc__)
    top.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = top.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("coordinator", help="the application's Coordinator, as module:attribute")
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        return sub

    run = command("run", "start the coordinator; SIGTERM/SIGINT stop it gracefully, twice at once")
    run.add_argument("--create-tables", action="store_true", help="create worker tables first")
    run.set_defaults(handler=cmd_run)
    command("create-tables", "create the worker tables (idempotent)").set_defaults(
        handler=cmd_create_tables
    )
    status = command("status", "count items per worker and status")
    status.add_argument("--worker", action="append", help="only this worker (repeatable)")
    status.set_defaults(handler=cmd_status)
    failed = command("failed", "list failed items with their errors")
    failed.add_argument("--worker", action="append", help="only this worker (repeatable)")
    failed.add_argument("--limit", type=int, default=None, help="at most this many per worker")
    failed.set_defaults(handler=cmd_failed)
    retry = command("retry", "reset failed items so they run again")
    retry.add_argument("worker", help="the worker whose items to reset")
    retry.add_argument("ids", nargs="*", help="source ids to reset")
    retry.add_argument("--all", action="store_true", help="reset every failed item of the worker")
    retry.set_defaults(handler=cmd_retry)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        coordinator = load_coordinator(args.coordinator)
        code: int = args.handler(coordinator, args)
    except DBWorkerError as exc:
        print(f"dbworker: {exc}", file=sys.stderr)
        return EXIT_USAGE if args.command != "run" else EXIT_ERROR
    except Exception as exc:  # e.g. the database is unreachable: say so, no traceback wall
        logging.getLogger("dbworker").debug("command failed", exc_info=exc)
        print(f"dbworker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
