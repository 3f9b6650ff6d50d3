"""Every Python block of README.md, CONTRIBUTING.md and docs/ runs, as a reader would run it
(see ``blocks.py`` for how)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .blocks import DOCUMENTS, ROOT, RUN_BY_TESTS, blocks, run, write_project


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_blocks_of_a_document_run(document: Path, tmp_path: Path) -> None:
    if not blocks(document):
        pytest.skip("no Python blocks")
    files = write_project(document, tmp_path)
    result = run("-m", "docsession", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    imported = ast.literal_eval(result.stdout.splitlines()[-1].removeprefix("imported: "))
    # The files no block imported are scripts: they run as such.
    for path in files:
        module = path[:-3].replace("/", ".")
        if path in RUN_BY_TESTS or module in imported or not path.endswith(".py"):
            continue
        script = run(path, cwd=tmp_path)
        assert script.returncode == 0, f"{path}:\n{script.stdout}{script.stderr}"
        assert "Traceback" not in script.stderr, script.stderr


def test_every_document_is_checked() -> None:
    # A document added to docs/ is picked up without a change here; the README's
    # blocks are the ones readers copy first.
    names = {p.relative_to(ROOT).as_posix() for p in DOCUMENTS}
    assert {"README.md", "CONTRIBUTING.md", "docs/api.md", "docs/recipes.md"} <= names
    assert len(blocks(ROOT / "README.md")) >= 8


def test_files_run_by_tests_exist() -> None:
    named = {b.path for d in DOCUMENTS for b in blocks(d) if b.path is not None}
    assert named >= RUN_BY_TESTS
