"""A log format that uses the item attributes works on every dbworker record: those
about an item and those about none (a handler process that could not start)."""

from __future__ import annotations

import re
from pathlib import Path

from .support import run_python, write_app

SERVICE = """
import logging
import sys
import time

from tasks import URL, Coordinator, Item, coordinator, session_factory, work

from dbworker import Inline, Subprocess

handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(
    logging.Formatter(
        "%(levelname)s worker=%(worker)s source_id=%(source_id)s attempt=%(attempt)s "
        "%(message)s"
    )
)
log = logging.getLogger("dbworker")
log.addHandler(handler)
log.setLevel(logging.INFO)


class Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


seen = Seen()
log.addHandler(seen)

# A worker whose handler processes never start (their interpreter exits at once),
# beside one that works.
broken = Coordinator(session_factory, database_url=URL, executor=Subprocess(python="/bin/false"))
broken.transactional_worker(name="never", source=Item)(work)
coordinator.transactional_worker(name="inline", source=Item, executor=Inline())(work)


def settled() -> bool:
    return any("exited before it was ready" in m for m in seen.messages) and any(
        m.startswith("item finished") for m in seen.messages
    )


if __name__ == "__main__":
    with session_factory.begin() as session:
        session.add(Item(id=1))
    coordinator.create_worker_tables()
    broken.create_worker_tables()
    with coordinator, broken:
        deadline = time.monotonic() + 60
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.05)
"""


def test_a_format_with_item_attributes_formats_every_record(tmp_path: Path) -> None:
    write_app(tmp_path, "tasks.py", "")
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    result = run_python(script, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # A record without the attributes makes logging print this instead of the line.
    assert "--- Logging error ---" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert any(
        re.fullmatch(
            r"ERROR worker=None source_id=None attempt=None dbworker: a handler process "
            r"exited before it was ready \(the handler process exited with status 1\); starting "
            r"another in .*",
            line,
        )
        for line in lines
    ), result.stdout
    finished = [line for line in lines if " item finished in " in line]
    assert finished, result.stdout
    # The message itself does not repeat what the attributes say.
    assert all(
        re.fullmatch(r"INFO worker=(work|inline) source_id=1 attempt=1 item finished in \S+s", f)
        for f in finished
    ), finished
