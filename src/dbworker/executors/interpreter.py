"""Starting a handler process as a new interpreter, without multiprocessing's helpers.

The threads and asyncio executors run one process (or a few) for the whole worker, so
the fork server's point (cheap, preloaded starts, many of them) is lost on them, while
its cost stays: multiprocessing's fork server and resource tracker are two more
processes in the tree (about 45 MiB of PSS between them, beside a handler process of
about 40). Here the process is a plain ``python -c`` child of the coordinator, started
like multiprocessing's spawn in what it gets:

1. It receives multiprocessing's own preparation data (``spawn.get_preparation_data``:
   ``sys.path``, the working directory, the main module) and applies it
   (``spawn.prepare``), so the main module is imported again as ``__mp_main__`` and a
   handler defined in it unpickles, exactly as under spawn.
2. It then receives the target and its arguments (the runner), and runs
   ``target(connection, *args)`` with its end of a socket pair as the connection.

It never uses a named semaphore or shared memory, so it needs no resource tracker
(a handler that does gets its own, started by multiprocessing on first use).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Callable
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Any

from .subprocess import PopenHandle

_ENTRY = "from dbworker.executors.interpreter import main; main()"


def launch(target: Callable[..., None], name: str, *args: Any) -> tuple[PopenHandle, Connection]:
    """Start ``target(its end of a new socket pair, *args)`` in a new interpreter that
    imports the main module as spawn does; return the process and our end."""
    ours, theirs = socket.socketpair()
    try:
        popen = subprocess.Popen(
            [spawn.get_executable(), "-c", _ENTRY, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    # A child that already exited (a broken interpreter or environment) cannot take
    # them; the pool sees it die before it is ready and says so.
    data = spawn.get_preparation_data(name)
    # As spawn passes it (an AuthenticationString refuses plain pickling): the key the
    # process's own multiprocessing objects authenticate with, the coordinator's.
    data["authkey"] = bytes(data["authkey"])
    with contextlib.suppress(OSError):
        conn.send(data)
        conn.send((target, args))
    return PopenHandle(popen), conn


def main() -> None:
    """The child's side of ``launch``."""
    conn = Connection(int(sys.argv[1]))
    spawn.prepare(conn.recv())  # sys.path, the working directory, the main module
    target, args = conn.recv()
    target(conn, *args)
