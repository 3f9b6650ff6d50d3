"""A coordinator service of the periodic worker in its own process, until SIGTERM.

python -m tests.periodic.run_service URL
"""

from __future__ import annotations

import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator
from dbworker.logs import configure as configure_logging
from serving import serve_until_sigterm

from . import app


def main(argv: list[str]) -> int:
    url = argv[0]
    configure_logging("INFO", json_lines=False, stream=sys.stderr)
    engine = create_engine(url)
    coordinator = Coordinator(
        sessionmaker(engine), database_url=url, poll_seconds=0.05, max_poll_seconds=0.2
    )
    app.register(coordinator)
    return serve_until_sigterm(coordinator, engine)


# forkserver imports the main module of the process that starts it: no second start.
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
