"""The ``dbworker`` command: run a coordinator and look after its work.

Every command names the application's coordinator as ``module:attribute``
(like uvicorn), e.g. ``dbworker run myapp.workers:coordinator``, or reads it from
the ``DBWORKER_APP`` environment variable. Exit statuses: 0 on success, 2 for bad
arguments, a bad reference or an unknown worker, 1 for any other error.

``main`` (the ``dbworker`` console script, and ``python -m dbworker``) parses the
command line (``parsing``), loads the application's coordinator (``loading``) and
runs one command: ``service`` (run, create-tables, dashboard), ``status``
(status, coordinators), ``items`` (show, failed, retry), ``cancel`` or ``schedules``,
which print through ``output``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from sqlalchemy.engine import make_url

from ...core.errors import DBWorkerError, UnknownWorkerError
from ...logs import configure as configure_logging
from ...logs import logger
from .items import cmd_show
from .loading import APP_ENV, EXIT_ERROR, EXIT_USAGE, AppImportError, UsageError, load_coordinator
from .parsing import parser

log = logger()


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


__all__ = ["main"]
