"""The limit: no-op throughput of a hand-written runner with dbworker's semantics.

What would the fastest possible implementation of dbworker's contract reach on this
machine and database? Each database gets a reference runner written directly on its
driver (psycopg 3, MySQLdb, sqlite3), with no dbworker code and no SQLAlchemy in its
processes, doing what dbworker does for every item and nothing more:

* ``--items`` no-op source rows (``noop_work``'s table) and their execution records
  (dbworker's DDL: same columns and indexes, partial where the database has them),
  every record ``pending`` with token 0, all created before the clock starts;
* two persistent worker processes (``--processes``; multiprocessing's spawn start
  method), each looping: claim up to ``--batch`` claimable records in key order in one
  transaction, each with a new fencing token (``token + 1``), a lease of 30 s on the
  database's clock, ``status = 'working'``, attempts + 1, claimed_at and the owner's
  host and pid; then, for each claimed record, one transaction that loads the source
  row by its key, runs the no-op and finishes the record under its token
  (``... WHERE source_id = ? AND token = ? AND status IN ('working')``, one row or the
  claim was lost), and commits.

How each database claims (the same SQL semantics as dbworker's dialect for it):

* PostgreSQL: one statement, ``UPDATE ... WHERE source_id IN (SELECT ... ORDER BY
  source_id LIMIT k FOR UPDATE SKIP LOCKED) RETURNING``; the tables are analyzed once
  the work is created (see ``create_work``).
* MariaDB / MySQL (READ COMMITTED): a locking ``SELECT ... FOR UPDATE SKIP LOCKED`` in
  key order, then ``UPDATE`` by primary key. The search reads each open status through
  the (status, source_id) index, one part per status in a UNION: there is no partial
  index, and one locking search over all open statuses sorts them, which locks every
  open record it sorted (a second claimer then finds nothing).
* SQLite (WAL, synchronous NORMAL, 30 s busy timeout): ``BEGIN IMMEDIATE`` and one
  ``UPDATE ... RETURNING``; every transaction takes the write lock up front, as dbworker's
  engine does.

The clock runs from "go" (both workers connected and warmed up on ``--warmup`` items)
to the end of the last worker's loop, which stops at its first empty claim. Reported
per database and size: items/s, wall time, CPU time per item of the two workers
(``getrusage``, their own, for the timed loop), and the peak resident memory of the
workers (sampled from /proc; the benchmark's own process is not counted). The
database server's CPU is not included anywhere. ``--repeat`` runs each measurement
that many times, round-robin, and reports medians.

``measure_limit(backend, items)`` is what ``benchmarks.throughput`` calls.

Run: ``python -m benchmarks.limit --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ._common import (
    RESULTS_DIR,
    TreeMemory,
    add_dialects_argument,
    csv,
    log,
    new_report,
    scratch_database,
    write_report,
)

WORKER = "bench_limit"
TABLE = f"dbworker_{WORKER}"
ITEMS = "bench_noop_items"
LEASE_SECONDS = 30.0
BUSY_TIMEOUT_SECONDS = 30.0

#: "now" on the database's clock, in epoch seconds: the expressions dbworker's dialects use.
NOW = {
    "postgresql": "CAST(EXTRACT(epoch FROM clock_timestamp()) AS FLOAT)",
    "mysql": "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1e6)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400.0 AS FLOAT)",
}
#: Each driver's placeholder.
PARAM = {"postgresql": "%s", "mysql": "%s", "sqlite": "?"}
OPEN = "status IN ('pending', 'unfinished', 'working')"


def claimable(now: str) -> str:
    """dbworker's claim condition: pending, unfinished and due, or working with an expired
    lease.

    The leading ``status IN (...)`` is the partial indexes' predicate word for word, so
    that planners can read the open records through them in key order. The rest is a
    CASE on the status rather than dbworker's OR of three branches: it selects the same
    records, but gives a planner no per-status index conditions to combine. With the OR
    and no statistics yet (a new table), PostgreSQL 15 bitmap-scans every open record and
    sorts them at each claim: 13 ms per claim at 20,000 open records instead of 0.1 ms.
    """
    return (
        f"{OPEN} AND CASE status WHEN 'pending' THEN TRUE"
        f" WHEN 'unfinished' THEN (not_before IS NULL OR not_before <= {now})"
        f" WHEN 'working' THEN lease_expires_at < {now} ELSE FALSE END"
    )


def claim_assignments(now: str, p: str) -> str:
    """The SET list of a claim (parameters: lease seconds, owner host, owner pid).

    ``crashes`` comes first: MySQL evaluates SET left to right with the values already
    assigned, and a takeover (a WORKING record) counts as a crash of its holder.
    """
    return (
        "crashes = crashes + CASE WHEN status = 'working' THEN 1 ELSE 0 END,"
        f" status = 'working', token = token + 1, lease_expires_at = {now} + {p},"
        f" not_before = NULL, attempts = attempts + 1, claimed_at = {now},"
        f" updated_at = {now}, owner_host = {p}, owner_pid = {p}"
    )


def finish_sql(backend: str) -> str:
    """The fenced finish (parameters: source id, token), as dbworker's ``finish``."""
    now, p = NOW[backend], PARAM[backend]
    return (
        f"UPDATE {TABLE} SET status = 'finished', lease_expires_at = NULL,"
        f" not_before = NULL, finished_at = {now}, error = NULL, error_type = NULL,"
        f" traceback = NULL, updated_at = {now}"
        f" WHERE source_id = {p} AND token = {p} AND status IN ('working')"
    )


def load_sql(backend: str) -> str:
    return f"SELECT {ITEMS}.id FROM {ITEMS} WHERE {ITEMS}.id = {PARAM[backend]}"


def noop(row: Any) -> None:
    """The work: nothing (``noop_work.noop``'s counterpart)."""
    return None


# -- the runners (child processes) ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerSpec:
    """What a worker process needs: plain data, sent to it by pickling."""

    backend: str
    #: Keyword arguments of the driver's connect() (for SQLite: {"database": path}).
    connect: dict[str, Any]
    batch: int


class Runner:
    """One worker process's connection and statements on one database."""

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self.owner = (socket.gethostname()[:255], os.getpid())
        self.finish = finish_sql(spec.backend)
        self.load = load_sql(spec.backend)

    def claim(self) -> list[tuple[Any, int]]:
        """Claim up to ``batch`` records: (source id, new token), in key order."""
        raise NotImplementedError

    #: The driver's connection and cursor, opened by each database's runner.
    conn: Any
    cur: Any

    def work(self, source_id: Any, token: int) -> bool:
        """Run one claimed item in one transaction; False if its claim was lost (the
        driver opens the transaction with the first statement)."""
        self.cur.execute(self.load, (source_id,))
        noop(self.cur.fetchone())
        self.cur.execute(self.finish, (source_id, token))
        if self.cur.rowcount != 1:
            self.conn.rollback()
            return False
        self.conn.commit()
        return True

    def close(self) -> None:
        self.conn.close()


class PostgreSQLRunner(Runner):
    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        import psycopg

        self.conn = psycopg.connect(**spec.connect)
        self.cur = self.conn.cursor()
        now, p, k = NOW["postgresql"], PARAM["postgresql"], int(spec.batch)
        # The limit is a literal: a prepared statement's generic plan (psycopg prepares
        # a statement on its fifth execution) then plans for it, not for "10% of rows".
        self.claim_sql = (
            f"UPDATE {TABLE} SET {claim_assignments(now, p)}"
            f" WHERE source_id IN (SELECT source_id FROM {TABLE} WHERE {claimable(now)}"
            f" ORDER BY source_id LIMIT {k} FOR UPDATE SKIP LOCKED)"
            " RETURNING source_id, token"
        )

    def claim(self) -> list[tuple[Any, int]]:
        self.cur.execute(self.claim_sql, (LEASE_SECONDS, *self.owner))
        rows = self.cur.fetchall()
        self.conn.commit()
        return sorted((row[0], row[1]) for row in rows)


class MySQLRunner(Runner):
    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        import MySQLdb  # type: ignore[import-untyped]

        self.conn = MySQLdb.connect(**spec.connect)
        self.cur = self.conn.cursor()
        # Claims read the latest committed rows, as dbworker's coordinator engine does.
        self.cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        now, p, k = NOW["mysql"], PARAM["mysql"], int(spec.batch)
        # Each part locks up to k records; those the outer LIMIT leaves out stay locked
        # until the claim commits (only with unfinished or expired records, which this
        # benchmark never has), and the other worker's claim skips them meanwhile.
        index = f"FORCE INDEX ({TABLE}_status_ix)"
        parts = " UNION ALL ".join(
            f"(SELECT source_id, token FROM {TABLE} {index}"
            f" WHERE status = '{status}' AND {claimable(now)}"
            f" ORDER BY source_id LIMIT {k} FOR UPDATE SKIP LOCKED)"
            for status in ("pending", "unfinished", "working")
        )
        self.lock_sql = f"SELECT source_id, token FROM ({parts}) AS o ORDER BY source_id LIMIT {k}"
        self.claim_prefix = f"UPDATE {TABLE} SET {claim_assignments(now, p)} WHERE source_id IN "

    def claim(self) -> list[tuple[Any, int]]:
        self.cur.execute(self.lock_sql)
        locked = [(row[0], int(row[1])) for row in self.cur.fetchall()]
        if not locked:
            self.conn.commit()
            return []
        marks = ", ".join(["%s"] * len(locked))
        self.cur.execute(
            f"{self.claim_prefix}({marks})",
            (LEASE_SECONDS, *self.owner, *(source_id for source_id, _ in locked)),
        )
        self.conn.commit()
        return [(source_id, token + 1) for source_id, token in locked]


class SQLiteRunner(Runner):
    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        import sqlite3

        # isolation_level=None: no implicit BEGIN; every transaction below is
        # BEGIN IMMEDIATE, which takes the write lock at once (or waits for it).
        self.conn = sqlite3.connect(
            spec.connect["database"], timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None
        )
        self.cur = self.conn.cursor()
        # The parent switched the file to WAL (it stays so); switching it here again
        # from two workers at once can fail with "database is locked".
        if self.cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.cur.execute("PRAGMA journal_mode = WAL")
        # As dbworker's own connections: commits do not wait for the disk under WAL.
        self.cur.execute("PRAGMA synchronous = NORMAL")
        now, p, k = NOW["sqlite"], PARAM["sqlite"], int(spec.batch)
        self.claim_sql = (
            f"UPDATE {TABLE} SET {claim_assignments(now, p)}"
            f" WHERE source_id IN (SELECT source_id FROM {TABLE} WHERE {claimable(now)}"
            f" ORDER BY source_id LIMIT {k})"
            " RETURNING source_id, token"
        )

    def claim(self) -> list[tuple[Any, int]]:
        self.cur.execute("BEGIN IMMEDIATE")
        self.cur.execute(self.claim_sql, (LEASE_SECONDS, *self.owner))
        rows = self.cur.fetchall()
        self.cur.execute("COMMIT")
        return sorted((row[0], row[1]) for row in rows)

    def work(self, source_id: Any, token: int) -> bool:
        self.cur.execute("BEGIN IMMEDIATE")
        self.cur.execute(self.load, (source_id,))
        noop(self.cur.fetchone())
        self.cur.execute(self.finish, (source_id, token))
        if self.cur.rowcount != 1:
            self.cur.execute("ROLLBACK")
            return False
        self.cur.execute("COMMIT")
        return True


RUNNERS: dict[str, Callable[[RunnerSpec], Runner]] = {
    "postgresql": PostgreSQLRunner,
    "mysql": MySQLRunner,
    "sqlite": SQLiteRunner,
}


def drain(runner: Runner) -> dict[str, int]:
    """Claim and run until a claim comes back empty: every record is then finished or
    held by the other worker."""
    done = lost = claims = 0
    while True:
        claimed = runner.claim()
        if not claimed:
            return {"done": done, "lost": lost, "claims": claims}
        claims += 1
        for source_id, token in claimed:
            if runner.work(source_id, token):
                done += 1
            else:
                lost += 1


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker_main(spec: RunnerSpec, pipe: Connection) -> None:
    """A worker process: warm up, report ready, wait for "go", drain, report."""
    try:
        runner = RUNNERS[spec.backend](spec)
        warm = drain(runner)
        pipe.send(("ready", warm))
        if pipe.recv() != "go":
            return
        cpu, started = _cpu(), time.monotonic()
        counts = drain(runner)
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        ended = time.monotonic()
        cpu = _cpu() - cpu
        runner.close()
        loaded = sorted(name for name in ("dbworker", "sqlalchemy") if name in sys.modules)
        pipe.send(
            (
                "done",
                {
                    **counts,
                    "started": started,
                    "ended": ended,
                    "cpu_seconds": cpu,
                    "loaded": loaded,
                },
            )
        )
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        raise


# -- the benchmark (parent process) -------------------------------------------------------


def driver_arguments(backend: str, url: str) -> dict[str, Any]:
    """The driver's connect() arguments for a SQLAlchemy URL."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if backend == "sqlite":
        return {"database": parsed.database}
    options: dict[str, Any] = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password,
    }
    if backend == "postgresql":
        options["dbname"] = parsed.database
    else:
        options |= {"database": parsed.database, "charset": "utf8mb4"}
    options |= dict(parsed.query)
    return {key: value for key, value in options.items() if value is not None}


def create_work(url: str, first: int, count: int) -> str:
    """Add source rows first..first+count-1 and their pending records (one transaction;
    the tables are created by the first call). Returns the server's version."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    from dbworker.schema import execution_table

    from ._common import server_version
    from .noop_work import ITEMS_TABLE

    # A private MetaData: dbworker's DDL for the execution table beside a copy of the
    # no-op source table, set up by the benchmark (no dbworker code runs in the workers).
    metadata = sa.MetaData()
    items = ITEMS_TABLE.to_metadata(metadata)
    table = execution_table(WORKER, sa.Integer(), metadata)
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:  # once, before the workers connect
                conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        metadata.create_all(engine)
        ids = range(first, first + count)
        now = time.time()
        with engine.begin() as conn:
            conn.execute(sa.insert(items), [{"id": i} for i in ids])
            conn.execute(
                sa.insert(table),
                [
                    {
                        "source_id": i,
                        "status": "pending",
                        "token": 0,
                        "attempts": 0,
                        "failures": 0,
                        "crashes": 0,
                        "discovered_at": now,
                        "updated_at": now,
                    }
                    for i in ids
                ],
            )
        if engine.dialect.name == "postgresql":
            # The workers' connections have prepared their statements (psycopg does on
            # the fifth execution) while the tables held the warm-up rows alone, and a
            # prepared statement keeps its plan: one made for 50 rows, which reads the
            # whole execution table (3-10 ms a claim at 20,000 rows instead of 0.1 ms).
            # New statistics make the server plan them again.
            with engine.connect() as conn:
                conn.exec_driver_sql(f"ANALYZE {ITEMS}, {TABLE}")
                conn.commit()
        return server_version(engine)
    finally:
        engine.dispose()


def count_statuses(url: str) -> dict[str, int]:
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(f"SELECT status, count(*) FROM {TABLE} GROUP BY status")
            return {str(status): int(n) for status, n in rows}
    finally:
        engine.dispose()


def _receive(pipes: Sequence[Connection], kind: str, timeout: float) -> list[Any]:
    """One ``kind`` message from each worker, in order; a worker's error is raised."""
    deadline = time.monotonic() + timeout
    messages = []
    for pipe in pipes:
        if not pipe.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"no {kind!r} from a limit worker within {timeout} s")
        what, payload = pipe.recv()
        if what == "error":
            raise RuntimeError(f"a limit worker failed:\n{payload}")
        if what != kind:
            raise RuntimeError(f"a limit worker sent {what!r}, expected {kind!r}")
        messages.append(payload)
    return messages


def measure_limit(
    backend: str,
    items: int,
    *,
    warmup: int = 50,
    batch: int = 2,
    processes: int = 2,
    timeout: float = 300.0,
    rss_interval: float = 0.1,
) -> dict[str, Any]:
    """One timed run of the reference runner on ``backend`` with ``items`` items, in a
    scratch database of its own (called in-process by ``benchmarks.throughput``)."""
    context = multiprocessing.get_context("spawn")
    with scratch_database(backend, "limit") as url:
        version = create_work(url, 1, warmup)
        spec = RunnerSpec(backend, driver_arguments(backend, url), batch)
        pipes: list[Connection] = []
        workers = []
        memory = TreeMemory([], rss_interval)
        try:
            for _ in range(processes):
                ours, theirs = context.Pipe()
                worker = context.Process(target=worker_main, args=(spec, theirs), daemon=True)
                worker.start()
                theirs.close()
                pipes.append(ours)
                workers.append(worker)
            memory.add_roots([w.pid for w in workers if w.pid is not None])
            memory.start()
            _receive(pipes, "ready", timeout)
            create_work(url, warmup + 1, items)
            started = time.monotonic()
            for pipe in pipes:
                pipe.send("go")
            reports = _receive(pipes, "done", timeout)
            memory_report = memory.stop()
            for worker in workers:
                worker.join(timeout=30)
        finally:
            memory.stop()
            for worker in workers:
                if worker.is_alive():
                    worker.kill()
                    worker.join()
            for pipe in pipes:
                pipe.close()
        statuses = count_statuses(url)
    ended = max(r["ended"] for r in reports)
    seconds = ended - started
    done = sum(r["done"] for r in reports)
    lost = sum(r["lost"] for r in reports)
    cpu = sum(r["cpu_seconds"] for r in reports)
    loaded = sorted({name for r in reports for name in r["loaded"]})
    if loaded:
        raise RuntimeError(f"limit/{backend}: the workers imported {loaded}")
    if done != items or statuses.get("finished") != warmup + items:
        raise RuntimeError(
            f"limit/{backend}: {done} of {items} items done, {lost} lost; statuses {statuses}"
        )
    return {
        "system": f"limit/{backend}",
        "server": version,
        "items": items,
        "batch": batch,
        "processes": processes,
        "seconds": round(seconds, 3),
        "items_per_second": round(items / seconds, 1),
        "cpu_ms_per_item": round(cpu * 1000 / items, 4),
        "claims": sum(r["claims"] for r in reports),
        "items_per_worker": [r["done"] for r in reports],
        "memory": memory_report,
    }


def median_of(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians of repeated runs of one measurement (with every run beside them)."""

    def median(key: str) -> float:
        return round(statistics.median(float(run[key]) for run in runs), 4)

    summary: dict[str, Any] = {
        "system": runs[0]["system"],
        "server": runs[0].get("server"),
        "items": runs[0]["items"],
        "repeats": len(runs),
        "items_per_second": round(median("items_per_second"), 1),
        "seconds": round(median("seconds"), 3),
    }
    if all("cpu_ms_per_item" in run for run in runs):
        summary["cpu_ms_per_item"] = median("cpu_ms_per_item")
    memories = [run["memory"] for run in runs if "memory" in run]
    if memories:
        summary["peak_rss_kib"] = max(m["peak_rss_kib"] for m in memories)
        summary["peak_pss_kib"] = max(m["peak_pss_kib"] for m in memories)
        summary["processes"] = max(m["processes"] for m in memories)
    summary["runs"] = list(runs)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.limit",
        description="No-op throughput of a hand-written reference runner with dbworker's "
        "semantics on each database (raw drivers, two worker processes).",
    )
    add_dialects_argument(parser)
    parser.add_argument(
        "--items",
        type=lambda text: [int(n) for n in csv(text)],
        default=[3000, 20000],
        help="comma-separated sizes (items per timed run); default 3000,20000",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch", type=int, default=2, help="records per claim")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "limit.json")
    parser.add_argument("--label", help="a note stored in the report (e.g. 'smoke run')")
    args = parser.parse_args(argv)
    dialects: list[str] = args.dialects
    sizes: list[int] = args.items

    report: dict[str, Any] = new_report("limit", argv) | {
        "label": args.label,
        "config": {
            "items": sizes,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "batch": args.batch,
            "processes": args.processes,
            "lease_seconds": LEASE_SECONDS,
            "start_method": "spawn",
        },
        "results": {},
    }
    started = time.perf_counter()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for repeat in range(args.repeat):
        for size in sizes:
            for backend in dialects:
                result = measure_limit(
                    backend,
                    size,
                    warmup=args.warmup,
                    batch=args.batch,
                    processes=args.processes,
                    timeout=args.timeout,
                )
                runs.setdefault((backend, size), []).append(result)
                log(
                    f"[{repeat + 1}/{args.repeat}] limit/{backend} {size}: "
                    f"{result['items_per_second']} items/s ({result['seconds']} s, "
                    f"{result['cpu_ms_per_item']} ms CPU/item, "
                    f"{result['memory']['peak_rss_kib'] // 1024} MiB RSS)"
                )
    for backend in dialects:
        report["results"][backend] = {str(size): median_of(runs[(backend, size)]) for size in sizes}
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    write_report(args.output, report)
    log(f"wrote {args.output} ({report['total_seconds']} s)")
    for backend in dialects:
        for size in sizes:
            summary = report["results"][backend][str(size)]
            log(
                f"limit/{backend} {size}: {summary['items_per_second']} items/s (median of "
                f"{summary['repeats']}), {summary['cpu_ms_per_item']} ms CPU/item"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
