"""A coordinator in its own process, for tests that SIGKILL or SIGSTOP a whole coordinator.

    python -m <package>.run_coordinator URL --lease 2 --concurrency 3

Runs the crash worker until SIGTERM (clean stop) or until killed. Logs go to stderr,
which the tests read to see what the coordinator concluded (e.g. a lost claim).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator

from . import app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--max-poll", type=float, default=0.2)
    parser.add_argument("--executor", default="pool")
    args = parser.parse_args(argv)
    # dbworker's records carry the item as attributes, which this format prints.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(process)d %(levelname)s worker=%(worker)s source_id=%(source_id)r "
            "attempt=%(attempt)s %(message)s"
        )
    )
    dbworker_log = logging.getLogger("dbworker")
    dbworker_log.addHandler(handler)
    dbworker_log.setLevel(logging.INFO)
    dbworker_log.propagate = False

    engine = create_engine(args.url)
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=args.url,
        lease_seconds=args.lease,
        poll_seconds=args.poll,
        max_poll_seconds=args.max_poll,
        executor=args.executor,
    )
    app.register(coordinator, args.concurrency)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    coordinator.start()
    print("started", flush=True)
    stop.wait()
    coordinator.stop()
    engine.dispose()
    return 0


# The guard matters beyond style: forkserver imports the main module of the process
# that starts it, and must not start another coordinator when it does.
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
