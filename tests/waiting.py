"""Waiting for something that happens in other processes, for every test suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Generous: a deadline only bounds how long a failing test takes to say so.
DEADLINE = 60.0


def wait_until(
    predicate: Callable[[], T],
    what: str,
    timeout: float = DEADLINE,
    interval: float = 0.05,
    diagnose: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` if never.

    ``diagnose`` adds what it returns to the failure message (e.g. the records' states).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{diagnose()}" if diagnose is not None else ""
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last seen: {value!r}{detail}"
            )
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """Running or stopped; a zombie has already died."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :].split()[0] not in ("Z", "X")
