"""Starting handler processes without multiprocessing's helper processes.

The threads and asyncio executors run one process (or a few) for the whole worker, so
the fork server's point (cheap, preloaded starts, many of them) is lost on them while
its cost stays: the fork server and multiprocessing's resource tracker are two more
processes in the tree (about 45 MiB of PSS between them in benchmarks.io, beside a
handler process of about 40). So the process is the coordinator's own child, started
one of two ways (the process pool forks its first processes the same way, with
``children.forked``, and starts later ones from the fork server):

* Forked from the coordinator (``fork``), when the coordinator's process runs a
  single thread: at ``start()``, before the scheduler's thread and the heartbeat's
  exist. Forking a process with other threads is what dbworker never does (a lock
  one of them held stays held in the child for good); with one thread there is no
  such lock. The child shares the coordinator's memory until either writes to it
  (``gc.freeze()`` around the fork keeps the child's collector from writing to every
  inherited object): in benchmarks.io the tree's PSS went from about 97 MiB with a
  new interpreter to about 77. The child never uses what it inherited (the
  application's pools among it: psycopg closes no connection that another process
  opened, and the child ends with ``os._exit``, running no finalizers); it gets the
  runner as a copy (its configuration, as the other start methods pass it), and
  the application's Python signal handlers are reset to the defaults a new
  interpreter has (``multiplexed_child``).
* Otherwise (a replacement, started while the scheduler runs; an application with
  threads of its own) as a new interpreter (``launch``), a plain ``python -c`` child
  started as multiprocessing's spawn starts one: it receives multiprocessing's own
  preparation data (``spawn.get_preparation_data``: ``sys.path``, the working
  directory, the main module) and applies it (``spawn.prepare``), so the main module
  is imported again as ``__mp_main__`` and a handler defined in it unpickles exactly
  as under spawn; then the target and its arguments; then it runs the target with
  its end of a socket pair.

Neither uses a named semaphore or shared memory, so neither needs the resource tracker
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

from .children import ProcessHandle, forked
from .subprocess import PopenHandle

_ENTRY = "from dbworker.executors.interpreter import main; main()"


def start_handler(
    target: Callable[..., None], name: str, runner: Any, *args: Any
) -> tuple[ProcessHandle, Connection]:
    """Start ``target(its end of a new pipe, runner, *args)`` in a child process of
    this one, forked if that is safe, else a new interpreter; return the process and
    our end of the pipe."""
    started = forked(target, name, runner, *args)
    return started if started is not None else launch(target, name, runner, *args)


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
    data = spawn.get_preparation_data(name)
    # As spawn passes it (an AuthenticationString refuses plain pickling): the key the
    # process's own multiprocessing objects authenticate with, the coordinator's.
    data["authkey"] = bytes(data["authkey"])
    # A child that already exited (a broken interpreter or environment) cannot take
    # them; the pool sees it die before it is ready and says so.
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
