"""The scheduler's events: one place where it reports what happens to items.

Subscribe a listener (any callable taking an ``Event``) with
``coordinator.events.subscribe(listener)`` to feed metrics, OpenTelemetry or your own
logging; ``dbworker.prometheus_metrics`` is one such listener. Listeners run on the
scheduling thread, in the order they subscribed, so they must be quick (count, record,
hand off to a queue): a slow listener slows claiming. An exception in a listener is
logged once and otherwise ignored; it never stops the scheduler.

With no listener, reporting an event costs one attribute check.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from .core.event_kinds import EventKind

log = logging.getLogger("dbworker")


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    #: The worker's name (None for a database error outside any one worker).
    worker: str | None
    source_id: Any = None
    attempt: int | None = None
    #: How long the handler ran, in seconds (for the ends of invocations).
    duration: float | None = None
    #: From the claim to the handler's start, in seconds (the item's wait in this
    #: coordinator: a process to become free, its turn behind items claimed ahead).
    latency: float | None = None
    #: The error's message (failures, crashes, timeouts, database errors).
    error: str | None = None


Listener = Callable[[Event], Any]


class Events:
    """The listeners of one coordinator."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._broken: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def subscribe(self, listener: Listener) -> Listener:
        """Call ``listener(event)`` for every event from now on; returns it (a decorator)."""
        if not callable(listener):
            raise TypeError(f"a listener must be callable, got {listener!r}")
        # Copy on write: the scheduling thread iterates the list without a lock.
        self._listeners = [*self._listeners, listener]
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners = [item for item in self._listeners if item is not listener]

    def emit(self, event: Event) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                if id(listener) not in self._broken:
                    self._broken.add(id(listener))
                    log.exception("dbworker: event listener %r raised (ignored)", listener)


__all__ = ["Event", "EventKind", "Events", "Listener"]
