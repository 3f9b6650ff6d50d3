"""The worker service as a plain script: ``python -m imagededup_dbworker.worker``.

The same as ``dbworker run imagededup_dbworker.tasks:coordinator --create-tables``:
the first SIGTERM or Ctrl-C lets running handlers finish, a second one kills them
(their rows are released for the next start).
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

from imagededup_shared.models import create_tables

from .tasks import coordinator, engine


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    create_tables(engine)  # the application's and the execution tables (same MetaData)
    signals = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            # Only ask here: waiting inside a signal handler would block the main thread.
            coordinator.stop(wait=False)
        else:
            coordinator.stop(timeout=0, wait=False)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    coordinator.start()
    coordinator.wait()
    # Joins the processes and releases rows of handlers killed by a second signal.
    coordinator.stop()


if __name__ == "__main__":
    main()
