"""The Python blocks of the documentation, and how they are run.

The convention the documents follow, so that every block runs as a reader would use it:

- A block whose first line is ``# file: PATH`` is a file of the reader's project, written
  to PATH (``# file: PATH (continued)`` appends to it). A file is then run the way it is
  meant to be: imported by the document's other blocks, run as a script (``python
  PATH``) if none imports it, or by a test of its own (``RUN_BY_TESTS``).
- Every other block runs in order, all of one document in one program, as a reader
  pasting them into one module would run them: ``python -m docsession`` in the
  project directory, on SQLite. (A package's ``__main__`` is what worker processes
  never import again, so the blocks need no main guard of their own.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
FILE_LINE = re.compile(r"# file: (?P<path>\S+)(?P<continued> \(continued\))?$")
#: Files that a dedicated test runs (the document's blocks cannot run them alone).
RUN_BY_TESTS = {"migrations/env.py", "test_uploads.py"}
#: Generous: only bounds how long a hung block takes to fail the test.
TIMEOUT = 240.0


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    code: str
    path: str | None = None  # the project file it is, if any
    continued: bool = False


def blocks(document: Path) -> list[Block]:
    found = []
    lines = document.read_text().splitlines()
    start = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = number
        elif start is not None and line.strip() == "```":
            code = "\n".join(lines[start : number - 1]) + "\n"
            first = FILE_LINE.match(code.splitlines()[0]) if code.strip() else None
            if first:
                found.append(Block(document, start, code, first["path"], bool(first["continued"])))
            else:
                found.append(Block(document, start, code))
            start = None
    return found


def write_project(document: Path, directory: Path) -> dict[str, Path]:
    """Write the document's files and its session into ``directory``; return its files."""
    files: dict[str, Path] = {}
    session: list[str] = []
    for block in blocks(document):
        if block.path is None:
            session.append(f"# {document.name}, line {block.line}\n{block.code}")
            continue
        target = directory / block.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if block.continued:
            assert block.path in files, f"{document.name}:{block.line} continues no file"
            target.write_text(target.read_text() + "\n\n" + block.code)
        else:
            target.write_text(block.code)
        files[block.path] = target
    package = directory / "docsession"
    package.mkdir()
    (package / "__init__.py").write_text("")
    modules = [path[:-3].replace("/", ".") for path in files if path.endswith(".py")]
    # At the end, say which of the document's modules the blocks imported.
    report = f"import sys\nprint('imported:', [m for m in {modules!r} if m in sys.modules])\n"
    (package / "__main__.py").write_text("\n".join([*session, report]))
    return files


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # The project directory comes first on sys.path, as for a reader in it.
    environment = {"PYTHONPATH": str(cwd), "PATH": str(Path(sys.executable).parent)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
