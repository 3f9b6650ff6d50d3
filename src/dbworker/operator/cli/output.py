"""How the command prints: aligned tables for people, JSON lines for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def as_json(value: object) -> str:
    def default(item: object) -> object:
        return item.isoformat() if isinstance(item, datetime) else str(item)

    return json.dumps(value, default=default)


def one_line(text: str | None, width: int = 100) -> str:
    """The first line of ``text``, cut to ``width``."""
    line = (text or "").splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 3] + "..."
