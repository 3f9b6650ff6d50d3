"""The command line: the commands, their options and their help."""

from __future__ import annotations

import argparse

from ...logs import LEVELS
from ...registry import version
from .cancel import cmd_cancel
from .items import cmd_failed, cmd_retry, cmd_show
from .loading import APP_ENV, EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .schedules import cmd_schedules
from .service import DASHBOARD_TOKEN_ENV, cmd_create_tables, cmd_dashboard, cmd_run
from .status import cmd_coordinators, cmd_status

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
    top.add_argument("--version", action="version", version=f"dbworker {version()}")
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
    command(
        "schedules", "list periodic workers' schedules: the last slot made, its status, the next"
    ).set_defaults(handler=cmd_schedules)
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
    cancel = command("cancel", "cancel an item: it does not run (again) until retried")
    cancel.add_argument("worker", help="the worker whose item to cancel")
    cancel.add_argument("id", help="the source id to cancel")
    cancel.set_defaults(handler=cmd_cancel)
    return top
