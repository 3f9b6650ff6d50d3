"""What a handler returns: the work is done, or this invocation is."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Finished:
    """The work item is complete; it will not be claimed again."""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """This invocation is done but more work remains.

    ``delay`` (seconds) keeps the item from being claimed again sooner, so a
    handler waiting on something outside the database does not spin.
    """

    delay: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.delay, int | float) or isinstance(self.delay, bool):
            raise ConfigurationError(f"Unfinished(delay=...) must be a number, got {self.delay!r}")
        if not math.isfinite(self.delay) or self.delay < 0:
            raise ConfigurationError(
                f"Unfinished(delay=...) must be a finite number >= 0, got {self.delay!r}"
            )


Outcome = Finished | Unfinished
