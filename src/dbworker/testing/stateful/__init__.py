"""The state machine that holds a dialect to the core model (needs Hypothesis: the
``dbworker[testing]`` extra)."""

try:
    import hypothesis  # noqa: F401 - only to say which extra is missing
except ImportError as missing:
    raise ImportError(
        "dbworker.testing.stateful needs Hypothesis: pip install 'dbworker[testing]'"
    ) from missing

from .harness import ModelMismatch, StatefulHarness, open_harness
from .machine import ExecutionMachine, machine_for, run_machine

__all__ = [
    "ExecutionMachine",
    "ModelMismatch",
    "StatefulHarness",
    "machine_for",
    "open_harness",
    "run_machine",
]
