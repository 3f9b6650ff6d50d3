"""dbworker's logger: the item attributes its records carry, and the command line's formats.

Every record of the ``dbworker`` logger carries ``worker``, ``source_id`` and
``attempt`` (``None`` on records about no item, such as a handler process that
could not start), so a format such as ``"%(worker)s %(source_id)s %(message)s"``
never fails on one of them, and log pipelines can filter on the attributes. The
messages do not repeat them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from .events import Event, EventKind

LOGGER_NAME = "dbworker"
ITEM_ATTRIBUTES = ("worker", "source_id", "attempt")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ItemAttributes(logging.Filter):
    """Gives every record the item attributes, ``None`` where the caller named no item."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in ITEM_ATTRIBUTES:
            record.__dict__.setdefault(name, None)
        return True


def logger() -> logging.Logger:
    """The ``dbworker`` logger, with ``ItemAttributes`` installed (once per process)."""
    log = logging.getLogger(LOGGER_NAME)
    # A logger's filters see only the records logged on it, not those of child
    # loggers: every dbworker module logs on this one logger for that reason.
    if not any(isinstance(f, ItemAttributes) for f in log.filters):
        log.addFilter(ItemAttributes())
    return log


def logs(kind: EventKind) -> bool:
    """Whether ``log_event`` would log anything of an event of ``kind`` now."""
    level = _MOST.get(kind)
    return level is not None and _LOG.isEnabledFor(level)


def log_event(event: Event) -> None:
    """Log what the scheduler reports of an item: the listener of the events that
    writes dbworker's log records about items' endings (``scheduling.endings``)."""
    # Every item passes here: nothing is formatted unless its level is logged.
    level = _MOST.get(event.kind)
    if level is None or not _LOG.isEnabledFor(level):
        return
    said, message = _SAYINGS[event.kind](event)
    if said < level and not _LOG.isEnabledFor(said):
        return
    level = said
    attempt = "?" if event.attempt is None else event.attempt
    extra = {"worker": event.worker, "source_id": event.source_id, "attempt": attempt}
    _LOG.log(level, "item %s", message, extra=extra)


def _ran(event: Event) -> tuple[int, str]:
    return logging.INFO, f"{event.kind.value} in {event.duration or 0.0:.3f}s"


def _lost(event: Event) -> tuple[int, str]:
    # A result reports a run that went to its end; a renewal, one still running.
    if event.duration is not None:
        return logging.WARNING, "lost its claim; its writes were rolled back"
    return logging.WARNING, "lost its claim; handler stopped"


def _released(event: Event) -> tuple[int, str]:
    if event.duration is not None:
        return logging.WARNING, "stopped by coordinator shutdown; released"
    return logging.DEBUG, "given back by coordinator shutdown before it started"


_LOG = logging.getLogger(LOGGER_NAME)


def _cancelled(event: Event) -> tuple[int, str]:
    # The canceller's coordinator reports items no one ran (no attempt); a holder, the
    # run it stopped, or one that went to its end and whose finish the cancel beat.
    if event.attempt is None:
        return logging.INFO, "cancelled"
    if event.duration is not None:
        return logging.WARNING, "cancelled; its writes were rolled back"
    return logging.WARNING, "cancelled; handler stopped"


_SAYINGS: dict[EventKind, Callable[[Event], tuple[int, str]]] = {
    EventKind.FINISHED: _ran,
    EventKind.UNFINISHED: _ran,
    EventKind.FAILED: lambda e: (logging.WARNING, f"failed: {e.error}"),
    EventKind.RETRIED: lambda e: (logging.WARNING, f"retrying: {e.error}"),
    EventKind.CRASHED: lambda e: (logging.ERROR, f"crashed: {e.error}"),
    EventKind.TIMED_OUT: lambda e: (logging.WARNING, f"timed out: {e.error}"),
    EventKind.LOST: _lost,
    EventKind.RELEASED: _released,
    EventKind.CANCELLED: _cancelled,
}
#: The highest level each kind is logged at (a check before any formatting).
_MOST = {
    EventKind.FINISHED: logging.INFO,
    EventKind.UNFINISHED: logging.INFO,
    EventKind.FAILED: logging.WARNING,
    EventKind.RETRIED: logging.WARNING,
    EventKind.CRASHED: logging.ERROR,
    EventKind.TIMED_OUT: logging.WARNING,
    EventKind.LOST: logging.WARNING,
    EventKind.RELEASED: logging.WARNING,
    EventKind.CANCELLED: logging.WARNING,
}


def timestamp(record: logging.LogRecord) -> str:
    """The record's time in ISO 8601, UTC, to the millisecond."""
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER [worker source_id #attempt]: message``, the bracket only for
    records about an item; also for other libraries' records, which lack the attributes."""

    def format(self, record: logging.LogRecord) -> str:
        worker = record.__dict__.get("worker")
        item = ""
        if worker is not None:
            item = f" [{worker} {record.__dict__.get('source_id')!r}"
            attempt = record.__dict__.get("attempt")
            item += f" #{attempt}]" if attempt is not None else "]"
        line = f"{timestamp(record)} {record.levelname} {record.name}{item}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601), level, logger, message, the item
    attributes, and the formatted exception if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ITEM_ATTRIBUTES:
            entry[name] = record.__dict__.get(name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, *, json_lines: bool, stream: TextIO) -> None:
    """The command line's logging: dbworker's records from ``level`` up, other
    libraries' from WARNING up (their DEBUG records, SQLAlchemy's statements among
    them, would drown dbworker's), all on ``stream``."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(max(logging.WARNING, logging.getLevelName(level)))
    logger().setLevel(level)
