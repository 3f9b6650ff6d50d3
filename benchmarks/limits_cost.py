"""What a limit that is not being hit costs a claim (issue 26): claim-and-finish rounds
in one process, straight through the dialect (as the coordinator's loop and a handler
process call it), for a worker without limits, with ``exclusive_by`` over a column whose
values are all distinct, and with a ``rate_limit`` far above the rate reached.

Each configuration claims batches of ``--batch`` (the free slots of a loop round) and
finishes each claimed item in its own transaction, until ``--items`` are done; the
figure is items per second, and each limited configuration's ratio to the unlimited
one measured next to it (round-robin over ``--repeat`` rounds, medians). The bar: a
limit that is not hit costs at most 10% (ratio >= 0.9).

``--mode e2e`` measures what the issue means by throughput: a real coordinator
(``start()``, the default pool executor, ``--concurrency`` handler processes) runs
``--items`` no-op items after a warm-up (which also makes the rate slots: their first
use is not timed), for a worker without limits, with ``exclusive_by`` over a column of
distinct values (never contended), a worker-wide ``rate_limit`` and a ``rate_limit_by``
over 16 groups, both far above the rate reached (10000/s, the most a rate may say).
The configurations alternate within each round; the figures are medians and the
medians of the ratios paired within a round.

Run: ``python -m benchmarks.limits_cost --items 2000 --repeat 3`` (claim-and-finish),
``python -m benchmarks.limits_cost --mode e2e --items 3000 --repeat 3``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished
from dbworker.dialects import Owner
from dbworker.engines import coordination_engine

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    write_report,
)

CONFIGS: dict[str, dict[str, Any]] = {
    "unlimited": {},
    "exclusive_by": {"exclusive_by": "key"},
    "rate_limit": {"rate_limit": "10000/s"},
    "rate_limit_by": {"rate_limit": "10000/s", "rate_limit_by": "grp"},
}
#: Distinct values of ``grp`` (the ``rate_limit_by`` key).
GROUPS = 16


class _Base(DeclarativeBase):
    pass


class BenchJob(_Base):
    __tablename__ = "bench_limit_jobs"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(sa.String(32))
    grp: Mapped[int] = mapped_column(sa.Integer, default=0)


def handle(job: BenchJob, session: Session) -> Finished:
    return Finished()


def one_run(url: str, config: str, items: int, batch: int, round_no: int) -> float:
    engine = sa.create_engine(url)
    _Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    options = _options(config)
    name = f"bench_{config}_{round_no}"
    coordinator.transactional_worker(name, BenchJob, **options)(handle)
    coordinator.create_worker_tables()
    first = round_no * 10_000_000
    with Session(engine) as session, session.begin():
        session.execute(sa.delete(BenchJob))
        session.execute(
            sa.insert(BenchJob), [{"id": first + i, "key": str(first + i)} for i in range(items)]
        )
    worker = coordinator._registration(name)
    dialect = coordinator._dialect
    run_engine = coordination_engine(sa.make_url(url), dialect, {})
    owner = Owner.current()
    found = True
    while found:  # a discovery round reads at most ``discovery_batch`` rows
        with run_engine.begin() as conn:
            found = dialect.discover(conn, worker.table) > 0
    done = 0
    started = time.perf_counter()
    while done < items:
        with run_engine.begin() as conn:
            claims = dialect.claim(conn, worker.table, worker.eligible_query(), batch, 30, owner)
        if not claims:
            raise RuntimeError(f"{config}: a claim found nothing with {items - done} left")
        for claim in claims:
            with run_engine.begin() as conn:
                assert dialect.finish(conn, worker.table, claim.source_id, claim.token)
        done += len(claims)
    elapsed = time.perf_counter() - started
    run_engine.dispose()
    engine.dispose()
    return items / elapsed


def _options(config: str) -> dict[str, Any]:
    return {
        k: getattr(BenchJob, v) if k in ("exclusive_by", "rate_limit_by") else v
        for k, v in CONFIGS[config].items()
    }


def _insert(engine: sa.Engine, first: int, count: int) -> None:
    rows = [{"id": i, "key": str(i), "grp": i % GROUPS} for i in range(first, first + count)]
    with engine.begin() as conn:
        conn.execute(sa.insert(BenchJob), rows)


def _wait_finished(engine: sa.Engine, table: sa.Table, count: int, timeout: float) -> None:
    finished = sa.select(sa.func.count()).where(table.c.status == "finished")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if int(conn.execute(finished).scalar_one()) >= count:
                return
        time.sleep(0.02)
    raise TimeoutError(f"{count} items did not finish in {timeout} s")


def e2e_run(
    url: str, config: str, items: int, warmup: int, concurrency: int, round_no: int
) -> float:
    """Items per second of a started coordinator (pool executor) over ``items``."""
    engine = sa.create_engine(url)
    _Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.delete(BenchJob))
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    name = f"e2e_{config}_{round_no}"
    coordinator.transactional_worker(name, BenchJob, concurrency=concurrency, **_options(config))(
        handle
    )
    coordinator.create_worker_tables()
    table = coordinator.workers[name].execution_table
    first = (round_no * len(CONFIGS) + list(CONFIGS).index(config)) * 1_000_000 + 1
    coordinator.start()
    try:
        _insert(engine, first, warmup)
        _wait_finished(engine, table, warmup, 120)
        started = time.perf_counter()
        _insert(engine, first + warmup, items)
        _wait_finished(engine, table, warmup + items, 600)
        elapsed = time.perf_counter() - started
    finally:
        coordinator.stop(timeout=30)
        engine.dispose()
    return items / elapsed


def main_e2e(args: argparse.Namespace, argv: list[str] | None) -> int:
    report = new_report("limits_cost_e2e", argv, "limits_cost")
    report["settings"] = {
        "items": args.items,
        "warmup": args.warmup,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "executor": "pool (default)",
        "configs": CONFIGS,
    }
    report["results"] = {}
    for backend in args.dialects:
        rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
        with scratch_database(backend, "limits") as url:
            for round_no in range(args.repeat):
                order = list(CONFIGS)
                order = order[round_no % len(order) :] + order[: round_no % len(order)]
                for config in order:
                    rate = e2e_run(url, config, args.items, args.warmup, args.concurrency, round_no)
                    rates[config].append(rate)
                    log(f"{backend} e2e round {round_no} {config}: {rate:.0f} items/s")
        report["results"][backend] = {
            config: {
                "items_per_second": statistics.median(values),
                "runs": values,
                "paired_ratios": [v / u for v, u in zip(values, rates["unlimited"], strict=True)],
                "vs_unlimited": statistics.median(
                    v / u for v, u in zip(values, rates["unlimited"], strict=True)
                ),
            }
            for config, values in rates.items()
        }
    write_report(__import__("pathlib").Path(args.output), report)
    for backend, results in report["results"].items():
        for config, figures in results.items():
            print(
                f"{backend:10} {config:13} {figures['items_per_second']:8.0f} items/s"
                f"  x{figures['vs_unlimited']:.2f} (paired median)"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialects_argument(parser)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", default=str(RESULTS_DIR / "limits_cost.json"))
    parser.add_argument("--mode", choices=("micro", "e2e"), default="micro")
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)
    if args.mode == "e2e":
        return main_e2e(args, argv)
    report = new_report("limits_cost", argv)
    report["results"] = {}
    for backend in args.dialects:
        rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
        with scratch_database(backend, "limits") as url:
            for round_no in range(args.repeat):
                order = list(CONFIGS)
                order = order[round_no % len(order) :] + order[: round_no % len(order)]
                for config in order:
                    rate = one_run(url, config, args.items, args.batch, round_no)
                    rates[config].append(rate)
                    log(f"{backend} {config}: {rate:.0f} items/s")
        base = statistics.median(rates["unlimited"])
        report["results"][backend] = {
            config: {
                "items_per_second": statistics.median(values),
                "runs": values,
                "vs_unlimited": statistics.median(values) / base,
            }
            for config, values in rates.items()
        }
    write_report(__import__("pathlib").Path(args.output), report)
    for backend, results in report["results"].items():
        for config, figures in results.items():
            print(
                f"{backend:10} {config:13} {figures['items_per_second']:8.0f} items/s"
                f"  x{figures['vs_unlimited']:.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
