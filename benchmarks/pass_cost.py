"""What a woken scheduler pass costs the coordinator: discovery, claim and COMMIT.

One coordinator's scheduler, no thread of its own and no handler process: for each of
``--passes`` rows, the benchmark commits the row (as an application would), wakes the
worker as a wake-up would (``WorkerState.poll_now``) and runs one pass of its poll
(``Polls.poll``: discovery and the claim in one transaction), timing the wall
clock and this process's CPU (``time.process_time``: waiting for the server is not
counted). The claimed item is then marked finished, so that every pass finds the same
open records: one, the new row. The first ``--warmup`` passes are left out.

This is the part of the pickup latency (``benchmarks.latency --trace``: "discover" to
"to dispatch") that a statement or a round trip less shows in, without the pickup's
other stages and their noise. It names private parts of dbworker, which may move.

Run: ``python -m benchmarks.pass_cost --repeat 5`` (writes
``benchmarks/results/pass_cost.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    write_report,
)

WORKER = "bench_pass_cost"


class _Slots:
    """An executor with two free slots that keeps what it is given (as the default
    executor, it takes the rows of claims made while nothing is held)."""

    uses_rows = True

    def __init__(self) -> None:
        self.submitted = 0

    def free_slots(self) -> int:
        return 2

    def submit_all(self, tasks: Any) -> None:
        self.submitted += len(tasks)


def measure(backend: str, passes: int, warmup: int) -> dict[str, float]:
    """Median wall and CPU milliseconds of a woken pass that claims one new row."""
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from dbworker import Coordinator
    from dbworker.core.timing import PollBackoff
    from dbworker.dialects import Owner
    from dbworker.engines import coordination_engine
    from dbworker.scheduling.loop import Scheduler
    from dbworker.scheduling.state import WorkerState

    from .noop_work import ITEMS_TABLE, Base, NoopItem, noop

    with scratch_database(backend, "pass_cost") as url:
        app = sa.create_engine(url)
        Base.metadata.create_all(app, tables=[ITEMS_TABLE])
        coordinator = Coordinator(sessionmaker(app), database_url=url)
        coordinator.transactional_worker(name=WORKER, source=NoopItem)(noop)
        coordinator.create_worker_tables()
        registration = coordinator._registration(WORKER)
        dialect = coordinator._dialect
        engine = coordination_engine(coordinator._url, dialect, coordinator.engine_options)
        slots = _Slots()
        state = WorkerState(registration, slots, PollBackoff(0.25, 10.0))  # type: ignore[arg-type]
        scheduler = Scheduler(engine, dialect, [state], coordinator._timings, Owner.current())
        table = registration.table.table
        walls: list[float] = []
        cpus: list[float] = []
        try:
            for item in range(1, warmup + passes + 1):
                with app.begin() as conn:
                    conn.execute(sa.insert(NoopItem), {"id": item})
                now = time.monotonic()
                state.poll_now(now)
                wall, cpu = time.perf_counter(), time.process_time()
                scheduler.polls.poll(state, now)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if slots.submitted != item:
                    raise AssertionError(f"pass {item} claimed {slots.submitted - item + 1} rows")
                state.held.clear()
                with app.begin() as conn:
                    finished = sa.update(table).values(status="finished")
                    conn.execute(finished.where(table.c.status == "working"))
                if item > warmup:
                    walls.append(wall * 1000)
                    cpus.append(cpu * 1000)
        finally:
            engine.dispose()
            app.dispose()
    return {
        "wall_ms_p50": round(statistics.median(walls), 3),
        "cpu_ms_p50": round(statistics.median(cpus), 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pass_cost",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_dialects_argument(parser)
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3, help="runs per dialect (medians)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "pass_cost.json")
    args = parser.parse_args(argv)
    report = new_report("pass_cost", argv)
    runs: dict[str, list[dict[str, float]]] = {}
    for backend in args.dialects:
        for run in range(args.repeat):
            figures = measure(backend, args.passes, args.warmup)
            log(f"{backend} run {run + 1}: {figures}")
            runs.setdefault(backend, []).append(figures)
    report["runs"] = runs
    report["medians"] = {
        backend: {
            name: round(statistics.median(run[name] for run in figures), 3) for name in figures[0]
        }
        for backend, figures in runs.items()
    }
    write_report(args.output, report)
    print(report["medians"], file=sys.stdout)


if __name__ == "__main__":
    main()
