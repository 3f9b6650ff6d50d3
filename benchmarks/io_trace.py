"""Where ``benchmarks.io``'s drain time goes (``--trace FILE``): every call's handler
(dbworker's and Celery's) appends the wall-clock time its wait starts and ends, and the
benchmark the time its clock starts, its calls are sent (inserted, or queued), and the
drain is seen; ``summarize`` turns each measured drain into milliseconds from its clock:
the first start, each wave's starts and returns, and the tail from the last return to
the drain. Off unless ``--trace`` is given (one environment lookup per call).

Each drain also gets its slots' cycle, beyond the wait itself (``cycle``): how late the
waits returned (the k-th return against the k-th start, less ``wait_seconds``: a wait
that returns late was kept from its thread or event loop by other work) and how long a
slot stood between a return and the next start in it (the k-th return to the
(k + concurrency)-th start). A slot's call follows the one before it, so its last call
ends about ``calls per slot x (wait + both)`` after the first start: Celery's threads
paid 0.2-0.4 ms a cycle on the machine of 2026-12-06, dbworker's executors 2-4 ms.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

#: The trace file, for the handlers' processes (they inherit the environment).
TRACE_ENV = "DBWORKER_BENCH_IO_TRACE"


#: The trace file's descriptor in this process, by path (opened once: opened for every
#: mark, the trace cost an event loop 2 x 50 opens and closes at each wave's turn).
_OPEN: dict[tuple[int, str], int] = {}


def mark(event: str, what: object) -> None:
    """Append ``event`` (``start``/``ret`` of a call, or ``clock``/``sent``/``drained`` of
    a run labelled ``what``) with the time, if tracing."""
    path = os.environ.get(TRACE_ENV)
    if path:
        key = (os.getpid(), path)
        fd = _OPEN.get(key)
        if fd is None:
            fd = _OPEN[key] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        # One write of one line: O_APPEND keeps each line whole beside other writers.
        os.write(fd, f"{time.time():.6f} {event} {what}\n".encode())


def summarize(path: Path, concurrency: int, wait_seconds: float) -> list[dict[str, Any]]:
    """One summary per measured drain in the trace at ``path``, in order."""
    events: list[tuple[float, str, str]] = []
    for line in path.read_text().splitlines():
        written, kind, subject = line.split(" ", 2)
        events.append((float(written), kind, subject))
    events.sort()
    summaries = []
    clock: tuple[float, str] | None = None
    sent = None
    starts: list[float] = []
    returns: list[float] = []
    for at, event, what in events:
        if event == "clock":
            clock, sent, starts, returns = (at, what), None, [], []
        elif clock is None:
            continue
        elif event == "sent":
            sent = at
        elif event == "start":
            starts.append(at)
        elif event == "ret":
            returns.append(at)
        elif event == "drained" and starts and returns:
            summary = _summary(clock, sent, starts, returns, at, concurrency)
            summary["cycle"] = _cycle(starts, returns, concurrency, wait_seconds)
            summaries.append(summary)
            clock = None

    return summaries


def _summary(
    clock: tuple[float, str],
    sent: float | None,
    starts: list[float],
    returns: list[float],
    drained: float,
    concurrency: int,
) -> dict[str, Any]:
    began, label = clock

    def ms(at: float) -> float:
        return round((at - began) * 1000, 1)

    waves = []
    for first in range(0, len(starts), concurrency):
        wave_starts = starts[first : first + concurrency]
        wave_returns = returns[first : first + concurrency]
        waves.append(
            {
                "starts": [ms(wave_starts[0]), ms(wave_starts[-1])],
                "returns": [ms(wave_returns[0]), ms(wave_returns[-1])] if wave_returns else [],
            }
        )
    return {
        "run": label,
        "sent_ms": None if sent is None else ms(sent),
        "first_start_ms": ms(starts[0]),
        "waves": waves,
        "last_return_ms": ms(returns[-1]),
        "tail_ms": round((drained - returns[-1]) * 1000, 1),
        "drained_ms": ms(drained),
    }


def _cycle(
    starts: list[float], returns: list[float], concurrency: int, wait_seconds: float
) -> dict[str, dict[str, float]]:
    """Percentiles (ms) of how late the waits returned and of each slot's restart."""
    starts, returns = sorted(starts), sorted(returns)
    late = [(r - s - wait_seconds) * 1000 for s, r in zip(starts, returns, strict=False)]
    restart = [
        (starts[k + concurrency] - returns[k]) * 1000
        for k in range(min(len(returns), len(starts) - concurrency))
    ]
    return {"late_return_ms": _percentiles(late), "restart_ms": _percentiles(restart)}


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[int(q * (len(ordered) - 1))], 2)

    return {"p50": at(0.5), "p90": at(0.9), "max": round(ordered[-1], 2)}
