"""Coordinators a process leaves running are stopped when its main thread ends.

A coordinator's scheduling thread is not a daemon, so once the main thread ends the
interpreter waits for it before it runs ``atexit`` hooks: a coordinator nobody stopped
would keep the process alive for ever, and an ``atexit`` hook of its own would never
run. ``threading``'s exit hooks run before that wait (``concurrent.futures`` stops its
workers with them); each coordinator still running is stopped there without waiting,
its running handlers killed and their rows released. Where that hook is missing,
``atexit`` serves, for an interpreter that reaches it. A handler process forked from
the coordinator inherits the hook (multiprocessing runs threading's exit hooks as a
process ends): there it does nothing, or it would stop a copy of the coordinator and
close the coordinator's connections from the wrong process.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Protocol


class Stoppable(Protocol):
    def stop(self, timeout: float | None = None, *, wait: bool = True) -> None: ...


#: Each running coordinator and the process that started it.
_running: weakref.WeakKeyDictionary[Stoppable, int] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
#: The process that registered the hook (a forked process inherits it, and registers
#: its own should it start a coordinator).
_hooked_in: int | None = None


def stop_at_exit(coordinator: Stoppable) -> None:
    """Stop ``coordinator`` when the main thread ends, unless ``forget`` comes first."""
    global _hooked_in
    pid = os.getpid()
    with _lock:
        _running[coordinator] = pid
        if _hooked_in == pid:
            return
        _hooked_in = pid
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hooks")
        register(_stop_running)
    except RuntimeError:  # the interpreter is shutting down already
        atexit.register(_stop_running)


def forget(coordinator: Stoppable) -> None:
    with _lock:
        _running.pop(coordinator, None)


def _stop_running() -> None:
    pid = os.getpid()
    with _lock:
        running = [c for c, started_in in _running.items() if started_in == pid]
    for coordinator in running:
        coordinator.stop(timeout=0)
