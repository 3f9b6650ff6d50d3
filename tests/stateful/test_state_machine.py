"""The formally tested state machine: every dialect's SQL against the core model.

The budget comes from the Hypothesis profile (tests/conftest.py, HYPOTHESIS_PROFILE);
failing examples are kept in the example database and replayed first next time.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from .machine import machine_for, open_harness


# Above the suite's default: a failure is shrunk inside the test, and a timeout then
# would throw away the minimal counterexample it was about to print.
@pytest.mark.timeout(1800)
def test_dialect_agrees_with_core_model(database_url: str) -> None:
    with open_harness(database_url) as harness:
        run_state_machine_as_test(machine_for(harness))
