"""What a limit that is not being hit costs a claim (issue 26): claim-and-finish rounds
in one process, straight through the dialect (as the coordinator's loop and a handler
process call it), for a worker without limits, with ``exclusive_by`` over a column whose
values are all distinct, and with a ``rate_limit`` far above the rate reached.

Each configuration claims batches of ``--batch`` (the free slots of a loop round) and
finishes each claimed item in its own transaction, until ``--items`` are done; the
figure is items per second, and each limited configuration's ratio to the unlimited
one measured next to it (round-robin over ``--repeat`` rounds, medians). The bar: a
limit that is not hit costs at most 10% (ratio >= 0.9).

Run: ``python -m benchmarks.limits_cost --items 2000 --repeat 3``.
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
}


class _Base(DeclarativeBase):
    pass


class BenchJob(_Base):
    __tablename__ = "bench_limit_jobs"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(sa.String(32))


def handle(job: BenchJob, session: Session) -> Finished:
    return Finished()


def one_run(url: str, config: str, items: int, batch: int, round_no: int) -> float:
    engine = sa.create_engine(url)
    _Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    options = {
        k: getattr(BenchJob, v) if k == "exclusive_by" else v for k, v in CONFIGS[config].items()
    }
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
    with run_engine.begin() as conn:
        dialect.discover(conn, worker.table)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialects_argument(parser)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", default=str(RESULTS_DIR / "limits_cost.json"))
    args = parser.parse_args(argv)
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
