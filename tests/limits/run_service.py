"""A coordinator service of the limits tests in its own process:

python -m limits.run_service URL --lease 2 --concurrency 3 [--periodic]

(``--periodic``: the periodic workers of ``periodic_app`` instead of ``app``'s.)
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator
from serving import serve_until_sigterm

from . import app, periodic_app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--periodic", action="store_true")
    args = parser.parse_args(argv)
    engine = create_engine(args.url)
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=args.url,
        lease_seconds=args.lease,
        poll_seconds=0.05,
        max_poll_seconds=0.2,
    )
    (periodic_app if args.periodic else app).register(coordinator, args.concurrency)
    return serve_until_sigterm(coordinator, engine)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
