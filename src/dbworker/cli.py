"""The ``dbworker`` command: run a coordinator and look after its work.

Every command names the application's coordinator as ``module:attribute``
(like uvicorn), e.g. ``dbworker run myapp.workers:coordinator``, or reads it from
the ``DBWORKER_APP`` environment variable. Exit statuses: 0 on success, 2 for bad
arguments, a bad reference or an unknown worker, 1 for any other error.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import make_url

from .coordinator import Coordinator
from .core.errors import ConfigurationError, DBWorkerError, UnknownWorkerError
from .logs import LEVELS, logger
from .logs import configure as configure_logging
from .metrics import prometheus_metrics
from .operations import Backlog, ItemRecord, RegisteredCoordinator
from .overview import STATUS_COLUMNS, duration_text, status_name
from .records_view import record_fields
from .worker import Worker

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

#: The environment variable naming the coordinator when the command line does not.
APP_ENV = "DBWORKER_APP"
#: The dashboard's access token when --token is not given.
DASHBOARD_TOKEN_ENV = "DBWORKER_DASHBOARD_TOKEN"
log = logger()


class UsageError(DBWorkerError):
    """The command line is wrong (exit status 2)."""


class AppImportError(DBWorkerError):
    """Importing the application's module raised (its own error, not a bad reference)."""

    def __init__(self, module: str) -> None:
        super().__init__(module)
        self.module = module


def load_coordinator(reference: str) -> Coordinator:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"expected module:attribute, got {reference!r}")
    sys.path.insert(0, ".")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module named by the reference is a bad reference; a module
        # that the application itself fails to import is the application's error.
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(f"cannot import {module_name!r}: {exc}") from None
        raise AppImportError(module_name) from exc
    except Exception as exc:
        raise AppImportError(module_name) from exc
    finally:
        sys.path.remove(".")
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{module_name} has no attribute {attribute!r}") from None
    if not isinstance(target, Coordinator):
        raise UsageError(f"{reference} is a {type(target).__name__}, not a dbworker Coordinator")
    return target


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _json(value: object) -> str:
    def default(item: object) -> object:
        return item.isoformat() if isinstance(item, datetime) else str(item)

    return json.dumps(value, default=default)


def _workers(coordinator: Coordinator, names: Sequence[str] | None) -> list[Worker]:
    """The named workers (all by default), refusing unknown names; their tables must
    exist (checked without creating an empty SQLite file on the way)."""
    return coordinator.operations.check_tables(names or None)


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
            log.warning(
                "%s: stopping after running handlers finish (again to stop at once)",
                signal.Signals(signum).name,
            )
        else:
            coordinator.stop(timeout=0, wait=False)
            log.warning(
                "%s again: killing running handlers and releasing their items",
                signal.Signals(signum).name,
            )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.metrics_port is not None:
        metrics = prometheus_metrics(coordinator)
        try:
            metrics.serve(args.metrics_port, args.metrics_host)
        except OSError as exc:
            raise DBWorkerError(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
            ) from None
        log.info("metrics at http://%s:%d/metrics", args.metrics_host, args.metrics_port)
    coordinator.start()
    while not coordinator.wait(timeout=0.5):
        pass
    coordinator.stop()
    health = coordinator.health()
    if health.crashed is not None:
        log.error("scheduler stopped by an error: %s", health.crashed)
        return EXIT_ERROR
    return EXIT_OK


def cmd_create_tables(coordinator: Coordinator, args: argparse.Namespace) -> int:
    coordinator.create_worker_tables()
    names = [worker.execution_table.name for worker in coordinator.workers.values()]
    if args.json:
        print(_json({"tables": names}))
    else:
        print("tables ready: " + ", ".join(names))
    return EXIT_OK


#: What ``status`` adds to the counts, per worker (``dbworker.backlog`` defines them).
_BACKLOG_FIELDS = ("waiting", "oldest_waiting_seconds", "running", "finished_last_minute")


def _status_report(coordinator: Coordinator, args: argparse.Namespace) -> dict[str, Any]:
    workers = _workers(coordinator, args.worker)
    figures = coordinator.operations.backlog([w.name for w in workers], live=args.live)
    return {name: _status_fields(item) for name, item in figures.items()}


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
    return _table(headers, rows) + "\n" + note


def cmd_status(coordinator: Coordinator, args: argparse.Namespace) -> int:
    if args.watch is None:
        report = _status_report(coordinator, args)
        print(_json(report) if args.json else _render_status(report))
        return EXIT_OK
    if args.watch <= 0:
        raise UsageError("--watch takes a positive number of seconds")
    try:
        while True:
            report = _status_report(coordinator, args)
            if args.json:
                print(_json(report), flush=True)
            else:
                # Clear the screen and home the cursor: the table refreshes in place.
                stamp = datetime.now().astimezone().strftime("%H:%M:%S")
                sys.stdout.write("\x1b[H\x1b[2J" + f"every {args.watch:g}s, {stamp}\n")
                sys.stdout.write(_render_status(report) + "\n")
                sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_show(coordinator: Coordinator, args: argparse.Namespace) -> int:
    _workers(coordinator, [args.worker])  # known, and its table exists
    operations = coordinator.operations
    try:
        source_id = operations.source_id(args.worker, args.id)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    found: ItemRecord | None = operations.record(args.worker, source_id)
    if found is None:
        print(f"dbworker: worker {args.worker} has no record of {source_id!r}", file=sys.stderr)
        return EXIT_ERROR
    record = record_fields(found)
    if args.json:
        print(_json(record))
        return EXIT_OK
    traceback_text = record.pop("traceback", None)
    width = max(len(key) for key in record)
    for key, value in record.items():
        print(f"{key.ljust(width)}  {'-' if value is None else value}")
    if traceback_text:
        print("\ntraceback:\n" + traceback_text.rstrip())
    return EXIT_OK


def cmd_coordinators(coordinator: Coordinator, args: argparse.Namespace) -> int:
    found = coordinator.operations.coordinators()
    if args.json:
        print(_json([_coordinator_fields(item) for item in found]))
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
    print(_table(headers, rows) if rows else "no coordinators registered")
    return EXIT_OK


def _coordinator_fields(item: RegisteredCoordinator) -> dict[str, Any]:
    """A registry row as ``coordinators --json`` prints it."""
    fields = dataclasses.asdict(item)
    alive = fields.pop("alive")
    return {**fields, "stale": not alive}


def cmd_failed(coordinator: Coordinator, args: argparse.Namespace) -> int:
    items: list[dict[str, Any]] = []
    workers = _workers(coordinator, args.worker)
    for worker in workers:
        for failed in coordinator.operations.failed_items(worker.name, args.limit):
            fields = dataclasses.asdict(failed)
            del fields["traceback"]  # not read: the list shows one line of each error
            items.append({"worker": worker.name, **fields})
    if args.json:
        print(_json(items))
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
    _workers(coordinator, [args.worker])
    if not args.all and not args.ids:
        raise UsageError("name the ids to retry, or --all")
    operations = coordinator.operations
    ids: list[Any] | None = None
    if not args.all:
        try:
            ids = [operations.source_id(args.worker, text) for text in args.ids]
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
    reset = operations.retry_failed(args.worker, ids)
    skipped = [source_id for source_id in ids or () if source_id not in reset]
    if args.json:
        print(_json({"reset": reset, "not_failed": skipped}))
    else:
        print(f"reset {len(reset)} failed item(s) of {args.worker}")
        if skipped:
            print("not failed (left alone): " + ", ".join(map(str, skipped)))
    return EXIT_OK


def cmd_dashboard(coordinator: Coordinator, args: argparse.Namespace) -> int:
    from .dashboard import check_binding, serve

    token = args.token or os.environ.get(DASHBOARD_TOKEN_ENV) or None
    try:
        check_binding(args.host, token)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    _workers(coordinator, None)  # the tables exist: say so now, not on the first page
    where = f"http://{args.host}:{args.port}/" + ("?token=..." if token else "")
    log.info("dashboard at %s%s", where, " (read-only)" if args.read_only else "")
    serve(coordinator, host=args.host, port=args.port, token=token, read_only=args.read_only)
    return EXIT_OK


# -- parsing -------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version("dbworker")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, uninstalled
        return "unknown"


DESCRIPTION = """\
Run a dbworker coordinator and look after its work.

Every command names the application's Coordinator as module:attribute (like
uvicorn), e.g. "dbworker run myapp.workers:coordinator", or reads it from the
DBWORKER_APP environment variable. The current directory is importable."""

EPILOG = f"""\
exit status:
  {EXIT_OK}  success
  {EXIT_USAGE}  bad arguments, a bad module:attribute reference or an unknown worker
  {EXIT_ERROR}  any other error: the database is unreachable, the worker tables do not
     exist, or the scheduler stopped on an error during run"""


def parser() -> argparse.ArgumentParser:
    # --json and --log-level are accepted before and after the command: the
    # subcommands' copies default to SUPPRESS so that leaving them out there keeps
    # what was given before the command.
    def options(target: argparse.ArgumentParser, defaults: bool) -> None:
        target.add_argument(
            "--json",
            action="store_true",
            default=False if defaults else argparse.SUPPRESS,
            help="machine-readable output (for run: JSON log lines)",
        )
        target.add_argument(
            "--log-level",
            type=str.upper,
            choices=LEVELS,
            default="INFO" if defaults else argparse.SUPPRESS,
            metavar="LEVEL",
            help=f"dbworker's log level: {', '.join(LEVELS)} (default INFO)",
        )

    top = argparse.ArgumentParser(
        prog="dbworker",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options(top, defaults=True)
    top.add_argument("--version", action="version", version=f"dbworker {_version()}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument(
            "coordinator",
            nargs="?",
            metavar="APP",
            help=f"the application's Coordinator as module:attribute (default: ${APP_ENV})",
        )
        options(sub, defaults=False)
        return sub

    run = command(
        "run", "start the coordinator; SIGTERM or SIGINT stops it gracefully, a second one at once"
    )
    run.add_argument("--create-tables", action="store_true", help="create worker tables first")
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus metrics on port N (needs the dbworker[prometheus] extra)",
    )
    run.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the metrics are served on (default 127.0.0.1; 0.0.0.0 for all)",
    )
    run.set_defaults(handler=cmd_run)
    command("create-tables", "create the worker tables (idempotent)").set_defaults(
        handler=cmd_create_tables
    )
    status = command(
        "status",
        "count items per worker and status, the work waiting (eligible now and not claimed, "
        "discovered or not), its oldest item's age and the items finished in the last minute",
    )
    status.add_argument("--worker", action="append", help="only this worker (repeatable)")
    status.add_argument(
        "--live",
        action="store_true",
        help="count now rather than show a running coordinator's recent count",
    )
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh in place every SECONDS (default 2) until interrupted",
    )
    status.set_defaults(handler=cmd_status)
    show = command("show", "print one item's execution record with its full traceback")
    show.add_argument("worker", help="the worker")
    show.add_argument("id", nargs="?", help="the source row's id")
    show.set_defaults(handler=cmd_show)
    command(
        "coordinators", "list running coordinators (stale: no heartbeat for a while)"
    ).set_defaults(handler=cmd_coordinators)
    failed = command("failed", "list failed items with their errors")
    failed.add_argument("--worker", action="append", help="only this worker (repeatable)")
    failed.add_argument("--limit", type=int, default=None, help="at most this many per worker")
    failed.set_defaults(handler=cmd_failed)
    dashboard = command(
        "dashboard", "serve the web dashboard (needs the dbworker[dashboard] extra)"
    )
    dashboard.add_argument("--port", type=int, default=8000, help="the port (default 8000)")
    dashboard.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address (default 127.0.0.1; any other needs an access token)",
    )
    dashboard.add_argument(
        "--token", help=f"the access token (default ${DASHBOARD_TOKEN_ENV}); open ?token=..."
    )
    dashboard.add_argument(
        "--read-only", action="store_true", help="show only: no retry buttons, POSTs refused"
    )
    dashboard.set_defaults(handler=cmd_dashboard)
    retry = command("retry", "reset failed items so they run again")
    retry.add_argument("worker", help="the worker whose items to reset")
    retry.add_argument("ids", nargs="*", help="source ids to reset")
    retry.add_argument("--all", action="store_true", help="reset every failed item of the worker")
    retry.set_defaults(handler=cmd_retry)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser()
    args = arguments.parse_args(argv)
    if args.handler is cmd_show and args.id is None:
        # `dbworker show WORKER ID` with the application in $DBWORKER_APP: the first
        # positional was taken for APP.
        args.coordinator, args.worker, args.id = None, args.coordinator, args.worker
    reference = args.coordinator or os.environ.get(APP_ENV)
    if not reference:
        arguments.error(f"name the application's Coordinator (module:attribute) or set {APP_ENV}")
    # Configured before the application is imported, so that its import is logged too.
    configure_logging(args.log_level, json_lines=args.json, stream=sys.stderr)
    try:
        coordinator = load_coordinator(reference)
        log.debug(
            "loaded %s: workers %s, database %s",
            reference,
            ", ".join(coordinator.workers) or "none",
            make_url(coordinator.database_url).render_as_string(hide_password=True),
        )
        code: int = args.handler(coordinator, args)
    except (UsageError, UnknownWorkerError) as exc:
        print(f"dbworker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AppImportError as exc:
        # The application's own code failed: its traceback is what the user needs.
        print(f"dbworker: importing {exc.module} failed:", file=sys.stderr)
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # e.g. the database is unreachable: say so, no traceback wall
        log.debug("command failed", exc_info=exc)
        text = str(exc) if isinstance(exc, DBWorkerError) else f"{type(exc).__name__}: {exc}"
        print(f"dbworker: {text}", file=sys.stderr)
        return EXIT_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
