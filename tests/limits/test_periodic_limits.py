"""Periodic workers with limits (issue 26), end to end with two coordinator services
as real processes on every database: ``exclusive=True`` never runs two ticks of the
worker at once, though its ticks outlast its period and each service could run three;
``rate_limit`` holds across both services, by the database's own claim times."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, Tick
from dbworker.core.limits import max_in_window
from serving import process_in_session
from waiting import wait_until

from . import periodic_app as app

CONCURRENCY = 3
#: Runs of each worker to wait for.
EXCLUSIVE_RUNS = 8
RATED_RUNS = 12


def _coordinator(engine: Engine, url: str) -> Coordinator:
    """The services' workers, to create their tables and read their records."""
    coordinator = Coordinator(sessionmaker(engine), database_url=url)
    app.register(coordinator, CONCURRENCY)
    return coordinator


def _runs(engine: Engine, worker: str) -> list[app.TickRunRecord]:
    with Session(engine) as session:
        query = select(app.TickRunRecord).where(app.TickRunRecord.worker == worker)
        return list(session.scalars(query.order_by(app.TickRunRecord.started)))


def _made(engine: Engine, worker: str) -> int:
    with Session(engine) as session:
        count = session.scalar(select(func.count()).select_from(Tick).where(Tick.worker == worker))
    return int(count or 0)


def test_periodic_limits_across_two_services(database_url: str, tmp_path: Path) -> None:
    engine = create_engine(database_url)
    app.PeriodicBase.metadata.create_all(engine)
    coordinator = _coordinator(engine, database_url)
    coordinator.create_worker_tables()
    command = [sys.executable, "-m", "limits.run_service", database_url, "--lease", "10"]
    command += ["--concurrency", str(CONCURRENCY), "--periodic"]
    with (
        process_in_session(command, tmp_path / "service0.log"),
        process_in_session(command, tmp_path / "service1.log"),
    ):
        wait_until(
            lambda: (
                len(_runs(engine, app.EXCLUSIVE)) >= EXCLUSIVE_RUNS
                and len(_runs(engine, app.RATED)) >= RATED_RUNS
            ),
            f"{EXCLUSIVE_RUNS} exclusive and {RATED_RUNS} rate-limited runs",
            timeout=120,
        )
    exclusive = _runs(engine, app.EXCLUSIVE)
    for before, after in itertools.pairwise(exclusive):
        assert after.started >= before.ended, (
            f"ticks {before.tick_id} [{before.started}, {before.ended}] and {after.tick_id}"
            f" (from {after.started}) of the exclusive periodic worker overlap"
        )
    assert _made(engine, app.EXCLUSIVE) > len(exclusive), (
        "ticks outlast the period: some must have waited for the one running"
    )

    table = coordinator.workers[app.RATED].execution_table
    with engine.connect() as conn:
        claimed = [
            float(t)
            for t in conn.execute(
                select(table.c.claimed_at).where(table.c.claimed_at.is_not(None))
            ).scalars()
        ]
    assert len(claimed) >= RATED_RUNS
    # The database's claim times; one more for clock jitter between statement and commit
    # (as tests/limits/test_acceptance.py).
    assert max_in_window(claimed, 1.0) <= app.RATE + 1, sorted(claimed)
    # 10 ticks a second are made; at 2 claims a second most of them wait.
    assert _made(engine, app.RATED) > len(claimed)
    engine.dispose()
