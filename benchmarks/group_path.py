"""A handler process's cost per no-op item: one item per transaction vs. groups.

One process, no coordinator: no-op rows are created, discovered and claimed up front,
then run through ``Runtime.run`` (the single path: one transaction and COMMIT per item)
or ``invocation.group.run_group`` (``--group`` items per transaction, each in a
SAVEPOINT, one COMMIT), timing this thread's CPU (``time.thread_time``) and the wall
clock per item. The wall clock includes the database's work (the commit's WAL flush).

Run: ``python -m benchmarks.group_path --group 1,4,10,16`` (writes
``benchmarks/results/group_path.json``).
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

WORKER = "bench_group_path"


def measure(backend: str, items: int, group: int) -> dict[str, float]:
    """CPU and wall microseconds per item over ``items`` items run ``group`` at a time."""
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from dbworker import Coordinator
    from dbworker.core.tasks import ResultKind
    from dbworker.dialects import Owner, for_url
    from dbworker.invocation.group import run_group
    from dbworker.invocation.runtime import ChildConfig, Runtime

    from .noop_work import ITEMS_TABLE, Base, NoopItem, insert_items, noop

    with scratch_database(backend, "group_path") as url:
        dialect = for_url(url)
        engine = sa.create_engine(url, **dialect.coordinator_engine_options())
        dialect.configure_engine(engine)
        coordinator = Coordinator(sessionmaker(engine), database_url=url)
        coordinator.transactional_worker(name=WORKER, source=NoopItem)(noop)
        registration = coordinator._registration(WORKER)
        table = registration.table
        Base.metadata.create_all(engine, tables=[ITEMS_TABLE])
        coordinator.create_worker_tables()
        warmup = 4 * group
        insert_items(engine, 1, warmup + items)
        with engine.begin() as conn:
            while dialect.discover(conn, table):
                pass
        with engine.begin() as conn:
            claims = dialect.claim(
                conn, table, registration.eligible_query(), warmup + items, 300.0, Owner.current()
            )
        tasks = [registration.task(claim) for claim in claims]
        runtime = Runtime(ChildConfig(url, {}, type(dialect)))
        runtime.warm_up()
        cpu = wall = 0.0
        try:
            index = 0
            while index < len(tasks):
                batch = tasks[index : index + group]
                cpu_start, wall_start = time.thread_time(), time.perf_counter()
                if group == 1:
                    results = [runtime.run(batch[0])]
                else:
                    results = run_group(runtime, batch, lambda _key: False)
                if index >= warmup:
                    cpu += time.thread_time() - cpu_start
                    wall += time.perf_counter() - wall_start
                bad = [r for r in results if r.kind is not ResultKind.FINISHED]
                if bad:
                    raise RuntimeError(f"{backend}: {bad[0]}")
                index += len(results)
        finally:
            runtime.dispose()
            engine.dispose()
    counted = len(tasks) - warmup
    return {"cpu_us": round(cpu * 1e6 / counted, 1), "wall_us": round(wall * 1e6 / counted, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.group_path",
        description="A handler process's CPU and wall time per no-op item, by group size.",
    )
    add_dialects_argument(parser)
    parser.add_argument("--items", type=int, default=1600)
    parser.add_argument("--group", default="1,4,10,16", help="group sizes (1: single path)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "group_path.json")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.group.split(",")]
    report = new_report("group_path", argv)
    report["config"] = {"items": args.items, "groups": sizes, "repeat": args.repeat}
    results: dict[str, Any] = {}
    for backend in args.dialects:
        for size in sizes:
            runs = [measure(backend, args.items, size) for _ in range(args.repeat)]
            median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            log(f"{backend} group={size}: {median} (runs {runs})")
            results.setdefault(backend, {})[str(size)] = {"median": median, "runs": runs}
    report["results"] = results
    write_report(args.output, report)
    print(f"{'database':<12} {'group':>5} {'CPU us/item':>12} {'wall us/item':>13}")
    for backend, by_size in results.items():
        for size, result in by_size.items():
            row = result["median"]
            print(f"{backend:<12} {size:>5} {row['cpu_us']:>12} {row['wall_us']:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
