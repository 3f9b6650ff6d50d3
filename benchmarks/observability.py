"""What visibility costs: ``dbworker status`` and every dashboard page over a large
history, and the scheduler's per-item cost of reporting events.

For each database, a scratch database holds one source table of ``--rows`` rows (default
1M) whose records are FINISHED (finished over the last two hours), plus ``--open`` rows
discovered and pending, ``--failed`` FAILED records and as many source rows again that no
discovery has seen. Then, ``--samples`` times each, round-robin:

* ``status_live``: what ``dbworker status --live`` computes (counts per status, the work
  waiting over the whole eligible set, its oldest item, running, finished in the last
  minute and the hour's history), in process: the command's answer without Python's
  start-up;
* ``stats_refresh``: the same measurement as a coordinator's heartbeat takes it into the
  registry (``Heartbeat.refresh_stats``): the price of the cache, paid by one coordinator
  every ``registry.STATS_SECONDS``;
* ``status_cached``: ``dbworker status`` with a live coordinator's fresh count in the
  registry (what it shows whenever a coordinator runs);
* ``page_index``, ``page_worker`` (the failed items), ``page_item`` (one failed record
  with its traceback and history): the dashboard's pages through its ASGI app
  (Starlette's test client), with the cache as a running coordinator keeps it.

``events`` times the scheduler's reporting of one event per item in a tight loop: with no
listener, and with the Prometheus listener (a counter, two histograms). The target is
every status answer and page under 200 ms at 1M finished records (``status_live`` is
reported for what it is: the fallback when no coordinator runs).

Run: ``python -m benchmarks.observability --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import sqlalchemy as sa
from sqlalchemy import Boolean, DateTime, Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Event, EventKind, Events, ExecutionStatus, Finished
from dbworker.registry import Heartbeat

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    server_version,
    summarize,
    write_report,
)

TARGET_MS = 200.0
CHUNK = 20_000


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "obs_order"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    payload: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime)


def handle(order: Order, session: Session) -> Finished:  # never runs: only registered
    return Finished()


def coordinator_for(url: str) -> tuple[Coordinator, sa.Engine]:
    engine = sa.create_engine(url)
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    coordinator.transactional_worker(
        name="orders",
        source=Order,
        eligible=lambda: select(Order).where(Order.enabled.is_(True)).order_by(Order.id),
    )(handle)
    return coordinator, engine


def load(
    engine: sa.Engine, coordinator: Coordinator, rows: int, open_rows: int, failed: int
) -> None:
    """Source rows 1..rows+open+failed+open (the last ``open`` undiscovered), records for
    all but those: FINISHED, then PENDING, then FAILED with a traceback."""
    orders = cast(sa.Table, Order.__table__)
    Base.metadata.create_all(engine, tables=[orders])
    coordinator.create_worker_tables()
    table = coordinator._registration("orders").table.table
    now = time.time()
    start = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(hours=3)
    total = rows + open_rows + failed + open_rows
    discovered = rows + open_rows + failed
    error = "ValueError: bench failure"
    trace = (
        'Traceback (most recent call last):\n  File "bench.py", line 1\nValueError: bench failure\n'
    )
    for first in range(1, total + 1, CHUNK):
        ids = range(first, min(total, first + CHUNK - 1) + 1)
        with engine.begin() as conn:
            conn.execute(
                sa.insert(orders),
                [
                    {
                        "id": i,
                        "enabled": True,
                        "payload": "x",
                        "created_at": start + dt.timedelta(seconds=i / 1000),
                    }
                    for i in ids
                ],
            )
            records = []
            for i in ids:
                if i > discovered:
                    continue
                if i <= rows:
                    # Finished over the last two hours, in key order.
                    done = now - 7200 + 7200 * i / rows
                    records.append(_record(i, "finished", done, None, None))
                elif i <= rows + open_rows:
                    records.append(_record(i, "pending", None, None, None))
                else:
                    records.append(_record(i, "failed", now - 60, error, trace))
            if records:
                conn.execute(sa.insert(table), records)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"ANALYZE {table.name}")
            conn.exec_driver_sql(f"ANALYZE {Order.__tablename__}")
        elif engine.dialect.name == "mysql":
            conn.exec_driver_sql(f"ANALYZE TABLE {table.name}")
            conn.exec_driver_sql(f"ANALYZE TABLE {Order.__tablename__}")


def _record(
    key: int, status: str, done: float | None, error: str | None, trace: str | None
) -> dict[str, Any]:
    stamp = done if done is not None else time.time()
    return {
        "source_id": key,
        "status": status,
        "token": 1 if status != "pending" else 0,
        "attempts": 0 if status == "pending" else 1,
        "failures": 0,
        "crashes": 0,
        "error": error,
        "error_type": "ValueError" if error else None,
        "traceback": trace,
        "discovered_at": stamp - 1,
        "claimed_at": None if status == "pending" else stamp - 0.5,
        "finished_at": done,
        "updated_at": stamp,
    }


def timed(step: Callable[[], Any]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def measure_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from dbworker.operator.dashboard import create_app

    with scratch_database(backend, "obs") as url:
        coordinator, engine = coordinator_for(url)
        log(f"{backend}: loading {args.rows:,} finished records")
        began = time.perf_counter()
        load(engine, coordinator, args.rows, args.open, args.failed)
        load_seconds = time.perf_counter() - began
        worker = coordinator._registration("orders")
        dialect = coordinator._dialect
        heartbeat = Heartbeat(
            engine,
            dialect,
            coordinator._registry_table(),
            [worker],
            "bench",
            coordinator._registry_timing,
        )
        heartbeat.start()  # registers the row; its thread only beats (stats are forced)
        client = TestClient(create_app(coordinator), base_url="http://127.0.0.1")
        failed_id = args.rows + args.open + 1

        def status(live: bool) -> Callable[[], Any]:
            def run() -> Any:
                return coordinator.operations.backlog("orders", live=live)

            return run

        def page(path: str) -> Callable[[], Any]:
            def run() -> None:
                response = client.get(path)
                assert response.status_code == 200, (path, response.status_code)

            return run

        steps: dict[str, Callable[[], Any]] = {
            "status_live": status(True),
            "stats_refresh": lambda: heartbeat.refresh_stats(force=True),
            "status_cached": status(False),
            "page_index": page("/"),
            "page_worker": page("/workers/orders"),
            "page_item": page(f"/workers/orders/items/{failed_id}"),
        }
        # Check the figures once: what is measured must be what users see.
        figures = status(True)()["orders"]
        assert figures.waiting == 2 * args.open, figures
        assert figures.counts[ExecutionStatus.FINISHED] == args.rows, figures
        samples: dict[str, list[float]] = {name: [] for name in steps}
        for step in steps.values():  # warm-up: plans, caches, imports
            step()
        deadline = time.monotonic() + args.max_seconds
        for _ in range(args.samples):
            for name, step in steps.items():
                samples[name].append(timed(step))
            if time.monotonic() > deadline:
                break
        heartbeat.stop()
        server = server_version(engine)
        engine.dispose()
        result = {name: summarize(values) for name, values in samples.items()}
        answered = [n for n in steps if n not in ("status_live", "stats_refresh")]
        return {
            "server": server,
            "load_seconds": round(load_seconds, 1),
            "rows": args.rows,
            "timings": result,
            "figures": {
                **{k: v for k, v in dataclasses.asdict(figures).items() if k != "history"},
                "counts": {str(s or "pending"): n for s, n in figures.counts.items()},
            },
            "under_target": {n: result[n]["p95_ms"] < TARGET_MS for n in answered},
        }


def measure_events(count: int) -> dict[str, Any]:
    """The scheduler's cost of reporting one event per item: none vs the Prometheus listener."""
    from prometheus_client import CollectorRegistry

    from dbworker import PrometheusMetrics

    events = Events()
    event = Event(EventKind.FINISHED, "orders", 1, 1, duration=0.01, latency=0.001)

    def loop() -> float:
        started = time.perf_counter()
        for _ in range(count):
            if events:  # as the scheduler does: one truth test with no listener
                events.emit(event)
        return (time.perf_counter() - started) / count

    bare = min(loop() for _ in range(5))

    class Fake:
        """Just what PrometheusMetrics reads of a coordinator."""

        workers: ClassVar[dict[str, None]] = {"orders": None}
        events: Events

    fake = Fake()
    fake.events = events
    PrometheusMetrics(fake, CollectorRegistry())  # type: ignore[arg-type]
    with_metrics = min(loop() for _ in range(5))
    return {
        "events": count,
        "no_listener_ns_per_item": round(bare * 1e9, 1),
        "prometheus_ns_per_item": round(with_metrics * 1e9, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialects_argument(parser)
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished records")
    parser.add_argument("--open", type=int, default=1000, help="pending (and undiscovered) rows")
    parser.add_argument("--failed", type=int, default=100, help="failed records")
    parser.add_argument("--samples", type=int, default=20, help="samples per measurement")
    parser.add_argument("--max-seconds", type=float, default=120, help="sampling time per database")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "observability.json")
    args = parser.parse_args(argv)
    report = new_report("observability", argv)
    report["target_ms"] = TARGET_MS
    random.seed(0)
    report["events"] = measure_events(200_000)
    log(f"events: {report['events']}")
    report["backends"] = {}
    for backend in args.dialects:
        report["backends"][backend] = measure_backend(backend, args)
        timings = report["backends"][backend]["timings"]
        log(f"{backend}: " + ", ".join(f"{k} p50 {v['p50_ms']:.1f} ms" for k, v in timings.items()))
        write_report(args.output, report)
    write_report(args.output, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
