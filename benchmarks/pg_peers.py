"""The PostgreSQL-native queues dbworker is measured against: pgqueuer and procrastinate.

Each runs the throughput benchmark's job (no-op units of work, two worker processes) in
a scratch database of its own:

* ``pgqueuer``: two ``QueueManager`` processes over asyncpg (its fastest driver), each
  dequeueing ``batch_size=10`` (the library's default, and how its own benchmark runs),
  with an ``async def`` entrypoint that does nothing. The clock starts before one
  ``enqueue`` call inserts every job and stops when the queue table is empty: pgqueuer
  deletes a job once it has run (completions are buffered and flushed together).
* ``procrastinate``: two ``run_worker`` processes (concurrency 1 each: its guidance for
  synchronous tasks) with a ``def`` task that does nothing; the clock stops when every
  job is ``succeeded``.

Both are at-least-once queues whose completion is an acknowledgement apart from any
writes of the job: dbworker commits a handler's writes and its record together.

Each worker process runs ``benchmarks.pg_peers.main([peer])``, reading the database URL
from stdin (never the command line); ``run_peer`` is what ``benchmarks.throughput``
calls.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from typing import Any

from ._common import TreeMemory, scratch_database, tree_cpu_seconds

PEERS = ("pgqueuer", "procrastinate")
_WORKER = "import sys; from benchmarks.pg_peers import main; sys.exit(main(sys.argv[1:]))"
PROCESSES = 2
PGQUEUER_BATCH = 10
ENTRYPOINT = "noop"
QUEUE = "bench_noop"


def _conninfo(url: str) -> str:
    """A libpq connection string from a SQLAlchemy URL (the peers take psycopg's)."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


# -- pgqueuer --------------------------------------------------------------------------


async def _pgqueuer_connection(conninfo: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)


async def _pgqueuer_install(conninfo: str) -> None:
    from pgqueuer import Queries

    conn = await _pgqueuer_connection(conninfo)
    try:
        await Queries.from_psycopg_connection(conn).install()
    finally:
        await conn.close()


async def _pgqueuer_enqueue(conninfo: str, count: int) -> None:
    from pgqueuer import Queries

    conn = await _pgqueuer_connection(conninfo)
    try:
        await Queries.from_psycopg_connection(conn).enqueue(
            [ENTRYPOINT] * count, [None] * count, [0] * count
        )
    finally:
        await conn.close()


async def _pgqueuer_worker(conninfo: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    # asyncpg, pgqueuer's own choice: 3,706 jobs/s here against 556-751 on psycopg's
    # async connection (one run each, 3,000 jobs).
    connection = await asyncpg.connect(conninfo)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))

    async def noop(job: Any) -> None:
        return None

    # Called, not applied as a decorator: without the bench extra the type checker sees
    # pgqueuer as untyped, and an untyped decorator would untype the function.
    manager.entrypoint(ENTRYPOINT)(noop)
    await manager.run(batch_size=PGQUEUER_BATCH)


def _pgqueuer_open(conninfo: str) -> int:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    return int(row[0]) if row else 0


# -- procrastinate ---------------------------------------------------------------------


def _procrastinate_app(conninfo: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    def noop() -> None:
        return None

    app.task(name=ENTRYPOINT, queue=QUEUE)(noop)  # called: see _pgqueuer_worker
    return app


def _procrastinate_install(conninfo: str) -> None:
    app = _procrastinate_app(conninfo)
    with app.open():
        app.schema_manager.apply_schema()


def _procrastinate_enqueue(conninfo: str, count: int) -> None:
    app = _procrastinate_app(conninfo)
    with app.open():
        app.tasks[ENTRYPOINT].batch_defer(*({} for _ in range(count)))


def _procrastinate_worker(conninfo: str) -> None:
    _procrastinate_app(conninfo).run_worker(
        queues=[QUEUE], concurrency=1, install_signal_handlers=True
    )


def _procrastinate_open(conninfo: str) -> int:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
        ).fetchone()
    return int(row[0]) if row else 0


# -- one measurement -------------------------------------------------------------------


def _install(peer: str, conninfo: str) -> None:
    if peer == "pgqueuer":
        asyncio.run(_pgqueuer_install(conninfo))
    else:
        _procrastinate_install(conninfo)


def _enqueue(peer: str, conninfo: str, count: int) -> None:
    if peer == "pgqueuer":
        asyncio.run(_pgqueuer_enqueue(conninfo, count))
    else:
        _procrastinate_enqueue(conninfo, count)


def _open_jobs(peer: str, conninfo: str) -> int:
    return _pgqueuer_open(conninfo) if peer == "pgqueuer" else _procrastinate_open(conninfo)


def _wait_done(peer: str, conninfo: str, poll: float, deadline: float) -> float:
    while True:
        if _open_jobs(peer, conninfo) == 0:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{peer}'s jobs did not drain")
        time.sleep(poll)


def _version(peer: str) -> str:
    from importlib.metadata import version

    return f"{peer} {version(peer)}"


def run_peer(
    peer: str, items: int, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """One timed run of ``peer``: ``items`` no-op jobs through two worker processes."""
    poll = args.poll_ms / 1000
    with scratch_database("postgresql", f"peer_{peer}") as url:
        conninfo = _conninfo(url)
        _install(peer, conninfo)
        workers = [
            subprocess.Popen(
                # Not ``-m``: procrastinate warns of an app made in the main module.
                [sys.executable, "-c", _WORKER, peer],
                stdin=subprocess.PIPE,
                env=env,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        memory = TreeMemory([w.pid for w in workers], args.rss_interval_ms / 1000).start()
        try:
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write(conninfo + "\n")
                worker.stdin.close()
            _enqueue(peer, conninfo, args.warmup)
            _wait_done(peer, conninfo, poll, time.monotonic() + args.timeout)
            cpu = tree_cpu_seconds([w.pid for w in workers])
            start = time.perf_counter()
            _enqueue(peer, conninfo, items)
            end = _wait_done(peer, conninfo, poll, time.monotonic() + args.timeout)
            cpu = tree_cpu_seconds([w.pid for w in workers]) - cpu
            memory_report = memory.stop()
        finally:
            memory.stop()
            for worker in workers:
                worker.terminate()
            for worker in workers:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
    seconds = end - start
    return {
        "system": peer,
        "server": _version(peer),
        "items": items,
        "processes": PROCESSES,
        "seconds": round(seconds, 3),
        "items_per_second": round(items / seconds, 1),
        "cpu_ms_per_item": round(cpu * 1000 / items, 4),
        "memory": memory_report,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_peers")
    parser.add_argument("peer", choices=PEERS)
    args = parser.parse_args(argv)
    conninfo = sys.stdin.readline().strip()
    if args.peer == "pgqueuer":
        asyncio.run(_pgqueuer_worker(conninfo))  # until the benchmark terminates it
    else:
        _procrastinate_worker(conninfo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
