"""Files through which handlers (in their own processes) and tests talk.

A handler announces each run by creating the next numbered file, and may wait for a
gate file the test creates. Files, not the database: they must tell what happened
even when the handler's transaction never commits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

#: A gated run gives up after this long, so a failing test cannot leave it blocked.
GATE_TIMEOUT_SECONDS = 300.0


def write_atomically(path: Path, text: str = "") -> None:
    """Write then rename, so a reader never sees a half-written file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def number_run(path_of: Callable[[int], Path], text: str) -> int:
    """Create the first ``path_of(run)`` (run 1, 2, ...) not taken yet; return its run.

    O_EXCL numbers runs atomically even if two processes run the same item at once.
    """
    run = 1
    while True:
        path = path_of(run)
        try:
            fd = os.open(path.with_name(path.name + ".lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            run += 1
            continue
        os.close(fd)
        write_atomically(path, text)
        return run


def wait_for_any(*paths: Path, timeout: float = GATE_TIMEOUT_SECONDS) -> None:
    """Return once one of ``paths`` exists; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not any(path.exists() for path in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never opened {paths[0]}")
        time.sleep(0.02)
