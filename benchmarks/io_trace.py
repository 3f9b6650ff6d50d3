"""Where ``benchmarks.io``'s drain time goes (``--trace FILE``): every call's handler
(dbworker's and Celery's) appends the wall-clock time its wait starts and ends, and the
benchmark the time its clock starts, its calls are sent (inserted, or queued), and the
drain is seen; ``summarize`` turns each measured drain into milliseconds from its clock:
the first start, each wave's starts and returns, and the tail from the last return to
the drain. Off unless ``--trace`` is given (one environment lookup per call).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

#: The trace file, for the handlers' processes (they inherit the environment).
TRACE_ENV = "DBWORKER_BENCH_IO_TRACE"


def mark(event: str, what: object) -> None:
    """Append ``event`` (``start``/``ret`` of a call, or ``clock``/``sent``/``drained`` of
    a run labelled ``what``) with the time, if tracing."""
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as trace:
            trace.write(f"{time.time():.6f} {event} {what}\n")


def summarize(path: Path, concurrency: int) -> list[dict[str, Any]]:
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
            summaries.append(_summary(clock, sent, starts, returns, at, concurrency))
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
