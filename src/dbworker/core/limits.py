"""Per-key exclusivity and rate limits, as plain values (issue 26).

``exclusive_by`` and ``rate_limit`` are enforced by the database inside a claim (see
``dialects/limited.py``); this module only parses and describes them. Pure: no SQL,
no clock.

A rate ``"N/s"``, ``"N/m"`` or ``"N/h"`` allows at most N claims in any window of one
second, minute or hour. It is enforced with N *slots* per key, each holding the time it
was last used: a claim takes a slot last used at least one window ago and stamps it
with the claim's time. Since each slot is stamped at most once per window, any window
holds at most N stamps, that is at most N claims (``slots_free`` is that rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigurationError

#: Window lengths by unit.
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
#: The length of the columns that store keys (``held_key``, the rate slots' key).
HELD_KEY_LENGTH = 255
#: What starts a key too long for them, stored as a digest: 71 characters in all.
KEY_DIGEST_PREFIX = "sha256:"
#: More slots than this per key would make every claim read a large slot set.
MAX_RATE_COUNT = 10_000


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` claims in any window of ``seconds``."""

    count: int
    seconds: float

    def __str__(self) -> str:
        unit = next(u for u, s in UNITS.items() if s == self.seconds)
        return f"{self.count}/{unit}"


def parse_rate(text: object) -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` as a ``Rate``; ConfigurationError naming the
    value otherwise (N must be a positive integer)."""
    if not isinstance(text, str):
        raise ConfigurationError(
            f'rate_limit must be a string such as "5/s", "100/m" or "1000/h", got {text!r}'
        )
    match = _RATE.match(text)
    if match is None:
        raise ConfigurationError(
            f'rate_limit {text!r} is not of the form "N/s", "N/m" or "N/h" (e.g. "5/s")'
        )
    count = int(match.group(1))
    if count < 1:
        raise ConfigurationError(f"rate_limit {text!r}: N must be a positive integer")
    if count > MAX_RATE_COUNT:
        raise ConfigurationError(
            f"rate_limit {text!r}: N may be at most {MAX_RATE_COUNT} per window; "
            "use a longer window's unit for more"
        )
    return Rate(count, UNITS[match.group(2)])


def slot_free(last_used: float | None, now: float, rate: Rate) -> bool:
    """Whether a slot last used at ``last_used`` (None: never) may be used at ``now``."""
    return last_used is None or last_used <= now - rate.seconds


def max_in_window(times: list[float], seconds: float) -> int:
    """The largest number of ``times`` in any half-open window ``[t, t + seconds)``:
    what a rate limit bounds (tests and the benchmark check it on recorded times)."""
    ordered = sorted(times)
    best = start = 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - seconds:
            start += 1
        best = max(best, end - start + 1)
    return best
