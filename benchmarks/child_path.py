"""Where a handler process's CPU goes, step by step, for one no-op item.

One process, no coordinator: ``--items`` no-op rows are created, discovered and
claimed up front, then the benchmark runs each claimed item through the steps of
``Runtime._run`` as a handler process does (a new session on the connection the
process keeps, its transaction, the load of the source row (on SQLite in one statement
outside any transaction), the handler, the flush, the fenced finish, the commit, the
close) and times each step with this thread's CPU clock (``time.thread_time``), so
waiting for the database is not counted.

``--claim-next`` adds, before the commit, what a handler process would do if it
claimed its next item itself in the same transaction (one record, the worker's
``eligible`` query, a lease and a new token): the design the throughput issue asks to
measure against claiming in batches from the coordinator. Its cost per item is then
reported beside the finish, to compare with the coordinator's whole cost per item
(``benchmarks.throughput``'s CPU per item minus the handler processes').

Run: ``python -m benchmarks.child_path --repeat 3`` (writes
``benchmarks/results/child_path.json``).
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

WORKER = "bench_child_path"
STEPS = ("session", "begin", "load", "handler", "flush", "finish", "claim_next", "commit", "close")


def measure(backend: str, items: int, warmup: int, claim_next: bool) -> dict[str, float]:
    """Median-free totals: CPU microseconds per item for each step, over ``items``."""
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from dbworker import Coordinator
    from dbworker.core.policy import FINISHED
    from dbworker.dialects import Owner, for_url
    from dbworker.invocation.runtime import ChildConfig, Runtime
    from dbworker.invocation.session import HandlerSession

    from .noop_work import ITEMS_TABLE, Base, NoopItem, insert_items, noop

    with scratch_database(backend, "child_path") as url:
        dialect = for_url(url)
        engine = sa.create_engine(url, **dialect.coordinator_engine_options())
        dialect.configure_engine(engine)
        coordinator = Coordinator(sessionmaker(engine), database_url=url)
        coordinator.transactional_worker(name=WORKER, source=NoopItem)(noop)
        registration = coordinator._registration(WORKER)
        table = registration.table
        Base.metadata.create_all(engine, tables=[ITEMS_TABLE])
        coordinator.create_worker_tables()
        # Twice as many rows as items: the claims of --claim-next need unclaimed ones.
        total = warmup + items
        insert_items(engine, 1, 2 * total)
        owner = Owner.current()
        with engine.begin() as conn:
            while dialect.discover(conn, table):
                pass
        with engine.begin() as conn:
            claims = dialect.claim(conn, table, registration.eligible_query(), total, 300.0, owner)
        tasks = [registration.task(claim) for claim in claims]
        runtime = Runtime(ChildConfig(url, {}, type(dialect)))
        runtime.warm_up()
        worker = runtime.prepare(WORKER, NoopItem)
        spent = dict.fromkeys(STEPS, 0.0)
        clock = time.thread_time
        try:
            for number, task in enumerate(tasks):
                marks = [clock()]
                held = runtime.held.take()  # the connections the process keeps
                session = HandlerSession(bind=held.write, expire_on_commit=False)
                marks.append(clock())
                if held.read is not None:
                    # SQLite: the row is read apart, as Runtime does; the handler's
                    # transaction begins with its first statement (here: the finish).
                    marks.append(clock())
                    source = runtime.load_apart(
                        session, worker, task.source, task.source_id, held.read
                    )
                else:
                    session.connection()
                    marks.append(clock())
                    source = runtime.load(session, worker, task.source, task.source_id)
                marks.append(clock())
                task.handler(source, session)
                marks.append(clock())
                session.flush()
                marks.append(clock())
                done = runtime.dialect.record(
                    session.connection(), worker, task.source_id, task.token, FINISHED
                )
                marks.append(clock())
                if claim_next:
                    runtime.dialect.claim(
                        session.connection(),
                        table,
                        registration.eligible_query(),
                        1,
                        300.0,
                        owner,
                    )
                marks.append(clock())
                session.commit()
                marks.append(clock())
                session.close()
                runtime.held.done()
                marks.append(clock())
                if not done:
                    raise RuntimeError(f"{backend}: item {task.source_id} lost its claim")
                if number >= warmup:
                    for step, start, end in zip(STEPS, marks[:-1], marks[1:], strict=True):
                        spent[step] += end - start
        finally:
            runtime.dispose()
            engine.dispose()
    return {step: round(seconds * 1e6 / items, 1) for step, seconds in spent.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.child_path",
        description="CPU per step of a handler process's path for one no-op item.",
    )
    add_dialects_argument(parser)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "child_path.json")
    args = parser.parse_args(argv)
    report = new_report("child_path", argv)
    report["config"] = {"items": args.items, "warmup": args.warmup, "repeat": args.repeat}
    results: dict[str, Any] = {}
    for backend in args.dialects:
        for claim_next in (False, True):
            runs = []
            for index in range(args.repeat):
                run = measure(backend, args.items, args.warmup, claim_next)
                log(f"[{index + 1}/{args.repeat}] {backend} claim_next={claim_next}: {run}")
                runs.append(run)
            medians = {step: statistics.median(r[step] for r in runs) for step in STEPS}
            medians["total"] = round(sum(medians.values()), 1)
            key = "with_claim_next" if claim_next else "as_now"
            results.setdefault(backend, {})[key] = {"cpu_us_per_item": medians, "runs": runs}
    report["results"] = results
    write_report(args.output, report)
    print(f"{'database':<12} {'mode':<16} " + " ".join(f"{s:>10}" for s in (*STEPS, "total")))
    for backend, modes in results.items():
        for mode, result in modes.items():
            row = result["cpu_us_per_item"]
            values = " ".join(f"{row[s]:>10}" for s in (*STEPS, "total"))
            print(f"{backend:<12} {mode:<16} {values}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
