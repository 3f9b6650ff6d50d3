"""The third-party example of docs/databases.md ("Proving it: the conformance kit"), run
as written: its dialect module and its pytest module are taken from the page's blocks,
so the page cannot drift from what works. Then what the example relies on: a failure
names its check, and the kit needs neither pytest nor (for the checks) Hypothesis."""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, inspect

from dbworker.dialects import for_url
from dbworker.dialects.sqlite import SQLiteDialect
from dbworker.testing import STATE_MACHINE, CheckFailed, exercise
from docs.blocks import ROOT, blocks
from test_layering import imported_modules, modules

from .broken import ClaimsTerminal, mixin

PAGE = ROOT / "docs" / "databases.md"
EXAMPLE = ("durable_sqlite.py", "test_durable_sqlite.py")


def test_the_documented_example_proves_its_dialect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    files = {block.path: block.code for block in blocks(PAGE) if block.path in EXAMPLE}
    assert set(files) == set(EXAMPLE), f"{PAGE.name} lost a block of the example"
    for path, code in files.items():
        (project / path).write_text(code)
    monkeypatch.syspath_prepend(str(project))
    for name in ("durable_sqlite", "test_durable_sqlite"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    example = importlib.import_module("test_durable_sqlite")
    example.test_durable_sqlite_conforms(tmp_path)


def test_exercise_runs_check_after_check_in_one_database(database_url: str) -> None:
    """Each check gets the empty database it expects (they seed the same rows), and the
    kit leaves none of its tables behind."""
    checks = ["reset_failed", "unfinish_delay", "read_state"]
    # A few examples: what is tested here is the order and the clean-up around the state
    # machine; its proof of each dialect is tests/stateful's, at the profile's depth.
    report = exercise(
        functools.partial(for_url, database_url),
        database_url,
        checks=checks,
        settings=settings(max_examples=10),
    )
    assert report.passed == [*checks, STATE_MACHINE]
    assert report.skipped == {}
    engine = create_engine(database_url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_a_failure_names_its_check(tmp_path: Path) -> None:
    broken = mixin(ClaimsTerminal)(SQLiteDialect)
    url = f"sqlite:///{tmp_path / 'kit.sqlite'}"
    checks = ["read_state", "terminal_records_never_claimed", "reset_failed"]
    with pytest.raises(CheckFailed) as caught:
        exercise(broken, url, stateful=False, checks=checks)
    assert caught.value.check == "terminal_records_never_claimed"
    assert isinstance(caught.value.__cause__, AssertionError)


def test_nothing_in_the_library_imports_the_kit() -> None:
    found = [
        f"{module} imports {name}"
        for module, path in modules()
        if not module.startswith("dbworker.testing")
        for name in imported_modules(path.read_text(), module, path.name == "__init__.py")
        if name == "dbworker.testing" or name.startswith("dbworker.testing.")
    ]
    assert found == []


def test_the_kit_needs_neither_pytest_nor_hypothesis_for_its_checks(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["hypothesis"] = None  # as if the testing extra were not installed
        from dbworker.dialects.sqlite import SQLiteDialect
        from dbworker.testing import exercise
        assert "pytest" not in sys.modules, "the kit imported pytest"
        url = "sqlite:///{tmp_path / "kit.sqlite"}"
        print(exercise(SQLiteDialect, url, stateful=False, checks=["read_state"]).passed)
        try:
            exercise(SQLiteDialect, url, checks=[])
        except ImportError as exc:
            print(exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "['read_state']",
        "dbworker.testing.stateful needs Hypothesis: pip install 'dbworker[testing]'",
    ]
