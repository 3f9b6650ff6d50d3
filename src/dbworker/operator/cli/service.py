"""The commands that run something: ``run`` (the worker service, with its metrics),
``create-tables`` and ``dashboard``."""

from __future__ import annotations

import argparse
import os
import signal

from ...coordinator import Coordinator
from ...core.errors import ConfigurationError, DBWorkerError
from ...logs import logger
from ..metrics import prometheus_metrics
from .loading import EXIT_ERROR, EXIT_OK, UsageError
from .output import as_json

#: The dashboard's access token when --token is not given.
DASHBOARD_TOKEN_ENV = "DBWORKER_DASHBOARD_TOKEN"

log = logger()


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
        print(as_json({"tables": names}))
    else:
        print("tables ready: " + ", ".join(names))
    return EXIT_OK


def cmd_dashboard(coordinator: Coordinator, args: argparse.Namespace) -> int:
    from ..dashboard import check_binding, serve

    token = args.token or os.environ.get(DASHBOARD_TOKEN_ENV) or None
    try:
        check_binding(args.host, token)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    # The tables exist: say so now, not on the first page.
    coordinator.operations.check_tables()
    where = f"http://{args.host}:{args.port}/" + ("?token=..." if token else "")
    log.info("dashboard at %s%s", where, " (read-only)" if args.read_only else "")
    serve(coordinator, host=args.host, port=args.port, token=token, read_only=args.read_only)
    return EXIT_OK
