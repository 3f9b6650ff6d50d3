"""What a batch of endings' INSERT costs the client, by the way it is sent (issue 25:
where an I/O-bound handler process's event loop spends a wave's turn).

A batch of ``--rows`` new rows of one plain table (two integer columns), written in
one transaction (BEGIN, the INSERT, COMMIT) on one connection, ``--batches`` times, and
timed with this thread's CPU clock (waiting for the server is not counted), each way:

* ``executemany``: ``conn.execute(insert(table), rows)`` (what dbworker did before
  ``Dialect.insert_rows``; psycopg sends a statement per row, in a pipeline);
* ``insert_rows``: ``Dialect.insert_rows``, one multi-row ``INSERT ... VALUES`` on the
  driver's cursor;

on a synchronous connection (the threads executor's endings) and through an
``AsyncConnection``'s ``run_sync`` (the asyncio executor's). Reported in microseconds
of CPU per batch (median of ``--repeat`` rounds, round-robin), and ``insert_rows`` over
``executemany``. Results go to ``benchmarks/results/batch_insert.json``.

Run: ``python -m benchmarks.batch_insert --repeat 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from dbworker.dialects import Dialect, for_url
from dbworker.invocation.async_runtime import async_url

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    write_report,
)

WAYS = ("executemany", "insert_rows")
META = sa.MetaData()
DONE = sa.Table(
    "bench_batch_done",
    META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("call_id", sa.Integer, nullable=False),
)


def _batch(dialect: Dialect, way: str, rows: list[dict[str, Any]]) -> Callable[[Any], None]:
    statement = sa.insert(DONE)

    def write(conn: sa.Connection) -> None:
        conn.begin()
        if way == "executemany":
            conn.execute(statement, rows)
        else:
            dialect.insert_rows(conn, statement, rows)
        conn.commit()

    return write


def _sync(url: str, way: str, rows: list[dict[str, Any]], batches: int) -> float:
    engine = sa.create_engine(url)
    write = _batch(for_url(url), way, rows)
    try:
        with engine.connect() as conn:
            write(conn)  # warm: statements compiled, the connection's caches filled
            started = time.thread_time()
            for _ in range(batches):
                write(conn)
            return time.thread_time() - started
    finally:
        engine.dispose()


async def _async(url: str, way: str, rows: list[dict[str, Any]], batches: int) -> float:
    engine = create_async_engine(async_url(url))
    write = _batch(for_url(url), way, rows)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(write)
            started = time.thread_time()
            for _ in range(batches):
                await conn.run_sync(write)
            return time.thread_time() - started
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialects_argument(parser)
    parser.add_argument("--rows", type=lambda s: [int(n) for n in s.split(",")], default=[16])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "batch_insert.json")
    args = parser.parse_args(argv)
    report = new_report("batch_insert", argv)
    report["config"] = {"rows": args.rows, "batches": args.batches, "repeat": args.repeat}
    results: dict[str, Any] = {}
    for backend in args.dialects:
        with scratch_database(backend, "batch_insert") as url:
            META.create_all(sa.create_engine(url))
            for count in args.rows:
                rows = [{"call_id": i} for i in range(count)]
                runs: dict[str, list[float]] = {}
                for round_ in range(args.repeat):
                    for mode in ("sync", "async"):
                        for way in WAYS:  # round-robin: the machine's noise spreads over all
                            if mode == "sync":
                                seconds = _sync(url, way, rows, args.batches)
                            else:
                                seconds = asyncio.run(_async(url, way, rows, args.batches))
                            per_batch = round(seconds / args.batches * 1e6, 1)
                            runs.setdefault(f"{mode}/{way}", []).append(per_batch)
                    log(f"{backend} {count} rows, round {round_ + 1}: {runs}")
                medians = {name: statistics.median(values) for name, values in runs.items()}
                results[f"{backend}/{count}"] = {
                    "cpu_us_per_batch": medians,
                    "insert_rows_vs_executemany": {
                        mode: round(
                            medians[f"{mode}/insert_rows"] / medians[f"{mode}/executemany"], 2
                        )
                        for mode in ("sync", "async")
                    },
                    "runs": runs,
                }
    report["results"] = results
    write_report(args.output, report)
    for name, result in results.items():
        print(name, result["cpu_us_per_batch"], result["insert_rows_vs_executemany"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
