"""Entry point of a subprocess-executor child: ``python -m dbworker.executors.subprocess_child``."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

from .process import child_main
from .subprocess import FD_ENV


def main() -> None:
    conn = Connection(int(os.environ.pop(FD_ENV)))
    # Unpickling the runner imports what it needs to run handlers in this interpreter.
    runner, parent_pid = conn.recv()
    child_main(conn, runner, parent_pid)


if __name__ == "__main__":
    main()
