"""The coordinator's private attributes stay in coordinator.py, checked on the source.

What operators need (the CLI, the dashboard, the metrics) goes through the operator
API, ``coordinator.operations``; any other module that reads ``coordinator._x``
depends on internals that may change under it. A module breaks the rule when it
reads, on anything but ``self``, a private attribute or method the Coordinator class
defines, or any private attribute of something it calls a coordinator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "dbworker"
COORDINATOR = SOURCE / "coordinator.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def coordinator_privates(source: str) -> frozenset[str]:
    """The private names the Coordinator class defines: its methods and properties,
    and the attributes its methods assign on ``self``."""
    [cls] = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "Coordinator"
    ]
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef) and _private(node.name):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and _private(node.attr)
        ):
            names.add(node.attr)
    return frozenset(names)


def _names_a_coordinator(node: ast.expr) -> bool:
    """``coordinator``, ``self.coordinator``, ``other_coordinator``, ``coordinators[0]``."""
    text = ast.unparse(node).lower()
    return "coordinator" in text.rpartition(".")[2]


def violations(source: str, privates: frozenset[str]) -> list[str]:
    """The reads of the coordinator's private attributes in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        receiver = node.value
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            continue
        if node.attr in privates or _names_a_coordinator(receiver):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


PRIVATES = coordinator_privates(COORDINATOR.read_text())
MODULES = sorted(path for path in SOURCE.rglob("*.py") if path != COORDINATOR)


def test_the_coordinator_has_private_attributes_to_protect() -> None:
    assert {"_registration", "_dialect", "_registry_timing", "_scheduler"} <= PRIVATES


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SOURCE)) for p in MODULES])
def test_no_module_reads_the_coordinators_private_attributes(path: Path) -> None:
    assert violations(path.read_text(), PRIVATES) == []


@pytest.mark.parametrize(
    "source",
    [
        "coordinator._registration('jobs')\n",
        "def f(self):\n    return self.coordinator._dialect\n",
        "timing = app.coordinator._registry_timing\n",
        "c = get()\nc._scheduler.states\n",  # a known private name, whatever the variable
        "for other_coordinator in found:\n    other_coordinator._anything\n",
        "coordinators[0]._heartbeat\n",
    ],
)
def test_a_private_read_is_caught(source: str) -> None:
    assert violations(source, PRIVATES), f"{source!r} went unnoticed"


@pytest.mark.parametrize(
    "source",
    [
        "self._dialect = dialect\n",
        "coordinator.operations.backlog()\n",
        "worker.table._private\n",
        "coordinator.__class__\n",
    ],
)
def test_what_is_allowed_passes(source: str) -> None:
    assert violations(source, PRIVATES) == []
