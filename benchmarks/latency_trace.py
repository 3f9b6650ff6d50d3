"""Where one item's pickup latency goes: ``benchmarks.latency --trace``.

With ``DBWORKER_BENCH_TRACE_OUT`` set, ``install()`` (called on import of
``benchmarks.latency_work``, in the worker service and in each handler process) wraps
a few of dbworker's internal steps to append a line per step to that file:

* ``wake``: the scheduler was told new work may be there (a NOTIFY, a same-host datagram);
* ``pass``: the scheduler's loop began a pass (it took the wake-ups);
* ``discover`` and ``discovered``: discovery (and a sweep, when due) began and ended;
* ``claim``: a claim began, and ``claimed <ids>`` when its transaction returned;
* ``dispatch <ids>``: the executor was handed those tasks;
* ``run <id>``: a handler process began the invocation (before loading the row).

``breakdown`` then splits each timed row's commit -> handler start into the stages
between those marks, with medians. The wrapping is for this benchmark alone: it names
private parts of dbworker, which may move; a stage that is not found is left out.
"""

from __future__ import annotations

import atexit
import bisect
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._common import append_line

TRACE_ENV = "DBWORKER_BENCH_TRACE_OUT"

#: The stages, in order: (name, from mark, to mark).
STAGES = (
    ("notify", "commit", "wake"),
    ("wake_to_claim", "wake", "claim"),
    # wake_to_claim, split (when the marks are there):
    ("wake_to_pass", "wake", "pass"),
    ("pass_to_discover", "pass", "discover"),
    ("discover", "discover", "discovered"),
    ("discovered_to_claim", "discovered", "claim"),
    ("pass_to_claim_without_discovery", "pass*", "claim"),
    ("claim", "claim", "claimed"),
    ("to_dispatch", "claimed", "dispatch"),
    ("to_process", "dispatch", "run"),
    ("load_and_call", "run", "start"),
)


#: Marks not yet written: a mark costs a list append on the traced path (an open, write
#: and close each took about 50 us, which the stage after it counted); a thread of the
#: process's own (``_start_flusher``) writes them every ``FLUSH_SECONDS``, between pickups.
_pending: list[tuple[float, tuple[object, ...]]] = []
FLUSH_SECONDS = 0.5


def _note(*fields: object) -> None:
    _pending.append((time.time(), fields))


def _flush() -> None:
    if not _pending:
        return
    taken = _pending[:]
    del _pending[: len(taken)]
    text = "".join(" ".join(str(f) for f in fields) + f" {at:.6f}\n" for at, fields in taken)
    append_line(os.environ[TRACE_ENV], text)


def _start_flusher() -> None:
    def flush_now_and_then() -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            _flush()

    threading.Thread(target=flush_now_and_then, name="trace-flush", daemon=True).start()
    atexit.register(_flush)


def _wrap(
    cls: type, name: str, before: Callable[..., None] | None, after: Callable[..., None] | None
) -> None:
    original = getattr(cls, name, None)
    if original is None or getattr(original, "_traced", False):
        return

    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args)
        result = original(self, *args, **kwargs)
        if after is not None:
            after(result, *args)
        return result

    traced._traced = True  # type: ignore[attr-defined]
    setattr(cls, name, traced)


def _in_child() -> None:
    _pending.clear()  # the parent's, which the parent writes
    _start_flusher()


def install() -> None:
    if not os.environ.get(TRACE_ENV):
        return
    _start_flusher()
    # A forked handler process has no thread but the one that forked: its own flusher.
    os.register_at_fork(after_in_child=_in_child)

    from dbworker.dialects import mysql, postgresql, sqlite
    from dbworker.executors.pool import ProcessPool
    from dbworker.invocation.runtime import Runtime
    from dbworker.scheduling.discovery import DiscoverySchedule
    from dbworker.scheduling.loop import Scheduler

    # ``_received``: every wake-up, from the listener's thread or the scheduler's own (the
    # local channel); ``wake_workers`` (older trees): the listener's and the local thread's.
    wake_mark = "_received" if hasattr(Scheduler, "_received") else "wake_workers"
    _wrap(Scheduler, wake_mark, lambda *_: _note("wake", "-"), None)
    _wrap(Scheduler, "_take_wakeups", lambda *_: _note("pass", "-"), None)
    # ``discover``: in the claim's transaction; ``run`` (older trees): a transaction of its own.
    _wrap(
        DiscoverySchedule,
        "discover",
        lambda *_: _note("discover", "-"),
        lambda *_: _note("discovered", "-"),
    )
    _wrap(
        DiscoverySchedule,
        "run",
        lambda *_: _note("discover", "-"),
        lambda *_: _note("discovered", "-"),
    )

    def claimed(claims: Sequence[Any], *_: Any) -> None:
        _note("claimed", ",".join(str(c.source_id) for c in claims) or "-")

    for cls in (postgresql.PostgreSQLDialect, mysql.MySQLDialect, sqlite.SQLiteDialect):
        _wrap(cls, "claim", lambda *_: _note("claim", "-"), claimed)

    def dispatched(tasks: Sequence[Any]) -> None:
        _note("dispatch", ",".join(str(t.source_id) for t in tasks) or "-")

    _wrap(ProcessPool, "submit_all", dispatched, None)
    _wrap(Runtime, "run", lambda task: _note("run", task.source_id), None)


def breakdown(
    trace: Path, committed: Mapping[int, float], handler_start: Mapping[int, float]
) -> dict[str, Any]:
    """Per stage, the median and p95 in ms over the rows in ``committed`` (id -> commit
    time) whose marks were all found; ``handler_start``: id -> the handler's start."""
    lines = [line.split() for line in trace.read_text().splitlines() if line.strip()]
    wakes = sorted(float(t) for kind, _, t in lines if kind == "wake")
    claim_starts = sorted(float(t) for kind, _, t in lines if kind == "claim")
    plain = {
        name: sorted(float(t) for kind, _, t in lines if kind == name)
        for name in ("pass", "discover", "discovered")
    }
    by_id: dict[str, dict[int, float]] = {"claimed": {}, "dispatch": {}, "run": {}}
    for kind, ids, at in lines:
        if kind in by_id and ids != "-":
            for text in ids.split(","):
                if text.isdigit():
                    # The first mark after the commit is the one that served it.
                    by_id[kind].setdefault(int(text), float(at))
    stages: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    for item, commit in committed.items():
        marks: dict[str, float] = {"commit": commit}
        if item not in by_id["claimed"] or item not in handler_start:
            continue
        marks["claimed"] = by_id["claimed"][item]
        # The claim that returned the item began last before it returned.
        i = bisect.bisect_right(claim_starts, marks["claimed"]) - 1
        if i >= 0:
            marks["claim"] = claim_starts[i]
        j = bisect.bisect_left(wakes, commit)
        if j < len(wakes) and wakes[j] <= marks.get("claim", marks["claimed"]):
            marks["wake"] = wakes[j]
        if "wake" in marks and "claim" in marks:
            # The last of each between the wake-up and the claim.
            for kind in ("pass", "discover", "discovered"):
                times = plain[kind]
                k = bisect.bisect_right(times, marks["claim"]) - 1
                if k >= 0 and times[k] >= marks["wake"]:
                    marks[kind] = times[k]
            if "pass" in marks and "discover" not in marks:
                marks["pass*"] = marks["pass"]
        for kind in ("dispatch", "run"):
            if item in by_id[kind]:
                marks[kind] = by_id[kind][item]
        marks["start"] = handler_start[item]
        for name, begin, end in STAGES:
            if begin in marks and end in marks:
                stages[name].append(marks[end] - marks[begin])
    return {
        name: {
            "n": len(values),
            "p50_ms": round(statistics.median(values) * 1000, 3),
            "p95_ms": round(sorted(values)[int(0.95 * (len(values) - 1))] * 1000, 3),
        }
        for name, values in stages.items()
        if values
    }
