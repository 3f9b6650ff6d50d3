"""What one trivial statement costs the client, by the way it is sent (issue 25: where
an ``async def`` handler's time goes).

``SELECT 1``, ``--statements`` times in a row in one transaction on one connection,
timed with this process's CPU clock (``time.process_time``: waiting for the server is
not counted) through:

* ``sqlalchemy_async``: an ``AsyncConnection`` (what an ``async def`` handler's
  ``AsyncSession`` and dbworker's statements around it go through on the event loop);
* ``driver_async``: the asyncio driver's own connection (psycopg's ``AsyncConnection``,
  aiosqlite, aiomysql);
* ``sqlalchemy_sync``: a synchronous SQLAlchemy ``Connection`` (the threads and
  process executors);
* ``driver_sync``: the synchronous driver's own cursor.

Each is reported in microseconds of CPU per statement (median of ``--repeat``), and
as a ratio to ``driver_async``. Results go to ``benchmarks/results/statement_cost.json``.

Run: ``python -m benchmarks.statement_cost --repeat 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from dbworker.invocation.async_runtime import async_url

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    write_report,
)

WAYS = ("sqlalchemy_async", "driver_async", "sqlalchemy_sync", "driver_sync")
SQL = "SELECT 1"


async def _sqlalchemy_async(url: str, count: int) -> float:
    engine = create_async_engine(async_url(url))
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql(SQL)
            started = time.process_time()
            for _ in range(count):
                await conn.exec_driver_sql(SQL)
            return time.process_time() - started
    finally:
        await engine.dispose()


async def _driver_async(url: str, count: int) -> float:
    engine = create_async_engine(async_url(url))
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            cursor = driver.cursor()
            if inspect.isawaitable(cursor):  # aiosqlite's and aiomysql's; psycopg's is not
                cursor = await cursor
            await cursor.execute(SQL)
            await cursor.fetchall()
            started = time.process_time()
            for _ in range(count):
                await cursor.execute(SQL)
                await cursor.fetchall()
            elapsed = time.process_time() - started
            await cursor.close()
            return elapsed
    finally:
        await engine.dispose()


def _sqlalchemy_sync(url: str, count: int) -> float:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(SQL)
            started = time.process_time()
            for _ in range(count):
                conn.exec_driver_sql(SQL)
            return time.process_time() - started
    finally:
        engine.dispose()


def _driver_sync(url: str, count: int) -> float:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cursor.execute(SQL)
            cursor.fetchall()
            started = time.process_time()
            for _ in range(count):
                cursor.execute(SQL)
                cursor.fetchall()
            return time.process_time() - started
    finally:
        engine.dispose()


def measure(url: str, way: str, count: int) -> float:
    """Microseconds of this process's CPU per statement."""
    if way == "sqlalchemy_async":
        seconds = asyncio.run(_sqlalchemy_async(url, count))
    elif way == "driver_async":
        seconds = asyncio.run(_driver_async(url, count))
    elif way == "sqlalchemy_sync":
        seconds = _sqlalchemy_sync(url, count)
    else:
        seconds = _driver_sync(url, count)
    return seconds / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialects_argument(parser)
    parser.add_argument("--statements", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "statement_cost.json")
    args = parser.parse_args(argv)
    report = new_report("statement_cost", argv)
    report["config"] = {"statements": args.statements, "repeat": args.repeat, "sql": SQL}
    results: dict[str, Any] = {}
    for backend in args.dialects:
        with scratch_database(backend, "statement_cost") as url:
            runs: dict[str, list[float]] = {way: [] for way in WAYS}
            for round_ in range(args.repeat):
                for way in WAYS:  # round-robin: the machine's noise spreads over all
                    runs[way].append(round(measure(url, way, args.statements), 1))
                log(f"{backend} round {round_ + 1}: " + str({w: r[-1] for w, r in runs.items()}))
        medians = {way: statistics.median(values) for way, values in runs.items()}
        results[backend] = {
            "cpu_us_per_statement": medians,
            "vs_driver_async": {
                way: round(value / medians["driver_async"], 2) for way, value in medians.items()
            },
            "runs": runs,
        }
    report["results"] = results
    write_report(args.output, report)
    print(f"{'database':<12} " + " ".join(f"{way:>17}" for way in WAYS))
    for backend, result in results.items():
        row = result["cpu_us_per_statement"]
        print(f"{backend:<12} " + " ".join(f"{row[way]:>17}" for way in WAYS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
