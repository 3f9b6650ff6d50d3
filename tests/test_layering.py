"""The package layering, checked on the source: core <- dialects <- invocation;
core <- executors; everything <- coordinator <- operator (the CLI, the dashboard and
the metrics; docs/internals.md).

Every import counts, including those only made for type checking: an executor
that names a dialect in an annotation already knows about dialects.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "dbworker"

#: What each layer may import of dbworker (by first-level part of the module name).
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "schema": frozenset({"core", "schema"}),
    "dialects": frozenset({"core", "dialects"}),
    "executors": frozenset({"core", "executors"}),
    "invocation": frozenset({"core", "dialects", "schema", "invocation"}),
    # The scheduler's event interface: plain data and a list of callables, importable
    # from anywhere (the scheduling loop reports through it); its kinds are the core's
    # (the transition table names the event each row reports).
    "events": frozenset({"core", "events"}),
    # What operators read (backlog, registry, records): the database, never the
    # scheduling loop or the executors, so the CLI and the dashboard stay read-side.
    "backlog": frozenset({"core", "dialects", "schema", "worker", "backlog"}),
    "registry": frozenset({"core", "dialects", "schema", "worker", "backlog", "registry"}),
    "tables": frozenset({"core", "dialects", "preflight", "schema", "worker", "tables"}),
    # The operator API (coordinator.operations): those reads, and the running
    # scheduler's gauges (read, never driven).
    "operations": frozenset(
        {
            "core",
            "dialects",
            "worker",
            "records",
            "backlog",
            "registry",
            "tables",
            "scheduling",
            "executors",
            "operations",
        }
    ),
    # What operators run (the command, the dashboard, the metrics): the operator API
    # and public names, never the scheduler, dialects, executors or tables directly.
    "operator": frozenset(
        {"core", "events", "logs", "coordinator", "operations", "worker", "registry", "operator"}
    ),
    "wakeups": frozenset({"core", "dialects", "wakeups"}),
    # The conformance kit proves dialects; nothing in the library imports it.
    "testing": frozenset({"core", "dialects", "schema", "testing"}),
}
#: Third-party packages a layer must not import: the core is pure, with no SQL.
FORBIDDEN_THIRD_PARTY: dict[str, frozenset[str]] = {
    "core": frozenset({"sqlalchemy"}),
    "executors": frozenset({"sqlalchemy"}),
}


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Absolute names of the modules ``source`` (the text of ``module``) imports."""
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            names.append(target)
            if not node.module:  # "from . import x": x is a module of the package
                names += [f"{target}.{alias.name}" for alias in node.names]
    return names


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that break the layering."""
    parts = module.split(".")
    layer = parts[1] if len(parts) > 1 else ""
    found = []
    for name in imported_modules(source, module, is_package):
        top, _, rest = name.partition(".")
        if top == "dbworker":
            target = rest.split(".")[0]
            allowed = ALLOWED.get(layer)
            if allowed is not None and target and target not in allowed:
                found.append(f"{module} imports {name}")
        elif top in FORBIDDEN_THIRD_PARTY.get(layer, frozenset()):
            found.append(f"{module} imports {name}")
    return found


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE.parent).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_the_module_respects_the_layering(module: str, path: Path) -> None:
    assert violations(path.read_text(), module, path.name == "__init__.py") == []


def test_every_layer_has_modules() -> None:
    layers = {module.split(".")[1] for module, _ in modules() if "." in module}
    assert set(ALLOWED) <= layers


#: Modules outside the operator package that may import it: the public API's
#: re-exports (the metrics) and ``python -m dbworker``.
OPERATOR_IMPORTERS = frozenset({"dbworker", "dbworker.__main__"})


def imports_the_operator(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of the operator package by ``module``: the coordinator's side must
    not depend on what operators run on top of it."""
    if module in OPERATOR_IMPORTERS or module.split(".")[1:2] == ["operator"]:
        return []
    return [
        f"{module} imports {name}"
        for name in imported_modules(source, module, is_package)
        if name == "dbworker.operator" or name.startswith("dbworker.operator.")
    ]


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_only_the_public_api_imports_the_operator_package(module: str, path: Path) -> None:
    assert imports_the_operator(path.read_text(), module, path.name == "__init__.py") == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("dbworker.coordinator", "from .operator.metrics import PrometheusMetrics\n"),
        ("dbworker.operations.api", "from ..operator import display\n"),
        ("dbworker.registry", "import dbworker.operator.cli\n"),
        (
            "dbworker.tables",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import operator\n",
        ),
    ],
)
def test_an_import_of_the_operator_is_caught(module: str, source: str) -> None:
    assert imports_the_operator(source, module), f"{source!r} in {module} went unnoticed"


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("dbworker.executors.pool", "from ..dialects import Dialect\n"),
        ("dbworker.executors.pool", "from dbworker.invocation.runtime import Runtime\n"),
        ("dbworker.executors.spawn", "from ..dialects.liveness import used_elsewhere\n"),
        (
            "dbworker.executors.base",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..dialects import D\n",
        ),
        ("dbworker.core.tasks", "from ..schema import detached_table\n"),
        ("dbworker.core.tasks", "import sqlalchemy\n"),
        ("dbworker.dialects.base", "from ..invocation import Runtime\n"),
        ("dbworker.invocation.runtime", "from ..executors import pool\n"),
        ("dbworker.executors", "from . import pool\nfrom .. import dialects\n"),
    ],
)
def test_a_crossing_import_is_caught(module: str, source: str) -> None:
    is_package = module == "dbworker.executors"
    assert violations(source, module, is_package), f"{source!r} in {module} went unnoticed"
