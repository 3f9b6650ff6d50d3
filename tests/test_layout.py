"""The source's layout stays readable: small modules, and each class name defined once
(a name that means two things is read as one)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "dbworker"
MAX_LINES = 500


def modules() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(SOURCE)): lines
        for path in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: split them by what they hold"


def test_each_class_name_is_defined_once() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert twice == {}, f"class names defined more than once: {twice}"
