"""Proof that the conformance checks can fail: each broken dialect must be caught."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from dbworker.dialects import dialect_class
from dbworker.testing import CHECKS, NotApplicable, run_check

from . import test_conformance
from .broken import BREAKAGES, Breakage

CASES = [
    pytest.param(backend, breakage, check, id=f"{breakage.name}-{check}-{backend}")
    for breakage in BREAKAGES
    for backend in breakage.backends
    for check in breakage.caught_by
]


@pytest.mark.parametrize(("backend", "breakage", "check"), CASES, indirect=["backend"])
def test_broken_dialect_is_caught(database_url: str, breakage: Breakage, check: str) -> None:
    base = dialect_class(make_url(database_url).get_backend_name())
    broken = breakage.build(base)
    try:
        with pytest.raises(AssertionError):
            run_check(check, broken, database_url)
    except NotApplicable as skipped:
        pytest.fail(f"{check} skipped instead of checking {breakage.name}: {skipped}")


def test_every_check_is_proven_to_fail() -> None:
    proven = {check for breakage in BREAKAGES for check in breakage.caught_by}
    assert set(CHECKS) - proven == set(), "checks no broken dialect shows can fail"
    assert proven <= set(CHECKS), "breakages name unknown checks"


def test_every_check_runs_in_the_conformance_suite() -> None:
    """CHECKS is what a third party runs; the built-in dialects must run all of it."""
    names = set(CHECKS)
    tested = set(test_conformance.CHECKED)
    assert names - tested == set(), "checks without a conformance test"
