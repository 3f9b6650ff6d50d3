"""What a run of the kit reports: the checks that passed, those that did not apply, and
the failure that stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field


class NotApplicable(Exception):
    """The check does not apply to this dialect: one of its capability flags says the
    behaviour checked cannot happen there (the message says which, and why). A test
    runner reports it as a skip; dbworker's own conftest turns it into ``pytest.skip``."""


class CheckFailed(AssertionError):
    """A check (or the state machine) found the dialect breaking the contract. The
    original failure is the ``__cause__``; ``check`` names what caught it."""

    def __init__(self, check: str, failure: BaseException) -> None:
        super().__init__(f"{check}: {type(failure).__name__}: {failure}")
        self.check = check


@dataclass
class Report:
    """A run that found nothing wrong: what ran, what did not apply, and why."""

    #: The checks that passed, in the order they ran ("state_machine" for the machine).
    passed: list[str] = field(default_factory=list)
    #: The checks that did not apply, each with the reason the check gave.
    skipped: dict[str, str] = field(default_factory=dict)
