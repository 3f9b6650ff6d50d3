"""Claim latency as a worker's finished history grows.

A worker's execution table keeps one FINISHED record per source row forever, so a
claim whose cost grows with history slows every deployment down over time. For each
database, one scratch database holds one source table and one worker per history size
(e.g. 1k, 100k and 1M FINISHED rows, loaded straight into both tables), each with the
same small set of open work above its history (new eligible rows, discovered). Then:

* single claim transactions (``dialect.claim`` inside ``engine.begin()``), limit 1 and
  limit 4. Each claimed record is finished and reset to PENDING in a separate, untimed
  transaction, so every sample sees the same open work. ``claim_limit_N`` is the whole
  transaction (BEGIN to COMMIT, as the scheduler runs it); ``claim_limit_N_sql`` only
  the claim's statements, without the commit's log flush, which on a shared machine is
  most of the time and most of the noise;
* one discovery round that finds the open rows, idle discovery rounds, and the sweeps
  the scheduler runs (recent keys every few seconds, all keys rarely).

Samples are taken round-robin over the sizes, so load from other processes on the
machine hits every size alike and the ratios between sizes stay meaningful.

Each database is measured in passes that differ only in planner statistics:

* ``none``: never collected for the measured tables (PostgreSQL autovacuum and InnoDB
  stats auto-recalc turned off for them, no ANALYZE);
* ``stale``: collected while the whole history was still open work (a backlog that
  has since been processed): history is loaded PENDING, analyzed, then set FINISHED
  without analyzing again (PostgreSQL: a plain VACUUM afterwards, so dead index
  entries do not count against the claim; column statistics stay stale);
* ``analyzed``: ANALYZE after loading.

Users do not run ANALYZE after each insert, so a claim plan must be good in all three.
``--open`` sets how much open work there is; a large value measures a backlog.

Run: ``python -m benchmarks.claim_history --help``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Boolean, Integer, MetaData, String, event, select, update
from sqlalchemy.orm import registry

from dbworker.core.status import Phase
from dbworker.dialects import Dialect, Owner, WorkerTable
from dbworker.dialects.registry import for_url
from dbworker.schema import execution_table

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    csv,
    log,
    new_report,
    scratch_database,
    server_version,
    summarize,
    write_report,
)

#: Open work lives far above any history key, so history can grow beneath it.
OPEN_BASE = 100_000_000
#: Keys of the sequence table the non-PostgreSQL loaders cross-join with itself.
SEQ_SIZE = 10_000
#: Rows per INSERT ... SELECT while loading history.
LOAD_CHUNK = 200_000
LEASE_SECONDS = 300.0
STATS_MODES = ("none", "stale", "analyzed")
ELIGIBLE = "select(Item).where(Item.enabled.is_(True)).order_by(Item.id)"


class Item:
    """A source row. Mapped once per history size, each time to its own table."""

    id: int
    enabled: bool
    payload: str | None


@dataclass(frozen=True)
class Setup:
    """One history size: its source model, execution table and worker."""

    size: int
    model: type[Any]
    worker: WorkerTable

    @property
    def source(self) -> sa.Table:
        return self.model.__table__  # type: ignore[no-any-return]

    @property
    def exec_table(self) -> sa.Table:
        return self.worker.table

    def eligible(self) -> sa.Select[Any]:
        model = self.model
        return select(model).where(model.enabled.is_(True)).order_by(model.id)


def make_setup(size: int) -> Setup:
    metadata = MetaData()
    source = sa.Table(
        f"bench_item_{size}",
        metadata,
        sa.Column("id", Integer, primary_key=True, autoincrement=False),
        sa.Column("enabled", Boolean, nullable=False),
        sa.Column("payload", String(64)),
    )
    model = type(f"Item{size}", (Item,), {})
    registry(metadata=metadata).map_imperatively(model, source)
    model.__table__ = source  # type: ignore[attr-defined]
    name = f"bench_{size}"
    table = execution_table(name, Integer(), metadata)
    return Setup(size, model, WorkerTable(name, table, source.c.id, monotonic_keys=True))


def parse_size(text: str) -> int:
    text = text.strip().lower()
    for suffix, factor in (("k", 1_000), ("m", 1_000_000)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * factor)
    return int(text)


# -- loading ---------------------------------------------------------------------------

_EXEC_COLUMNS = (
    "source_id, status, token, attempts, failures, crashes, owner_host, owner_pid, "
    "discovered_at, claimed_at, finished_at, updated_at"
)


def _exec_values(key: str, status: Phase) -> str:
    return f"{key}, '{status.value}', 1, 1, 0, 0, 'bench', 1, :t, :t, :t, :t"


def load_history(engine: sa.Engine, setup: Setup, status: Phase = Phase.FINISHED) -> None:
    """Insert source rows ``1..size`` and an execution record in ``status`` for each."""
    load_rows(engine, setup, 1, setup.size, status)


def load_rows(engine: sa.Engine, setup: Setup, first: int, count: int, status: Phase) -> None:
    """Insert source rows ``first..first+count-1`` and an execution record in ``status``
    for each."""
    now = time.time()
    item, exec_ = setup.source.name, setup.exec_table.name
    if engine.dialect.name == "postgresql":
        series = "generate_series(CAST(:a AS integer), CAST(:b AS integer)) g"
        bounds = {"a": first, "b": first + count - 1}
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {item} (id, enabled, payload) "
                    f"SELECT g, true, 'payload' FROM {series}"
                ),
                bounds,
            )
            conn.execute(
                sa.text(
                    f"INSERT INTO {exec_} ({_EXEC_COLUMNS}) SELECT {_exec_values('g', status)} "
                    f"FROM {series}"
                ),
                {**bounds, "t": now},
            )
        return
    # Elsewhere a sequence table cross-joined with itself, in chunks so that one
    # transaction's undo log stays bounded.
    key = f"(:a + s1.n * {SEQ_SIZE} + s2.n)"
    rows = (
        "FROM bench_seq s1 CROSS JOIN bench_seq s2 "
        f"WHERE s1.n * {SEQ_SIZE} + s2.n < :count AND s1.n <= :hi"
    )
    start, end = first, first + count
    while start < end:
        chunk = min(LOAD_CHUNK, end - start)
        params = {"a": start, "count": chunk, "hi": chunk // SEQ_SIZE, "t": now}
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {item} (id, enabled, payload) SELECT {key}, 1, 'payload' {rows}"
                ),
                params,
            )
            conn.execute(
                sa.text(
                    f"INSERT INTO {exec_} ({_EXEC_COLUMNS}) "
                    f"SELECT {_exec_values(key, status)} {rows}"
                ),
                params,
            )
        start += chunk


def create_schema(engine: sa.Engine, setups: list[Setup], stats: str) -> None:
    backend = engine.dialect.name
    for setup in setups:
        setup.source.metadata.create_all(engine)
    with engine.begin() as conn:
        if backend != "postgresql":
            conn.exec_driver_sql("CREATE TABLE bench_seq (n INTEGER PRIMARY KEY)")
            conn.execute(
                sa.text("INSERT INTO bench_seq (n) VALUES (:n)"),
                [{"n": n} for n in range(SEQ_SIZE)],
            )
        if stats == "analyzed":
            return
        # No statistics are ever collected for the measured tables: a deployment that
        # never ran ANALYZE, or ran it when the tables were small.
        for setup in setups:
            for name in (setup.source.name, setup.exec_table.name):
                if backend == "postgresql":
                    conn.exec_driver_sql(
                        f"ALTER TABLE {name} SET (autovacuum_enabled = false, "
                        "toast.autovacuum_enabled = false)"
                    )
                elif backend == "mysql":
                    conn.exec_driver_sql(f"ALTER TABLE {name} STATS_AUTO_RECALC = 0")


def analyze(engine: sa.Engine, setups: list[Setup]) -> None:
    backend = engine.dialect.name
    with engine.begin() as conn:
        if backend == "sqlite":
            conn.exec_driver_sql("ANALYZE")
            return
        for setup in setups:
            for name in (setup.source.name, setup.exec_table.name):
                if backend == "postgresql":
                    conn.exec_driver_sql(f"ANALYZE {name}")
                else:
                    conn.exec_driver_sql(f"ANALYZE TABLE {name}").all()


def finish_history(engine: sa.Engine, setups: list[Setup]) -> None:
    """The backlog was processed after the statistics were taken."""
    for setup in setups:
        table = setup.exec_table
        with engine.begin() as conn:
            conn.execute(update(table).values(status=Phase.FINISHED.value))
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for setup in setups:
                conn.exec_driver_sql(f"VACUUM {setup.exec_table.name}")


def add_open_work(engine: sa.Engine, setup: Setup, open_rows: int) -> None:
    """``open_rows`` new eligible source rows above the history, not yet discovered."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(setup.source),
            [
                {"id": OPEN_BASE + k, "enabled": True, "payload": "open"}
                for k in range(1, open_rows + 1)
            ],
        )


# -- measuring -------------------------------------------------------------------------


def timed(engine: sa.Engine, step: Callable[[sa.Connection], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    with engine.begin() as conn:
        value = step(conn)
    return time.perf_counter() - start, value


def claim_once(
    engine: sa.Engine, dialect: Dialect, setup: Setup, limit: int, owner: Owner
) -> tuple[float, float]:
    """One claim transaction: (whole transaction, claim statements) in seconds."""
    query = setup.eligible()
    start = time.perf_counter()
    with engine.begin() as conn:
        statements_start = time.perf_counter()
        claims = dialect.claim(conn, setup.worker, query, limit, LEASE_SECONDS, owner)
        statements = time.perf_counter() - statements_start
    total = time.perf_counter() - start
    if len(claims) != limit:
        raise RuntimeError(f"claimed {len(claims)} records from {setup.size}, expected {limit}")
    table = setup.exec_table
    with engine.begin() as conn:
        for claim in claims:
            if not dialect.finish(conn, setup.worker, claim.source_id, claim.token):
                raise RuntimeError(f"lost the claim on {claim.source_id}")
        # Back to PENDING, so every sample sees the same open work.
        conn.execute(
            update(table)
            .where(table.c.source_id.in_([c.source_id for c in claims]))
            .values(status=Phase.PENDING.value, finished_at=None, owner_host=None)
        )
    return total, statements


def measure_claims(
    engine: sa.Engine, dialect: Dialect, setups: list[Setup], limit: int, args: argparse.Namespace
) -> dict[int, dict[str, Any]]:
    owner = Owner.current()
    totals: dict[int, list[float]] = {s.size: [] for s in setups}
    sql: dict[int, list[float]] = {s.size: [] for s in setups}
    start = time.monotonic()
    deadline = start + args.max_seconds
    # A slow plan cuts the warm-up short too, so that it still gets measured.
    warmup_deadline = start + args.max_seconds / 10
    warmups, taken = 0, 0
    while taken < args.samples:
        warm = warmups >= args.warmup
        for setup in setups:
            total, statements = claim_once(engine, dialect, setup, limit, owner)
            if warm:
                totals[setup.size].append(total)
                sql[setup.size].append(statements)
        if not warm:
            warmups += 1
            if time.monotonic() > warmup_deadline:
                warmups = args.warmup
        else:
            taken += 1
            if time.monotonic() > deadline:
                break
    out = {}
    for setup in setups:
        whole = summarize(totals[setup.size])
        whole["truncated"] = whole["n"] < args.samples
        out[setup.size] = {
            f"claim_limit_{limit}": whole,
            f"claim_limit_{limit}_sql": summarize(sql[setup.size]),
        }
    return out


@contextmanager
def capture_statements(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def explain_claim(engine: sa.Engine, dialect: Dialect, setup: Setup, limit: int) -> dict[str, Any]:
    """The plans (with actual row counts where the database reports them) of every
    statement a claim runs, replayed in order in one transaction that is rolled back
    (EXPLAIN ANALYZE runs what it explains, so each statement sees what the claim's
    earlier ones did). On PostgreSQL ``buffers`` is the shared buffers they read in all."""
    with capture_statements(engine) as seen, engine.connect() as conn:
        trans = conn.begin()
        dialect.claim(conn, setup.worker, setup.eligible(), limit, LEASE_SECONDS, Owner.current())
        trans.rollback()
    statements = [
        (s, p) for s, p in seen if s.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE"))
    ]
    backend = engine.dialect.name
    if backend == "postgresql":
        prefix = "EXPLAIN (ANALYZE, BUFFERS) "
    elif backend == "mysql":
        prefix = "ANALYZE " if getattr(engine.dialect, "is_mariadb", False) else "EXPLAIN ANALYZE "
    else:
        prefix = "EXPLAIN QUERY PLAN "
    explained: list[dict[str, Any]] = []
    buffers = 0
    with engine.connect() as conn:
        trans = conn.begin()
        for statement, parameters in statements:
            result = conn.exec_driver_sql(prefix + statement, parameters)
            keys = list(result.keys())
            rows = [dict(zip(keys, row, strict=True)) for row in result.all()]
            plan: list[Any]
            if backend == "sqlite":
                plan = [f"{r['id']}<{r['parent']}: {r['detail']}" for r in rows]
            elif len(keys) == 1:
                plan = [str(next(iter(r.values()))) for r in rows]
            else:
                plan = [
                    {k: (v if isinstance(v, int | float | None) else str(v)) for k, v in r.items()}
                    for r in rows
                ]
            if backend == "postgresql":
                # The first Buffers line is the top node's, which counts its children.
                top = next((line for line in plan if "Buffers: shared" in line), "")
                buffers += sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
            explained.append({"statement": statement, "plan": plan})
        trans.rollback()
    out: dict[str, Any] = {"statements": explained}
    if backend == "postgresql":
        out["buffers"] = buffers
    return out


def measure(
    engine: sa.Engine, dialect: Dialect, setups: list[Setup], args: argparse.Namespace
) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {s.size: {} for s in setups}

    def discover(setup: Setup, conn: sa.Connection) -> int:
        return dialect.discover(conn, setup.worker)

    def sweep_recent(setup: Setup, conn: sa.Connection) -> int:
        # The scheduler's periodic sweep of recently discovered keys: here the newest
        # 1000 history keys plus the open work.
        return dialect.sweep(conn, setup.worker, above=setup.size - 1000)

    def sweep_all(setup: Setup, conn: sa.Connection) -> int:
        return dialect.sweep(conn, setup.worker)

    for setup in setups:
        add_open_work(engine, setup, args.open)
        elapsed, found = timed(engine, functools.partial(discover, setup))
        total, rounds = found, 1
        while total < args.open and found:
            _, found = timed(engine, functools.partial(discover, setup))
            total, rounds = total + found, rounds + 1
        if total != args.open:
            raise RuntimeError(f"discovery found {total} rows, expected {args.open}")
        # The first round: at most one discovery batch, as the scheduler runs it.
        out[setup.size]["discover_new_ms"] = round(elapsed * 1000.0, 4)
        out[setup.size]["discover_rounds"] = rounds

    def series(key: str, step: Callable[[Setup, sa.Connection], int]) -> None:
        times: dict[int, list[float]] = {s.size: [] for s in setups}
        for _ in range(args.discover_samples):
            for setup in setups:
                elapsed, found = timed(engine, functools.partial(step, setup))
                if found:
                    raise RuntimeError(f"{key} found {found} new rows in {setup.size}")
                times[setup.size].append(elapsed)
        for setup in setups:
            out[setup.size][key] = summarize(times[setup.size])

    series("discover_idle", discover)
    series("sweep_recent", sweep_recent)
    for limit in args.limits:
        for size, figures in measure_claims(engine, dialect, setups, limit, args).items():
            out[size].update(figures)
    for setup in setups:
        elapsed, _ = timed(engine, functools.partial(sweep_all, setup))
        out[setup.size]["sweep_full_ms"] = round(elapsed * 1000.0, 4)
        if args.explain:
            out[setup.size]["explain"] = {
                f"limit_{limit}": explain_claim(engine, dialect, setup, limit)
                for limit in args.limits
            }
    return out


def run_pass(backend: str, stats: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    setups = [make_setup(size) for size in args.sizes]
    with scratch_database(backend, stats) as url:
        dialect = for_url(url)
        engine = sa.create_engine(url, **dialect.coordinator_engine_options())
        dialect.configure_engine(engine)
        try:
            result["server_version"] = server_version(engine)
            create_schema(engine, setups, stats)
            load: dict[int, float] = {}
            status = Phase.PENDING if stats == "stale" else Phase.FINISHED
            for setup in setups:
                start = time.perf_counter()
                load_history(engine, setup, status)
                load[setup.size] = round(time.perf_counter() - start, 2)
                log(
                    f"{backend}/{stats}: loaded {setup.size} {status.value} rows in "
                    f"{load[setup.size]:.1f}s"
                )
            if stats != "none":
                analyze(engine, setups)
            if stats == "stale":
                finish_history(engine, setups)
            figures = measure(engine, dialect, setups, args)
        finally:
            engine.dispose()
    for size in args.sizes:
        figures[size]["load_seconds"] = load[size]
        log(f"{backend}/{stats}/{size}: {brief(figures[size], args.limits)}")
    result["sizes"] = {str(size): figures[size] for size in args.sizes}
    result["ratios"] = {
        "of": f"p50({args.sizes[-1]}) / p50({args.sizes[0]})",
        **p50_ratios(
            figures[args.sizes[0]],
            figures[args.sizes[-1]],
            [*claim_keys(args.limits), "discover_idle", "sweep_recent"],
        ),
    }
    return result


def claim_keys(limits: Sequence[int]) -> list[str]:
    """The claim series measured for each limit: the transaction, and its statements."""
    return [f"claim_limit_{n}{suffix}" for n in limits for suffix in ("", "_sql")]


def p50_ratios(
    smallest: dict[str, Any], largest: dict[str, Any], keys: Sequence[str]
) -> dict[str, float]:
    """p50 at the largest size over p50 at the smallest, per series."""
    return {
        f"{key}_p50": round(largest[key]["p50_ms"] / smallest[key]["p50_ms"], 3) for key in keys
    }


# -- during churn -----------------------------------------------------------------------


@dataclass
class Churn:
    """One backlog's moving parts: claims still WORKING, the next new source key."""

    in_flight: collections.deque[list[Any]]
    next_key: int
    processed: int = 0


def churn_step(
    engine: sa.Engine,
    dialect: Dialect,
    setup: Setup,
    state: Churn,
    limit: int,
    args: argparse.Namespace,
    owner: Owner,
) -> tuple[float, float]:
    """One timed claim (whole transaction, claim statements), then, untimed, what the
    rest of a deployment does meanwhile: the oldest claims still held finish (WORKING
    -> FINISHED) and as many new source rows arrive and are discovered (-> PENDING), so
    the backlog keeps its size while every record in it moves."""
    start = time.perf_counter()
    with engine.begin() as conn:
        statements_start = time.perf_counter()
        claims = dialect.claim(conn, setup.worker, setup.eligible(), limit, LEASE_SECONDS, owner)
        statements = time.perf_counter() - statements_start
    total = time.perf_counter() - start
    if len(claims) != limit:
        raise RuntimeError(f"claimed {len(claims)} records from backlog {setup.size}")
    state.in_flight.append(claims)
    with engine.begin() as conn:
        while len(state.in_flight) > args.in_flight:
            for claim in state.in_flight.popleft():
                if not dialect.finish(conn, setup.worker, claim.source_id, claim.token):
                    raise RuntimeError(f"lost the claim on {claim.source_id}")
                state.processed += 1
        conn.execute(
            sa.insert(setup.source),
            [
                {"id": key, "enabled": True, "payload": "new"}
                for key in range(state.next_key, state.next_key + limit)
            ],
        )
    state.next_key += limit
    with engine.begin() as conn:
        if dialect.discover(conn, setup.worker) != limit:
            raise RuntimeError(f"discovery missed new rows of backlog {setup.size}")
    return total, statements


def measure_churn(
    engine: sa.Engine, dialect: Dialect, setups: list[Setup], args: argparse.Namespace
) -> dict[int, dict[str, Any]]:
    owner = Owner.current()
    states = {s.size: Churn(collections.deque(), OPEN_BASE + s.size + 1) for s in setups}
    out: dict[int, dict[str, Any]] = {s.size: {} for s in setups}
    for limit in args.limits:
        totals: dict[int, list[float]] = {s.size: [] for s in setups}
        sql: dict[int, list[float]] = {s.size: [] for s in setups}
        start = time.monotonic()
        deadline = start + args.max_seconds
        warmup_deadline = start + args.max_seconds / 10
        warmups, taken = 0, 0
        while taken < args.samples:
            warm = warmups >= args.warmup
            for setup in setups:
                step = churn_step(engine, dialect, setup, states[setup.size], limit, args, owner)
                if warm:
                    totals[setup.size].append(step[0])
                    sql[setup.size].append(step[1])
            if not warm:
                warmups += 1
                if time.monotonic() > warmup_deadline:
                    warmups = args.warmup
            else:
                taken += 1
                if time.monotonic() > deadline:
                    break
        for setup in setups:
            series = sql[setup.size]
            third = max(1, len(series) // 3)
            whole = summarize(totals[setup.size])
            whole["truncated"] = whole["n"] < args.samples
            out[setup.size] |= {
                f"claim_limit_{limit}": whole,
                f"claim_limit_{limit}_sql": summarize(series),
                # Does a claim slow down as records pass through the table?
                f"claim_limit_{limit}_sql_first_third_p50_ms": summarize(series[:third])["p50_ms"],
                f"claim_limit_{limit}_sql_last_third_p50_ms": summarize(series[-third:])["p50_ms"],
            }
    for setup in setups:
        state = states[setup.size]
        with engine.connect() as conn:
            table = setup.exec_table
            counts: dict[str, int] = dict(
                conn.execute(select(table.c.status, sa.func.count()).group_by(table.c.status)).all()
            )
        out[setup.size] |= {
            "records_processed": state.processed,
            "records_working_at_end": sum(len(c) for c in state.in_flight),
            "statuses_at_end": counts,
        }
        if args.explain:
            out[setup.size]["explain"] = {
                f"limit_{limit}": explain_claim(engine, dialect, setup, limit)
                for limit in args.limits
            }
    return out


def run_churn_pass(backend: str, stats: str, args: argparse.Namespace) -> dict[str, Any]:
    """Backlogs of the sizes in ``args.backlogs`` (PENDING, above ``args.history``
    FINISHED records each), side by side, claimed round-robin during churn.

    ``stats``: ``none`` never collects statistics (autovacuum off for the tables);
    ``stale`` collects them before the backlog arrives, when no work was open (they
    then say open records are rare); ``analyzed`` after loading everything.
    """
    result: dict[str, Any] = {}
    setups = [make_setup(size) for size in args.backlogs]
    with scratch_database(backend, f"churn_{stats}") as url:
        dialect = for_url(url)
        engine = sa.create_engine(url, **dialect.coordinator_engine_options())
        dialect.configure_engine(engine)
        try:
            result["server_version"] = server_version(engine)
            create_schema(engine, setups, "analyzed" if stats == "analyzed" else "none")
            load: dict[int, float] = {}
            for setup in setups:
                started = time.perf_counter()
                load_rows(engine, setup, 1, args.history, Phase.FINISHED)
                load[setup.size] = round(time.perf_counter() - started, 2)
            if stats == "stale":
                analyze(engine, setups)
            for setup in setups:
                started = time.perf_counter()
                load_rows(engine, setup, OPEN_BASE + 1, setup.size, Phase.PENDING)
                load[setup.size] += round(time.perf_counter() - started, 2)
                log(
                    f"{backend}/churn/{stats}: loaded {args.history} finished and {setup.size} "
                    f"pending records in {load[setup.size]:.1f}s"
                )
            if stats == "analyzed":
                analyze(engine, setups)
            figures = measure_churn(engine, dialect, setups, args)
        finally:
            engine.dispose()
    for size in args.backlogs:
        figures[size]["load_seconds"] = load[size]
        log(f"{backend}/churn/{stats}/backlog {size}: {brief_churn(figures[size], args.limits)}")
    result["backlogs"] = {str(size): figures[size] for size in args.backlogs}
    result["ratios"] = {
        "of": f"p50(backlog {args.backlogs[-1]}) / p50(backlog {args.backlogs[0]})",
        **p50_ratios(
            figures[args.backlogs[0]], figures[args.backlogs[-1]], claim_keys(args.limits)
        ),
    }
    return result


def brief_churn(figures: dict[str, Any], limits: list[int]) -> str:
    parts = []
    for n in limits:
        whole, sql = figures[f"claim_limit_{n}"], figures[f"claim_limit_{n}_sql"]
        parts.append(
            f"claim{n} p50={whole['p50_ms']:.2f} p95={whole['p95_ms']:.2f} "
            f"(sql p50={sql['p50_ms']:.2f}, first/last third "
            f"{figures[f'claim_limit_{n}_sql_first_third_p50_ms']:.2f}/"
            f"{figures[f'claim_limit_{n}_sql_last_third_p50_ms']:.2f})"
        )
    parts.append(f"processed {figures['records_processed']}")
    return ", ".join(parts)


def brief(figures: dict[str, Any], limits: list[int]) -> str:
    parts = []
    for n in limits:
        whole, sql = figures[f"claim_limit_{n}"], figures[f"claim_limit_{n}_sql"]
        parts.append(
            f"claim{n} p50={whole['p50_ms']:.2f} p95={whole['p95_ms']:.2f} "
            f"(sql p50={sql['p50_ms']:.2f} p95={sql['p95_ms']:.2f})"
        )
    parts.append(f"discover_idle p50={figures['discover_idle']['p50_ms']:.2f}")
    parts.append(f"sweep_full={figures['sweep_full_ms']:.0f} ms")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.claim_history",
        description="Claim and discovery latency against the size of a worker's history.",
    )
    add_dialects_argument(parser)
    parser.add_argument(
        "--sizes",
        type=csv,
        default=["1k", "100k", "1M"],
        help="FINISHED history rows per size, e.g. 1k,100k,1M",
    )
    parser.add_argument(
        "--stats",
        type=csv,
        default=list(STATS_MODES),
        help="planner-statistics passes: none,stale,analyzed",
    )
    parser.add_argument("--samples", type=int, default=300, help="timed claims per size/limit")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--limits", type=csv, default=["1", "4"])
    parser.add_argument("--open", type=int, default=50, help="open (pending) records per size")
    parser.add_argument("--discover-samples", type=int, default=50)
    parser.add_argument(
        "--max-seconds", type=float, default=60.0, help="cut a claim series short after this long"
    )
    parser.add_argument("--no-explain", dest="explain", action="store_false")
    parser.add_argument(
        "--churn",
        action="store_true",
        help="measure claims during churn against backlog size (--backlogs) instead",
    )
    parser.add_argument(
        "--backlogs", type=csv, default=["1k", "100k"], help="with --churn: open records"
    )
    parser.add_argument(
        "--history", type=parse_size, default=100_000, help="with --churn: FINISHED records"
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=8,
        help="with --churn: claims held WORKING before the oldest finishes",
    )
    parser.add_argument("--target-ratio", type=float, default=1.5)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.output is None:
        name = "claim_history_churn.json" if args.churn else "claim_history.json"
        args.output = RESULTS_DIR / name
    args.sizes = sorted(parse_size(s) for s in args.sizes)
    args.backlogs = sorted(parse_size(s) for s in args.backlogs)
    args.limits = [int(n) for n in args.limits]
    for mode in args.stats:
        if mode not in STATS_MODES:
            parser.error(f"unknown stats mode {mode!r}; choose from {', '.join(STATS_MODES)}")
    if args.churn:
        return main_churn(args, argv)

    report: dict[str, Any] = new_report("claim_history", argv) | {
        "config": {
            "dialects": args.dialects,
            "sizes": args.sizes,
            "stats": args.stats,
            "samples": args.samples,
            "warmup": args.warmup,
            "limits": args.limits,
            "open_rows": args.open,
            "max_seconds_per_series": args.max_seconds,
            "eligible": ELIGIBLE,
            "history": "every history row is eligible (enabled) and FINISHED; the open rows "
            "have larger keys than all history, as new rows do",
        },
        "target": f"claim p50 at {args.sizes[-1]} <= {args.target_ratio} x claim p50 at "
        f"{args.sizes[0]} on every dialect and stats mode",
        "results": {},
    }
    return run_and_report(report, args, run_pass, "")


def run_and_report(
    report: dict[str, Any],
    args: argparse.Namespace,
    run: Callable[[str, str, argparse.Namespace], dict[str, Any]],
    label: str,
) -> int:
    """Run ``run`` per dialect and stats mode into ``report``, judge every claim limit
    against the target ratio, write the report; exit status 1 if a target is missed."""
    verdicts: dict[str, bool] = {}
    for backend in args.dialects:
        report["results"][backend] = {}
        for mode in args.stats:
            outcome = run(backend, mode, args)
            report["results"][backend][mode] = outcome
            for limit in args.limits:
                ratio = outcome["ratios"][f"claim_limit_{limit}_p50"]
                verdicts[f"{backend}/{label}{mode}/limit_{limit}"] = ratio <= args.target_ratio
    report["verdicts"] = verdicts
    write_report(args.output, report)
    log(f"wrote {args.output}")
    for key, ok in verdicts.items():
        log(f"{key}: {'meets' if ok else 'MISSES'} the target")
    return 0 if all(verdicts.values()) else 1


def main_churn(args: argparse.Namespace, argv: list[str] | None) -> int:
    report: dict[str, Any] = new_report("claim_history", argv) | {
        "config": {
            "mode": "churn",
            "dialects": args.dialects,
            "backlogs": args.backlogs,
            "history": args.history,
            "stats": args.stats,
            "samples": args.samples,
            "warmup": args.warmup,
            "limits": args.limits,
            "in_flight_claims": args.in_flight,
            "max_seconds_per_series": args.max_seconds,
            "eligible": ELIGIBLE,
            "churn": "each timed claim (PENDING -> WORKING) is followed, untimed, by the "
            "oldest claim beyond --in-flight finishing (WORKING -> FINISHED) and as many new "
            "source rows arriving and being discovered (-> PENDING): the backlog keeps its "
            "size, the table is never vacuumed (autovacuum off) and, in stats mode none, "
            "never analyzed",
        },
        "target": f"claim p50 with a backlog of {args.backlogs[-1]} <= {args.target_ratio} x "
        f"claim p50 with {args.backlogs[0]} on every dialect and stats mode",
        "results": {},
    }
    return run_and_report(report, args, run_churn_pass, "churn/")


if __name__ == "__main__":
    sys.exit(main())
