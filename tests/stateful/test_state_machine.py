"""The formally tested state machine: every dialect's SQL against the core model, through
the conformance kit (``dbworker.testing.stateful``).

The budget comes from the Hypothesis profile (tests/conftest.py, HYPOTHESIS_PROFILE);
failing examples are kept in the example database and replayed first next time.
"""

from __future__ import annotations

import functools

import pytest

from dbworker.dialects import for_url
from dbworker.testing.stateful import run_machine


# Above the suite's default: a failure is shrunk inside the test, and a timeout then
# would throw away the minimal counterexample it was about to print.
@pytest.mark.timeout(1800)
def test_dialect_agrees_with_core_model(database_url: str) -> None:
    run_machine(functools.partial(for_url, database_url), database_url)
