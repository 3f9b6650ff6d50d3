"""Coordinator services in processes of their own, for the suites that run them
(``crash``, ``periodic``): the service's side and the test's side."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy import Engine

from dbworker import Coordinator


def serve_until_sigterm(coordinator: Coordinator, engine: Engine) -> int:
    """Run ``coordinator`` until SIGTERM, then stop it cleanly (in the service)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    coordinator.start()
    print("started", flush=True)
    stop.wait()
    coordinator.stop()
    engine.dispose()
    return 0


@contextlib.contextmanager
def process_in_session(command: Sequence[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` with this process's import path, its output in ``log_path``, in
    a new session, so that every process it starts (fork server, pool children) can
    be killed as a group: on exit, whatever is left of it is."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
