"""Wake-ups that say an item was cancelled: the coordinator holding it checks its
held items of that worker at once, instead of at its next periodic check.

They travel the worker's usual ways (a NOTIFY on its channel with ``CANCEL_PAYLOAD``,
a same-host datagram naming ``cancel_name(worker)``) and reach the scheduler as a
name that no worker can have (worker names are lowercase identifiers), so the
listener, the socket and their threads stay as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The payload of a cancel's NOTIFY (an announcement's payload is a coordinator's id).
CANCEL_PAYLOAD = "cancel"
_PREFIX = "cancel:"


def cancel_name(worker: str) -> str:
    """How a wake-up names ``worker`` when one of its items was cancelled."""
    return f"{_PREFIX}{worker}"


def cancelled_workers(names: Iterable[str | None]) -> set[str]:
    """The workers whose items a set of woken names says were cancelled."""
    return {name.removeprefix(_PREFIX) for name in names if name and name.startswith(_PREFIX)}
