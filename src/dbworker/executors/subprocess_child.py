"""Entry point of a subprocess-executor child: ``python -m dbworker.executors.subprocess_child``."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

from .pool import child_main
from .subprocess import FD_ENV


def main() -> None:
    conn = Connection(int(os.environ.pop(FD_ENV)))
    child_main(conn, conn.recv())


if __name__ == "__main__":
    main()
