"""A coordinator in its own process, for tests that SIGKILL or SIGSTOP a whole coordinator.

    python -m <package>.run_coordinator URL --lease 2 --concurrency 3

Runs the crash worker until SIGTERM (clean stop) or until killed. Logs go to stderr,
which the tests read to see what the coordinator concluded (e.g. a lost claim).
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator
from dbworker.logs import configure as configure_logging
from dbworker.registry import Timing
from serving import serve_until_sigterm

from . import app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--max-poll", type=float, default=0.2)
    parser.add_argument("--executor", default="pool")
    parser.add_argument("--heartbeat", type=float, default=None, help="registry heartbeat (s)")
    parser.add_argument("--listen-url", default=None, help="where LISTEN goes, past a pooler")
    args = parser.parse_args(argv)
    # As the dbworker command logs: the item (worker, source_id, attempt) in brackets.
    configure_logging("INFO", json_lines=False, stream=sys.stderr)

    engine = create_engine(args.url)
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=args.url,
        lease_seconds=args.lease,
        poll_seconds=args.poll,
        max_poll_seconds=args.max_poll,
        executor=args.executor,
        listen_url=args.listen_url,
    )
    app.register(coordinator, args.concurrency)
    if args.heartbeat is not None:
        coordinator._registry_timing = Timing(heartbeat=args.heartbeat)
    return serve_until_sigterm(coordinator, engine)


# The guard matters beyond style: forkserver imports the main module of the process
# that starts it, and must not start another coordinator when it does.
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
