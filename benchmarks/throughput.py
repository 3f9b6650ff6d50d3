"""End-to-end no-op throughput: dbworker on each database against Celery + Redis.

Both sides run the same shape of job: ``--items`` no-op units of work, two worker
processes, and a wall clock from "work exists" to "every result is known".

* dbworker: a ``Coordinator`` (default process pool, real child processes) with one
  worker at ``concurrency=2`` whose handler returns ``Finished()``. The clock starts
  before the rows are inserted (one transaction) and stops when every execution record
  is FINISHED (polled every ``--poll-ms``), or after ``--max-seconds``: the rate is
  then the records finished so far over that time (``truncated`` in the output).
* Celery: ``celery worker --pool prefork --concurrency 2`` started as a subprocess on a
  private queue, Redis as broker and result backend. The clock starts before the
  tasks are sent and stops when every result has been received.

Each side first runs a warm-up batch (processes started, connections open). Each
database gets its own scratch database; Celery its own queue name. Everything is run
in one invocation so the machine's load is as similar as possible for all of them.

Run: ``python -m benchmarks.throughput --help``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator
from dbworker.dialects import for_url

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    server_version,
    write_report,
)
from .noop_work import ITEMS_TABLE, Base, NoopItem, insert_items, noop

WORKER = "bench_throughput"
REDIS_URL = os.environ.get("DBWORKER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


# -- dbworker ------------------------------------------------------------------------------


def _wait_finished(
    engine: sa.Engine, table: sa.Table, total: int, poll: float, deadline: float
) -> tuple[float, int]:
    """Wait until ``total`` records are FINISHED, or ``deadline`` (monotonic) passes:
    (when, how many were finished then)."""
    query = select(func.count()).where(table.c.status == "finished")
    while True:
        with engine.connect() as conn:
            done = int(conn.execute(query).scalar() or 0)
        now = time.perf_counter()
        if done >= total or time.monotonic() > deadline:
            return now, done
        time.sleep(poll)


def run_dbworker(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with scratch_database(backend, "throughput") as url:
        dialect = for_url(url)
        engine = sa.create_engine(url, **dialect.coordinator_engine_options())
        dialect.configure_engine(engine)
        try:
            version = server_version(engine)
            coordinator = Coordinator(
                sessionmaker(engine),
                database_url=url,
                # Short waits after an empty poll, as a latency-minded deployment would
                # set them: the batch is found within 50 ms of its commit.
                poll_seconds=0.05,
                max_poll_seconds=0.05,
            )
            coordinator.transactional_worker(
                name=WORKER, source=NoopItem, concurrency=args.concurrency
            )(noop)
            table = coordinator.workers[WORKER].execution_table
            Base.metadata.create_all(engine, tables=[ITEMS_TABLE])
            coordinator.create_worker_tables()
            poll = args.poll_ms / 1000
            coordinator.start()
            try:
                insert_items(engine, 1, args.warmup)
                _, warm = _wait_finished(
                    engine, table, args.warmup, poll, time.monotonic() + args.timeout
                )
                if warm < args.warmup:
                    raise TimeoutError(f"only {warm} of {args.warmup} warm-up items finished")
                start = time.perf_counter()
                insert_items(engine, args.warmup + 1, args.items)
                end, done = _wait_finished(
                    engine,
                    table,
                    args.warmup + args.items,
                    poll,
                    time.monotonic() + args.max_seconds,
                )
            finally:
                coordinator.stop(timeout=30)
        finally:
            engine.dispose()
    seconds = end - start
    completed = done - args.warmup
    return {
        "system": f"dbworker/{backend}",
        "server": version,
        "items": args.items,
        "items_completed": completed,
        "truncated": completed < args.items,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 3),
        "items_per_second": round(completed / seconds, 1),
    }


# -- Celery --------------------------------------------------------------------------------


def run_celery(args: argparse.Namespace) -> dict[str, Any]:
    from celery import group

    from . import celery_app

    queue = f"dbw_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DBWORKER_BENCH_REDIS_URL": REDIS_URL,
        "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p),
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchmarks.celery_app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(args.concurrency),
            "--queues",
            queue,
            "--hostname",
            f"{queue}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            "WARNING",
        ],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        task = celery_app.noop
        warm = group(task.s() for _ in range(args.warmup)).apply_async(queue=queue)
        warm.get(timeout=args.timeout)
        start = time.perf_counter()
        batch = group(task.s() for _ in range(args.items)).apply_async(queue=queue)
        results = batch.get(timeout=args.timeout)
        end = time.perf_counter()
        if len(results) != args.items:
            raise RuntimeError(f"got {len(results)} Celery results, expected {args.items}")
        batch.forget()
        warm.forget()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        celery_app.app.connection_for_write().default_channel.queue_delete(queue)
    import celery
    import redis

    seconds = end - start
    return {
        "system": "celery+redis",
        "server": f"celery {celery.__version__}, redis-py {redis.__version__}",
        "items": args.items,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 3),
        "items_per_second": round(args.items / seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description="No-op throughput of dbworker on each database against Celery + Redis.",
    )
    add_dialects_argument(parser)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=40.0,
        help="measure dbworker on one database for at most this long: the rate is then "
        "items finished so far / time (keeps a whole run within a few minutes)",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="give up on a warm-up or Celery after this"
    )
    parser.add_argument("--no-celery", dest="celery", action="store_false")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "throughput.json")
    args = parser.parse_args(argv)
    dialects: list[str] = args.dialects

    report: dict[str, Any] = new_report("throughput", argv) | {
        "config": {
            "items": args.items,
            "max_seconds_per_database": args.max_seconds,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "poll_ms": args.poll_ms,
            "redis": REDIS_URL,
        },
        "results": {},
    }
    started = time.perf_counter()
    if args.celery:
        result = run_celery(args)
        report["results"]["celery"] = result
        log(f"celery+redis: {result['items_per_second']} items/s ({result['seconds']} s)")
    for backend in dialects:
        result = run_dbworker(backend, args)
        report["results"][backend] = result
        log(f"dbworker/{backend}: {result['items_per_second']} items/s ({result['seconds']} s)")
    if args.celery:
        celery_rate = report["results"]["celery"]["items_per_second"]
        report["ratios"] = {
            "of": "dbworker items/s / celery items/s",
            **{
                backend: round(report["results"][backend]["items_per_second"] / celery_rate, 3)
                for backend in dialects
            },
        }
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    write_report(args.output, report)
    log(f"wrote {args.output} ({report['total_seconds']} s)")
    for key, ratio in report.get("ratios", {}).items():
        if key != "of":
            log(f"dbworker/{key} / celery: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
