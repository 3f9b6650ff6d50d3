"""Issue 26's acceptance, with two coordinator services as real processes on every
database: exclusivity by key (no two runs of a key overlap, different keys run in
parallel, a SIGKILLed holder's key is free again after its lease) and a rate limit
(never more than 5 claims in any second, by the database's own claim times)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator
from dbworker.core.limits import max_in_window
from serving import process_in_session
from waiting import wait_until

from . import app

LEASE = 2.0
CONCURRENCY = 3


def _setup(url: str) -> Engine:
    engine = create_engine(url)
    app.Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=url, lease_seconds=LEASE)
    app.register(coordinator, CONCURRENCY)
    coordinator.create_worker_tables()
    return engine


@contextlib.contextmanager
def services(url: str, logs: Path, count: int = 2) -> Iterator[list[int]]:
    command = [sys.executable, "-m", "limits.run_service", url, "--lease", str(LEASE)]
    with contextlib.ExitStack() as stack:
        pids = [
            stack.enter_context(process_in_session(command, logs / f"service{i}.log")).pid
            for i in range(count)
        ]
        yield pids


def _runs(engine: Engine) -> list[app.Run]:
    with Session(engine) as session:
        return list(session.scalars(select(app.Run).order_by(app.Run.started)))


def _add(engine: Engine, jobs: list[app.Job]) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(jobs)


def _assert_no_overlap_per_key(runs: list[app.Run]) -> None:
    by_key: dict[str, list[app.Run]] = {}
    for run in runs:
        by_key.setdefault(run.key, []).append(run)
    for key, these in by_key.items():
        these.sort(key=lambda r: r.started)
        for before, after in itertools.pairwise(these):
            assert after.started >= before.ended, (
                f"runs of key {key} overlap: job {before.job_id} [{before.started}, "
                f"{before.ended}] and job {after.job_id} from {after.started}"
            )


def test_exclusive_by_key_across_two_services(database_url: str, tmp_path: Path) -> None:
    engine = _setup(database_url)
    hang = tmp_path / "hang"
    jobs = [
        app.Job(id=i, key=f"k{i % 6}", kind="exclusive", sleep_seconds=0.2) for i in range(1, 61)
    ]
    jobs[0].hang_file = str(hang)  # job 1 (key k1) hangs on its first run
    _add(engine, jobs)
    with services(database_url, tmp_path) as _pids:
        holder = int(wait_until(lambda: hang.exists() and hang.read_text(), "job 1's first run"))
        # SIGKILL the whole service that runs job 1 (its handler and its coordinator).
        killed_at = time.time()
        os.killpg(os.getpgid(holder), signal.SIGKILL)
        wait_until(lambda: len(_runs(engine)) == 60, "all 60 jobs to finish", timeout=120)
    runs = _runs(engine)
    assert sorted(r.job_id for r in runs) == list(range(1, 61)), "each job ran once"
    _assert_no_overlap_per_key(runs)
    parallel = any(
        a.key != b.key and a.started < b.ended and b.started < a.ended for a in runs for b in runs
    )
    assert parallel, "different keys must run in parallel"
    (rerun,) = [r for r in runs if r.job_id == 1]
    assert rerun.started >= killed_at, "job 1 ran again after its holder was killed"
    # Key k1 was busy until job 1's lease ended, then free again: its jobs all ran.
    assert len([r for r in runs if r.key == "k1"]) == 10
    engine.dispose()


def test_rate_limit_across_two_services(database_url: str, tmp_path: Path) -> None:
    engine = _setup(database_url)
    _add(engine, [app.Job(id=i, key="r", kind="rated") for i in range(1, 31)])
    started = time.monotonic()
    with services(database_url, tmp_path):
        wait_until(lambda: len(_runs(engine)) == 30, "all 30 jobs to finish", timeout=120)
    elapsed = time.monotonic() - started
    coordinator = Coordinator(sessionmaker(engine), database_url=database_url)
    app.register(coordinator, CONCURRENCY)
    table = coordinator.workers[app.RATED].execution_table
    with engine.connect() as conn:
        claimed = [float(t) for t in conn.execute(select(table.c.claimed_at)).scalars()]
    assert len(claimed) == 30
    # The database's claim times; one more for clock jitter between statement and commit.
    assert max_in_window(claimed, 1.0) <= 5 + 1, sorted(claimed)
    assert max(claimed) - min(claimed) >= 5.0 - 0.1, "30 claims at 5/s span at least 5 s"
    assert elapsed >= 5.0, f"30 items at 5/s took only {elapsed:.1f} s"
    engine.dispose()
