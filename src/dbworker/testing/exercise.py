"""One call that proves a dialect: every conformance check, then the state machine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .checks import check_names, run_check
from .harness import DialectFactory, drop_tables
from .report import CheckFailed, NotApplicable, Report

if TYPE_CHECKING:
    from hypothesis import settings as Settings

#: The name the state machine's run goes by in a ``Report`` and a ``CheckFailed``.
STATE_MACHINE = "state_machine"


def exercise(
    dialect: DialectFactory,
    url: str,
    *,
    stateful: bool = True,
    checks: Iterable[str] | None = None,
    settings: Settings | None = None,
) -> Report:
    """Run the conformance checks (all of them, or those named in ``checks``) and, if
    ``stateful``, the state machine against ``dialect`` (a ``Dialect`` subclass, or any
    callable that makes one from the kit's clock) on the database ``url`` names.

    The database should be one the kit may fill and empty: it creates its tables there
    and drops them again, leaving any others alone. Returns a ``Report`` of what passed
    and what did not apply; raises ``CheckFailed`` (an AssertionError naming the check,
    caused by its failure) at the first failure. The state machine needs Hypothesis
    (the ``dbworker[testing]`` extra) and runs under ``settings`` (a
    ``hypothesis.settings``; by default, the profile loaded when it runs).
    """
    names = check_names() if checks is None else list(checks)
    unknown = sorted(set(names) - set(check_names()))
    if unknown:
        raise LookupError(f"no conformance checks are named {unknown}: see check_names()")
    report = Report()
    try:
        for name in names:
            try:
                run_check(name, dialect, url)
            except NotApplicable as skipped:
                report.skipped[name] = str(skipped)
            except Exception as failure:
                raise CheckFailed(name, failure) from failure
            else:
                report.passed.append(name)
    finally:
        drop_tables(url)
    if stateful:
        # Imported here: only the state machine needs Hypothesis.
        from .stateful import run_machine

        try:
            run_machine(dialect, url, settings=settings)
        except Exception as failure:
            raise CheckFailed(STATE_MACHINE, failure) from failure
        report.passed.append(STATE_MACHINE)
    return report
