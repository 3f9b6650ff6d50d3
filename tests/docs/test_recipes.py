"""The recipe files that need a tool of their own to run: Alembic runs the recipe's
``env.py``, pytest the recipe's test module."""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from .blocks import ROOT, run, write_project

RECIPES = ROOT / "docs" / "recipes.md"


def test_alembic_env_py_migrates_the_worker_tables(tmp_path: Path) -> None:
    alembic = pytest.importorskip("alembic")
    write_project(RECIPES, tmp_path)
    # What `alembic init` adds around env.py: the ini file, the script template and
    # the versions directory.
    (tmp_path / "alembic.ini").write_text("[alembic]\nscript_location = migrations\n")
    template = Path(alembic.__file__).parent / "templates" / "generic" / "script.py.mako"
    shutil.copy(template, tmp_path / "migrations" / "script.py.mako")
    (tmp_path / "migrations" / "versions").mkdir()

    revision = run("-m", "alembic", "revision", "--autogenerate", "-m", "init", cwd=tmp_path)
    assert revision.returncode == 0, revision.stderr
    [script] = (tmp_path / "migrations" / "versions").glob("*.py")
    text = script.read_text()
    assert re.search(r"op\.create_table\(\s*['\"]dbworker_thumbnail['\"]", text), text
    assert re.search(r"op\.create_table\(\s*['\"]uploads['\"]", text), text

    upgrade = run("-m", "alembic", "upgrade", "head", cwd=tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    with sqlite3.connect(tmp_path / "app.sqlite") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert {"uploads", "dbworker_thumbnail"} <= tables
    # The migrated tables are what start() expects: the command finds nothing amiss.
    status = run("-m", "dbworker", "status", "tasks:coordinator", cwd=tmp_path)
    assert status.returncode == 0, status.stderr


def test_the_pytest_recipe_passes(tmp_path: Path) -> None:
    write_project(RECIPES, tmp_path)
    result = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_uploads.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
