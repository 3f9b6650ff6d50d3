"""Proof that the kit's state machine can fail: each deliberately broken dialect (broken.py)
must be caught, on every backend where its mistake is observable.

The budget is fixed here rather than taken from the profile: this asserts that a bug is
*found*, and a developer's small ``dev`` budget must not make that flaky. Search stops at
the first counterexample and skips shrinking, and the example database is off, so each
run proves the search finds the bug from scratch, not that it replays an old failure.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from dbworker.dialects import dialect_class
from dbworker.testing.stateful import ModelMismatch, run_machine
from dialects.broken import EndingKeepsKey, IgnoresKey

from .broken import (
    CancelLeavesUndiscovered,
    ClaimsCancelled,
    DoubledTick,
    LeaseIgnoringTakeover,
    NoLockClaim,
    UnfencedFinish,
    UnfencedFinishAll,
    UnfencedFinishAlone,
    UnfencedRenew,
    UnguardedClaim,
    WaitingClaim,
    broken,
)

SEARCH = settings(
    max_examples=1000,
    stateful_step_count=30,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)

# (a) needs two claim transactions open at once to be observable, which SQLite's single
# writer rules out; there the claim that ignores its guard stands in for it. MySQL's
# claim locks inside a search loop, so only the lock-free variant replaces it whole.
CASES: list[tuple[str, type]] = [
    ("postgresql", NoLockClaim),
    ("postgresql", WaitingClaim),
    ("mysql", NoLockClaim),
    ("sqlite", UnguardedClaim),
    *[
        (backend, mistake)
        for mistake in (
            UnfencedFinish,
            UnfencedFinishAll,
            UnfencedFinishAlone,
            UnfencedRenew,
            LeaseIgnoringTakeover,
            CancelLeavesUndiscovered,
            ClaimsCancelled,
            DoubledTick,
            # Issue 26: a keyed worker's claim that ignores the key (two WORKING records
            # of one key), and endings that keep it (a finished item's key stays busy).
            IgnoresKey,
            EndingKeepsKey,
        )
        for backend in ("sqlite", "postgresql", "mysql")
    ],
]


@pytest.mark.parametrize(("backend", "mistake"), CASES, ids=[f"{m.__name__}-{b}" for b, m in CASES])
def test_broken_dialect_is_caught(backend: str, mistake: type, database_url: str) -> None:
    dialect = broken(mistake, dialect_class(backend))
    with pytest.raises(ModelMismatch):
        run_machine(dialect, database_url, settings=SEARCH)
