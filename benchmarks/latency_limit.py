"""The limit of pickup latency: a hand-written runner with dbworker's contract
(``benchmarks.latency``, beside dbworker and Celery in the same run).

How soon could anything that keeps dbworker's contract start a handler after the
application's commit? The contract fixes the path: the work is a row of the
application's table; an execution record is added for it (discovery); a claim gives
the record a new fencing token and a lease, and commits, before the handler runs (a
claim lost in a server crash would hand the same token out again, and a handler that
kills its process would go uncounted); the handler runs in a process apart from the
one that claims (a handler that kills its process must not take the claims of the
others with it), loads its row and finishes under its token.

This runner does exactly that and nothing more, on the driver (psycopg 3, MySQLdb,
sqlite3), with no dbworker code and no SQLAlchemy in its processes, with
``benchmarks.limit``'s claim and finish statements. A claiming process waits for a
wake-up (PostgreSQL: LISTEN, woken by a statement-level NOTIFY trigger on the source
table, as dbworker's opt-in trigger; SQLite and MariaDB: a datagram that the
application sends once its commit returns, as dbworker's application side does), and
also polls every 0.25 s; then, in one transaction, it adds the pending records of the
rows above its watermark, claims up to 2 records and commits; it sends each claim
(key, token) down a pipe to a handler process, which notes its start once its row is
loaded, finishes the record under the token and commits.

``measure_pickup_limit(backend, gaps, args)`` is what ``benchmarks.latency`` calls: the
application commits one row per gap, as for dbworker, and pickup is the handler's start
minus the moment the commit returned.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import select
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ._common import append_line, scratch_database
from .limit import (
    ITEMS,
    NOW,
    PARAM,
    RUNNERS,
    TABLE,
    WORKER,
    Runner,
    RunnerSpec,
    driver_arguments,
)

#: The claimer's poll when no wake-up comes (dbworker's default ``poll_seconds``).
POLL_SECONDS = 0.25
#: Claims per transaction (the benchmark's workers run at ``concurrency=2``).
CLAIM_BATCH = 2
CHANNEL = "bench_limit_wake"
#: Rows discovered per transaction at most (dbworker's discovery reads batches too).
DISCOVERY_BATCH = 100


def discovery_sql(backend: str) -> str:
    """The pending records of source rows above the watermark (parameter), returning
    their keys; each database's way of skipping a record that exists already."""
    now, p = NOW[backend], PARAM[backend]
    columns = "source_id, status, token, attempts, failures, crashes, discovered_at, updated_at"
    select_new = (
        f"SELECT id, 'pending', 0, 0, 0, 0, {now}, {now} FROM {ITEMS}"
        f" WHERE id > {p} ORDER BY id LIMIT {DISCOVERY_BATCH}"
    )
    if backend == "postgresql":
        return (
            f"INSERT INTO {TABLE} ({columns}) {select_new}"
            " ON CONFLICT DO NOTHING RETURNING source_id"
        )
    ignore = "INSERT IGNORE" if backend == "mysql" else "INSERT OR IGNORE"
    return f"{ignore} INTO {TABLE} ({columns}) {select_new} RETURNING source_id"


# -- the runner's processes -----------------------------------------------------------------


def _waiter(backend: str, connect: dict[str, Any], wake_path: str) -> Callable[[float], None]:
    """A function that returns on a wake-up or after its timeout."""
    if backend == "postgresql":
        import psycopg

        listening = psycopg.connect(**connect, autocommit=True)
        listening.execute(f"LISTEN {CHANNEL}")

        def wait_notified(timeout: float) -> None:
            for _ in listening.notifies(timeout=timeout, stop_after=1):
                pass

        return wait_notified
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(wake_path)

    def wait_datagram(timeout: float) -> None:
        if select.select([sock], [], [], timeout)[0]:
            with contextlib.suppress(BlockingIOError):
                while sock.recv(64, socket.MSG_DONTWAIT):
                    pass

    return wait_datagram


def _discover_and_claim(runner: Runner, discover: str, watermark: int) -> tuple[int, list[Any]]:
    """One transaction: new rows' records added, up to CLAIM_BATCH claimed, COMMIT."""
    cur = runner.cur
    if runner.spec.backend == "sqlite":
        # Every transaction that writes takes SQLite's write lock up front (BEGIN
        # IMMEDIATE), as dbworker's and benchmarks.limit's do.
        cur.execute("BEGIN IMMEDIATE")
        cur.execute(discover, (watermark,))
        found = [row[0] for row in cur.fetchall()]
        cur.execute(runner.claim_sql, (30.0, *runner.owner))  # type: ignore[attr-defined]
        claimed = sorted((row[0], row[1]) for row in cur.fetchall())
        cur.execute("COMMIT")
    else:
        # The claim's statements run in the transaction the discovery began, and commit.
        cur.execute(discover, (watermark,))
        found = [row[0] for row in cur.fetchall()]
        claimed = runner.claim()
    return max(found, default=watermark), claimed


def claimer_main(
    spec: RunnerSpec, wake_path: str, handler: Connection, control: Connection
) -> None:
    """The claiming process: wait, discover and claim, hand each claim to the handler."""
    try:
        runner = RUNNERS[spec.backend](spec)
        wait = _waiter(spec.backend, spec.connect, wake_path)
        discover = discovery_sql(spec.backend)
        watermark = 0
        control.send(("ready", None))
        while not control.poll():
            wait(POLL_SECONDS)
            while True:
                watermark, claimed = _discover_and_claim(runner, discover, watermark)
                for claim in claimed:
                    handler.send(claim)
                if len(claimed) < spec.batch:
                    break
        handler.send(None)
        runner.close()
    except BaseException:
        control.send(("error", traceback.format_exc()))
        raise


def handler_main(spec: RunnerSpec, notes: str, claims: Connection, control: Connection) -> None:
    """The handler process: each claim's row loaded, its start noted, finished, committed."""
    try:
        runner = RUNNERS[spec.backend](spec)
        cur = runner.cur
        control.send(("ready", None))
        while (claim := claims.recv()) is not None:
            source_id, token = claim
            if spec.backend == "sqlite":
                cur.execute("BEGIN IMMEDIATE")
            cur.execute(runner.load, (source_id,))
            cur.fetchone()
            append_line(notes, f"{source_id} start {time.time():.6f}\n")
            cur.execute(runner.finish, (source_id, token))
            if cur.rowcount != 1:
                raise RuntimeError(f"the claim of {source_id} (token {token}) was lost")
            if spec.backend == "sqlite":
                cur.execute("COMMIT")
            else:
                runner.conn.commit()
        loaded = sorted(name for name in ("dbworker", "sqlalchemy") if name in sys.modules)
        control.send(("done", loaded))
        runner.close()
    except BaseException:
        control.send(("error", traceback.format_exc()))
        raise


# -- the application (the benchmark's process) ----------------------------------------------


def _create_tables(backend: str, url: str) -> None:
    """The source table and dbworker's DDL for the execution table; on PostgreSQL the
    NOTIFY trigger."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    from dbworker.schema import execution_table

    from .noop_work import ITEMS_TABLE

    metadata = sa.MetaData()
    ITEMS_TABLE.to_metadata(metadata)
    execution_table(WORKER, sa.Integer(), metadata)
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        if backend == "sqlite":
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        metadata.create_all(engine)
        if backend == "postgresql":
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "CREATE FUNCTION bench_limit_notify() RETURNS trigger LANGUAGE plpgsql"
                    f" AS $$ BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$"
                )
                conn.exec_driver_sql(
                    f"CREATE TRIGGER bench_limit_notify AFTER INSERT ON {ITEMS}"
                    " FOR EACH STATEMENT EXECUTE FUNCTION bench_limit_notify()"
                )
    finally:
        engine.dispose()


class _Application:
    """The application's connection: one row per transaction, then a wake-up datagram
    where the database has no NOTIFY."""

    def __init__(self, spec: RunnerSpec, wake_path: str) -> None:
        self.backend = spec.backend
        self.wake_path = wake_path
        # The runners' own connection (on SQLite one without an implicit BEGIN: each
        # INSERT is its own transaction).
        self.conn = RUNNERS[spec.backend](spec).conn
        self.insert = f"INSERT INTO {ITEMS} (id) VALUES ({PARAM[spec.backend]})"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def commit_row(self, item_id: int) -> float:
        """Commit one row; the moment the commit returned."""
        self.conn.cursor().execute(self.insert, (item_id,))
        self.conn.commit()
        committed = time.time()
        if self.backend != "postgresql":
            with contextlib.suppress(OSError):
                self.sock.sendto(b"*", self.wake_path)
        return committed

    def close(self) -> None:
        self.sock.close()
        self.conn.close()


def _expect(pipes: Sequence[Connection], kind: str, timeout: float) -> list[Any]:
    found = []
    for pipe in pipes:
        if not pipe.poll(timeout):
            raise TimeoutError(f"no {kind!r} from a pickup-limit process within {timeout} s")
        what, payload = pipe.recv()
        if what != kind:
            raise RuntimeError(f"a pickup-limit process sent {what!r}: {payload}")
        found.append(payload)
    return found


def _started(notes: Path, wanted: int, timeout: float) -> dict[int, float]:
    """Each row's handler start, once ``wanted`` rows have one."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            starts: dict[int, float] = {}
            for line in notes.read_text().splitlines():
                item, _, at = line.split()
                starts.setdefault(int(item), float(at))
            if len(starts) >= wanted:
                return starts
        if time.monotonic() > deadline:
            raise TimeoutError(f"pickup limit: fewer than {wanted} handler starts")
        time.sleep(0.005)


def measure_pickup_limit(
    backend: str, gaps: Sequence[float], args: argparse.Namespace
) -> tuple[dict[int, float], dict[int, float]]:
    """The runner on a scratch database: (commit returned, handler started) by row."""
    context = multiprocessing.get_context("spawn")
    with (
        scratch_database(backend, "latency_limit") as url,
        tempfile.TemporaryDirectory(prefix="dbw_latency_limit_") as scratch,
    ):
        _create_tables(backend, url)
        spec = RunnerSpec(backend, driver_arguments(backend, url), CLAIM_BATCH)
        wake_path, notes = str(Path(scratch) / "wake.sock"), Path(scratch) / "notes"
        claims_out, claims_in = context.Pipe()
        ours_c, theirs_c = context.Pipe()
        ours_h, theirs_h = context.Pipe()
        claimer = context.Process(
            target=claimer_main, args=(spec, wake_path, claims_out, theirs_c), daemon=True
        )
        handler = context.Process(
            target=handler_main, args=(spec, str(notes), claims_in, theirs_h), daemon=True
        )
        application = None
        try:
            claimer.start()
            handler.start()
            _expect([ours_c, ours_h], "ready", args.timeout)
            application = _Application(spec, wake_path)
            for item_id in range(1, args.warmup + 1):
                application.commit_row(item_id)
                _started(notes, item_id, args.timeout)
            committed: dict[int, float] = {}
            for n, gap in enumerate(gaps):
                time.sleep(gap)
                item_id = args.warmup + 1 + n
                committed[item_id] = application.commit_row(item_id)
            started = _started(notes, args.warmup + len(gaps), args.timeout + 30)
            ours_c.send("stop")  # seen within a poll
            loaded = _expect([ours_h], "done", args.timeout)[0]
            if loaded:
                raise RuntimeError(f"the pickup limit's handler imported {loaded}")
        finally:
            if application is not None:
                application.close()
            for process in (claimer, handler):
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join()
    return committed, {item: started[item] for item in committed}
