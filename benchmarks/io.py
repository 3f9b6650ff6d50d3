"""I/O-bound work side by side: dbworker's asyncio and threads executors against Celery's
thread pool (issue 25).

The workload: ``--items`` calls (default 300) that each wait ``WAIT_SECONDS`` (0.3 s:
``asyncio.sleep`` / ``time.sleep``), ``--concurrency`` (default 50) at once; ideally
items / concurrency x 0.3 s (1.8 s).

* dbworker (``asyncio``, ``threads``, and ``uvloop``: the asyncio executor on uvloop's
  event loop): a coordinator in a process of its own
  (``benchmarks.io_work``) with one worker, ``executor=MODE``, whose handler waits and
  writes one row. After a warm-up batch, the clock starts before the rows are inserted
  (one transaction, an ORM bulk INSERT, as Celery's side sends its tasks with
  ``group()``; on PostgreSQL the coordinator is woken by its commit through dbworker's
  opt-in NOTIFY trigger, as for rows another service inserts; elsewhere, or with
  ``--no-wake``, it finds them by polling every 20 ms) and stops when every call's row
  is committed (polled every ``--poll-ms``). Afterwards each call must have exactly one
  row.
* Celery ``threads``: ``celery worker --pool threads -c CONCURRENCY``, Redis as broker,
  ``task_ignore_result``, ``task_acks_late``, ``worker_prefetch_multiplier=4``
  (``benchmarks.celery_app``'s ``fast`` configuration), a task that sleeps. The clock
  stops when the queue is empty and nothing awaits its acknowledgement. This run is
  the issue's bar.
* Celery ``threads``, writing (unless ``--no-celery-writes``): the same, with tasks that
  also write their row to PostgreSQL as dbworker's handler does (a SQLAlchemy session,
  one commit; no load of a source row, no fenced finish, no exactly-once); the clock
  stops once every row is committed. It shows what the write itself costs each side.

For each run: drain time, the number of processes in the system's tree and the PSS of
the tree (sum of /proc/PID/smaps_rollup Pss, peak over samples every
``--rss-interval-ms``; dbworker's tree is its coordinator process and everything under
it). ``--repeat N`` runs everything N times, round-robin, and reports medians. Results go
to ``benchmarks/results/io.json``.

Run: ``python -m benchmarks.io --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import (
    RESULTS_DIR,
    TreeMemory,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    write_report,
)
from .io_trace import TRACE_ENV, mark, summarize
from .io_work import WAIT_SECONDS
from .throughput import REDIS_URL, REPOSITORY, _wait_drained, child_environment, stop_process

MODES = ("asyncio", "threads", "uvloop")
READY_SECONDS = 60.0


def _count(engine: Any, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(sql).scalar() or 0)


def _wait_for_rows(
    engine: Any, target: int, args: argparse.Namespace, deadline: float, what: str
) -> None:
    """Poll until ``io_bench_done`` holds ``target`` rows, every ``--poll-ms``."""
    # One connection, outside any transaction, for every poll: a checkout and its reset
    # on each one (this process used ~0.2 s of CPU over a 2.2 s drain) took CPU from
    # the system under test.
    counted = "SELECT count(*) FROM io_bench_done"
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        while conn.exec_driver_sql(counted).scalar_one() < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not drain")
            time.sleep(args.poll_ms / 1000)


def tree(memory_report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each process of the tree at the peak: its command and PSS."""
    return [
        {"cmd": p["cmd"][:100], "pss_mib": round(p["pss_kib"] / 1024, 1)}
        for p in memory_report["at_peak"]
    ]


def run_dbworker(backend: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from .io_work import Base, Call

    with scratch_database(backend, f"io_{mode.replace(':', '_')}") as url:
        engine = sa.create_engine(url)
        Base.metadata.create_all(engine)
        wake = ["wake"] if args.wake and backend == "postgresql" else []
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.io_work", url, mode, str(args.concurrency), *wake],
            stdout=subprocess.PIPE,
            text=True,
            env=child_environment(),
            cwd=REPOSITORY,
        )
        assert process.stdout is not None
        memory: TreeMemory | None = None
        try:
            line = process.stdout.readline()
            if not line or not json.loads(line).get("ready"):
                raise RuntimeError(f"the dbworker process did not start ({line!r})")

            def drain(first: int, count: int, label: str | None = None) -> float:
                if label:
                    mark("clock", label)
                start = time.perf_counter()
                with Session(engine) as session, session.begin():
                    # As Celery's side sends its tasks, with its batch API (group):
                    # an ORM bulk INSERT, not one unit of work object per row.
                    rows = [{"id": i} for i in range(first, first + count)]
                    session.execute(sa.insert(Call), rows)
                if label:
                    mark("sent", label)
                deadline = time.monotonic() + args.timeout
                _wait_for_rows(
                    engine, first + count - 1, args, deadline, f"dbworker {mode} on {backend}"
                )
                seconds = time.perf_counter() - start
                if label:
                    mark("drained", label)
                return seconds

            drain(1, args.concurrency)  # warm-up: processes started, connections open
            memory = TreeMemory([process.pid], args.rss_interval_ms / 1000).start()
            seconds = drain(args.concurrency + 1, args.items, f"dbworker_{mode}_{backend}")
            memory_report = memory.stop()
            total = args.concurrency + args.items
            rows = _count(engine, "SELECT count(*) FROM io_bench_done")
            distinct = _count(engine, "SELECT count(DISTINCT call_id) FROM io_bench_done")
            if rows != total or distinct != total:
                raise AssertionError(f"{rows} rows for {distinct} of {total} calls")
        finally:
            if memory is not None:
                memory.stop()
            stop_process(process)
            engine.dispose()
    return {
        "system": f"dbworker_{mode}",
        "database": backend,
        "seconds": round(seconds, 3),
        "processes": memory_report["processes"],
        "pss_mib": round(memory_report["peak_pss_kib"] / 1024, 1),
        "rss_mib": round(memory_report["peak_rss_kib"] / 1024, 1),
        "exactly_once": True,
        "woken": bool(wake),
        "tree": tree(memory_report),
    }


def run_celery(args: argparse.Namespace, write: bool = False) -> dict[str, Any]:
    """Celery's thread pool over the workload; ``write``: each task also writes its row
    to PostgreSQL (``celery_app._wait_and_write``), as dbworker's handler does, and the
    clock stops once every row is committed and the queue is drained."""
    import redis
    from celery import group

    from . import celery_app

    keys = f"dbw_io_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    app = celery_app.make_app("fast", keys)
    unacked = celery_app.unacked_keys(keys)["unacked_key"]
    poll = args.poll_ms / 1000
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(scratch_database("postgresql", "io_celery")) if write else ""
        engine = None
        if write:
            import sqlalchemy as sa

            from .io_work import Base

            engine = sa.create_engine(url)
            stack.callback(engine.dispose)
            Base.metadata.create_all(engine)
        worker = subprocess.Popen(
            celery_app.worker_command(keys, args.concurrency, pool="threads"),
            env=child_environment(**{celery_app.CONFIG_ENV: "fast", celery_app.KEYS_ENV: keys}),
            cwd=REPOSITORY,
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(REDIS_URL)
        memory: TreeMemory | None = None
        sent = 0
        try:

            def send(n: int) -> None:
                nonlocal sent
                if write:
                    task = app.tasks[celery_app.WRITE_TASK]
                    calls = range(sent + 1, sent + n + 1)
                    signatures = [task.s(WAIT_SECONDS, url, i) for i in calls]
                else:
                    task = app.tasks[celery_app.WAIT_TASK]
                    signatures = [task.s(WAIT_SECONDS) for _ in range(n)]
                sent += n
                group(signatures).apply_async(queue=keys)

            def drained(deadline: float) -> float:
                end = _wait_drained(client, keys, unacked, poll, deadline)
                if engine is None:
                    return end
                # acks_late: the message is acknowledged after the task, its commit
                # included; the rows are checked all the same.
                _wait_for_rows(engine, sent, args, deadline, "Celery's writes")
                return time.perf_counter()

            send(args.concurrency)  # warm-up
            drained(time.monotonic() + args.timeout)
            memory = TreeMemory([worker.pid], args.rss_interval_ms / 1000).start()
            label = "celery_threads_writing" if write else "celery_threads"
            mark("clock", label)
            start = time.perf_counter()
            send(args.items)
            mark("sent", label)
            end = drained(time.monotonic() + args.timeout)
            mark("drained", label)
            memory_report = memory.stop()
            if engine is not None:
                rows = _count(engine, "SELECT count(*) FROM io_bench_done")
                if rows != sent:
                    raise AssertionError(f"Celery wrote {rows} rows for {sent} calls")
        finally:
            if memory is not None:
                memory.stop()
            stop_process(worker)
            app.connection_for_write().default_channel.queue_delete(keys)
            client.delete(*celery_app.unacked_keys(keys).values())
            client.close()
    return {
        "system": "celery_threads_writing" if write else "celery_threads",
        "seconds": round(end - start, 3),
        "processes": memory_report["processes"],
        "pss_mib": round(memory_report["peak_pss_kib"] / 1024, 1),
        "rss_mib": round(memory_report["peak_rss_kib"] / 1024, 1),
        "tree": tree(memory_report),
    }


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        field: round(statistics.median(r[field] for r in runs), 3)
        for field in ("seconds", "processes", "pss_mib", "rss_mib")
    } | {"runs": len(runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialects_argument(parser)
    parser.set_defaults(dialects=["postgresql"])
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="asyncio,threads,uvloop (asyncio on AsyncIO(loop='uvloop')); MODE:N runs MODE "
        "on N handler processes (e.g. threads:2)",
    )
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-celery", dest="celery", action="store_false")
    parser.add_argument(
        "--no-celery-writes",
        dest="celery_writes",
        action="store_false",
        help="leave out Celery's second run, whose tasks also write their row to PostgreSQL",
    )
    parser.add_argument(
        "--no-wake",
        dest="wake",
        action="store_false",
        help="PostgreSQL: find the calls by polling, without the NOTIFY trigger",
    )
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--rss-interval-ms", type=float, default=100.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "io.json")
    parser.add_argument(
        "--trace",
        type=Path,
        help="write each call's start and return and each run's clock to this file, "
        "and add where each drain's time went to the report (benchmarks.io_trace)",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if args.trace:
        args.trace.write_text("")
        os.environ[TRACE_ENV] = str(args.trace.resolve())  # the handlers' processes inherit it
    report = new_report("io", argv)
    report["workload"] = {
        "items": args.items,
        "wait_seconds": WAIT_SECONDS,
        "concurrency": args.concurrency,
        "ideal_seconds": round(args.items / args.concurrency * WAIT_SECONDS, 3),
    }
    systems: list[tuple[str, tuple[str, str] | None]] = [
        (f"dbworker_{mode}_{backend}", (backend, mode))
        for backend in args.dialects
        for mode in modes
    ]
    if args.celery:
        systems.append(("celery_threads", None))
        if args.celery_writes:
            systems.append(("celery_threads_writing", None))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in systems}
    for round_ in range(args.repeat):
        shift = round_ % len(systems)
        for name, what in systems[shift:] + systems[:shift]:
            log(f"round {round_ + 1}/{args.repeat}: {name}")
            if what is None:
                result = run_celery(args, write=name == "celery_threads_writing")
            else:
                result = run_dbworker(what[0], what[1], args)
            log(
                f"  {result['seconds']} s, {result['processes']} processes, "
                f"{result['pss_mib']} MiB PSS"
            )
            runs[name].append(result)
    report["runs"] = runs
    report["medians"] = {name: medians(found) for name, found in runs.items()}
    celery = report["medians"].get("celery_threads")
    writing = report["medians"].get("celery_threads_writing")
    for name, found in report["medians"].items():
        if not name.startswith("dbworker_"):
            continue
        if celery:
            found["seconds_vs_celery"] = round(found["seconds"] / celery["seconds"], 3)
            found["pss_vs_celery"] = round(found["pss_mib"] / celery["pss_mib"], 3)
        if writing:
            found["seconds_vs_celery_writing"] = round(found["seconds"] / writing["seconds"], 3)
    if args.trace:
        report["trace"] = summarize(args.trace, args.concurrency, WAIT_SECONDS)
        for drain in report["trace"]:
            waves = ", ".join(f"{w['starts'][0]:.0f}-{w['starts'][1]:.0f}" for w in drain["waves"])
            log(
                f"trace {drain['run']}: sent {drain['sent_ms']} ms, first start "
                f"{drain['first_start_ms']} ms, waves start {waves} ms, last return "
                f"{drain['last_return_ms']} ms, drained {drain['tail_ms']} ms after it; "
                f"waits returned late by {drain['cycle']['late_return_ms']} ms, slots "
                f"restarted in {drain['cycle']['restart_ms']} ms"
            )
    write_report(args.output, report)
    print(json.dumps(report["medians"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
