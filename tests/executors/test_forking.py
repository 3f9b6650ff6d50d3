"""A process is forked only while it runs a single thread, also after its runner was
prepared for the fork (``children.forked(prepared=True)``): preparing it may start a
thread (a driver's), and a lock that thread holds would stay held in the child.

Run in a fresh interpreter: the test process has threads of its own (pytest-xdist's).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    from dbworker.executors.children import forked

    stop = threading.Event()

    class Runner:
        def for_fork(self):
            if sys.argv[1] == "thread":
                threading.Thread(target=stop.wait, daemon=True).start()
            return self

    def target(conn, runner):
        os._exit(0)

    started = forked(target, "probe", Runner(), prepared=True)
    if started is not None:
        started[0].join()
    print("forked" if started is not None else "not forked")
    """
)


def _fork_with(preparation: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, preparation],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_runner_whose_preparation_started_a_thread_is_not_forked() -> None:
    assert _fork_with("quiet") == "forked"
    assert _fork_with("thread") == "not forked"
