"""The worker service of ``benchmarks.latency``: one coordinator with the seed-API
defaults, in a process of its own, counting the statements its engine sends while idle.

Protocol (stdin/stdout, one JSON line each): the first stdin line is
``{"url": ..., "notifications": bool}``; it answers ``{"ready": ..., "server": ...}``
once started. ``{"idle": seconds}`` counts the statements sent during that many
seconds and answers with them. EOF stops the coordinator; it answers ``{"stopped": true}``.

Run by the benchmark: ``python -m benchmarks._latency_process``.
"""

from __future__ import annotations

import collections
import json
import re
import sys
import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import sessionmaker

from ._common import server_version
from .latency_work import ITEMS_TABLE, Base, build

_counts: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()


def _shape(statement: str) -> str:
    # One entry per kind of statement: literals and parameter lists folded.
    text = re.sub(r"\s+", " ", statement).strip()
    text = re.sub(r"'[^']*'", "'?'", text)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return text[:160]


def _count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
    with _lock:
        _counts[_shape(statement)] += 1


def main() -> int:
    settings = json.loads(sys.stdin.readline())
    url = settings["url"]
    engine = sa.create_engine(url)
    Base.metadata.create_all(engine, tables=[ITEMS_TABLE])
    coordinator = build(sessionmaker(engine), url, settings["notifications"])
    coordinator.create_worker_tables()
    coordinator.start()
    try:
        print(json.dumps({"ready": True, "server": server_version(engine)}), flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            seconds = float(request["idle"])
            with _lock:
                _counts.clear()
            # Every engine of this process (the coordinator's included), for the window
            # only: a statement listener costs every statement time, and dbworker takes
            # SQLAlchemy's full path, not the driver's cursor, for a watched connection
            # (``dialects.driver_cursor``), so a listener left in place slowed each
            # pickup measured here (and the handler processes forked with it).
            event.listen(sa.Engine, "before_cursor_execute", _count)
            try:
                time.sleep(seconds)
            finally:
                event.remove(sa.Engine, "before_cursor_execute", _count)
            with _lock:
                counted = dict(_counts.most_common())
            total = sum(counted.values())
            answer = {
                "seconds": seconds,
                "statements": total,
                "per_second": round(total / seconds, 3),
                "by_statement": counted,
            }
            print(json.dumps(answer), flush=True)
    finally:
        coordinator.stop(timeout=30)
        engine.dispose()
    print(json.dumps({"stopped": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
