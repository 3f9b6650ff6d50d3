"""The conformance kit: what proves a dialect, shipped with dbworker.

One call runs it all against a dialect and an empty database of its kind::

    from dbworker.testing import exercise

    report = exercise(MyDialect, "mydb://.../conformance")

``exercise`` runs every conformance check (claims, fencing, terminal states, delays,
discovery, reads: ``check_names()``), then the Hypothesis state machine that holds the
dialect's SQL to the core model, and raises ``CheckFailed`` naming the first check that
caught something. The granular pieces serve a pytest suite: ``run_check(name, dialect,
url)`` runs one check (raising ``NotApplicable`` when the dialect's flags rule it out,
for the suite to report as a skip), and ``dbworker.testing.stateful`` holds the state
machine (``run_machine``, ``ExecutionMachine``, ``machine_for``).

The kit imports neither pytest nor, outside ``stateful``, Hypothesis (the
``dbworker[testing]`` extra). ``SERVERS`` says how it bounds lock waits on each kind of
database server; see ``servers.py`` to add one. Nothing in dbworker itself imports it.
"""

from .checks import CHECKS, Check, check_names, run_check
from .exercise import STATE_MACHINE, exercise
from .harness import DialectFactory, FakeClock, Harness
from .report import CheckFailed, NotApplicable, Report
from .servers import SERVERS, Server

__all__ = [
    "CHECKS",
    "SERVERS",
    "STATE_MACHINE",
    "Check",
    "CheckFailed",
    "DialectFactory",
    "FakeClock",
    "Harness",
    "NotApplicable",
    "Report",
    "Server",
    "check_names",
    "exercise",
    "run_check",
]
