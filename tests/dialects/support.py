"""What this suite's own tests need beside the conformance kit (``dbworker.testing``,
whose ``Harness`` and models they share)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, event


@contextmanager
def statements_run(conn: Connection) -> Iterator[list[str]]:
    """The statements ``conn``'s engine sends while the block runs, whitespace folded."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(conn.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(conn.engine, "before_cursor_execute", record)
