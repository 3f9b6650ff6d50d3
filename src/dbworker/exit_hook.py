"""Coordinators a process leaves running are stopped when its main thread ends.

A coordinator's scheduling thread is not a daemon, so once the main thread ends the
interpreter waits for it before it runs ``atexit`` hooks: a coordinator nobody stopped
would keep the process alive for ever, and an ``atexit`` hook of its own would never
run. ``threading``'s exit hooks run before that wait (``concurrent.futures`` stops its
workers with them); each coordinator still running is stopped there without waiting,
its running handlers killed and their rows released. Where that hook is missing,
``atexit`` serves, for an interpreter that reaches it.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Protocol


class Stoppable(Protocol):
    def stop(self, timeout: float | None = None, *, wait: bool = True) -> None: ...


_running: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False


def stop_at_exit(coordinator: Stoppable) -> None:
    """Stop ``coordinator`` when the main thread ends, unless ``forget`` comes first."""
    global _hooked
    with _lock:
        _running.add(coordinator)
        if _hooked:
            return
        _hooked = True
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hooks")
        register(_stop_running)
    except RuntimeError:  # the interpreter is shutting down already
        atexit.register(_stop_running)


def forget(coordinator: Stoppable) -> None:
    with _lock:
        _running.discard(coordinator)


def _stop_running() -> None:
    with _lock:
        running = list(_running)
    for coordinator in running:
        coordinator.stop(timeout=0)
