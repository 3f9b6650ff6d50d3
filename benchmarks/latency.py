"""Pickup latency: from an application's commit to its handler's start, one row at a
time with idle gaps, on each database with and without wake-ups, beside Celery + Redis
in the same run; what an idle coordinator costs its database; and how soon a dependent
worker starts after its prerequisite finishes.

* dbworker: a worker service (``benchmarks._latency_process``) with a ``Coordinator``
  at the seed-API defaults (``poll_seconds=0.25``, ``max_poll_seconds=10``, pool
  executor) and two workers (``benchmarks.latency_work``) at ``concurrency=2``.
  The benchmark is the application: after a warm-up it commits ``--items`` rows, one
  per transaction through its own ``sessionmaker`` (which the ``Coordinator`` it builds
  listens on), each after a random gap of ``--min-gap``..``--max-gap`` seconds. Pickup
  latency is the handler's first statement minus the moment the commit completed (an
  ``after_commit`` listener registered before dbworker's; both ``time.time()`` on this
  host). Dependent latency: ``bench_after`` (eligible once
  ``bench_pickup`` has FINISHED the row) starting, minus ``bench_pickup``'s handler
  returning (so it includes the commit of that finish). Each database runs twice:
  ``notifications=True`` (the default) and ``False`` (polling alone).
* Idle cost: afterwards, one worker service per database at once (wake-ups on), idle
  after its warm-up for ``--idle-settle`` seconds (the poll backoff has reached
  ``max_poll_seconds`` and the watermark has stood still past the 2-minute sweep
  horizon, so polls are probes), counts every statement its engines send during
  ``--idle-seconds``, by kind. Not counted: the PostgreSQL listener's connection (not
  an engine's), which sends one ``SELECT 1`` every 30 s, and the full sweep, once per
  10 minutes per worker (``scheduling.discovery``), which a window may miss.
* Celery: ``celery worker --pool prefork --concurrency 2`` (``benchmarks.celery_app``,
  ``fast``: no result backend, late acks) on a private queue; the same gaps; latency is
  the task's start minus the moment ``apply_async`` returned.
* The limit (``benchmarks.latency_limit``; ``--no-limit`` leaves it out): on each
  database, a runner on the raw driver that keeps dbworker's contract (a claim committed
  before a handler process loads its row), woken as dbworker is, with the same gaps.
  ``ratios`` gives each system's p50 and p95 against Celery's and against its
  database's limit.

Results go to ``benchmarks/results/latency.json`` (``--output``), with an
``acceptance`` block for issue 12's bars. Run: ``python -m benchmarks.latency --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ._common import (
    RESULTS_DIR,
    add_dialects_argument,
    log,
    new_report,
    scratch_database,
    summarize,
    write_report,
)
from .latency_limit import measure_pickup_limit
from .latency_trace import FLUSH_SECONDS, TRACE_ENV, breakdown
from .throughput import REDIS_URL, REPOSITORY, _read_json_line, child_environment, stop_process


def latency_summary(seconds: Sequence[float]) -> dict[str, Any]:
    """``summarize`` plus the 99th percentile."""
    summary = summarize(seconds)
    ms = sorted(s * 1000.0 for s in seconds)
    if len(ms) > 1:
        summary["p99_ms"] = round(statistics.quantiles(ms, n=100, method="inclusive")[98], 4)
    elif ms:
        summary["p99_ms"] = round(ms[0], 4)
    return summary


def _read_notes(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _wait_for(path: Path, wanted: int, what: str, timeout: float) -> list[list[str]]:
    """The notes once ``wanted`` distinct ones (by every field but the time) are written:
    a call that ran twice (a redelivery, a run again after a lost claim) notes again,
    and must not stand in for a call whose note is still missing."""
    deadline = time.monotonic() + timeout
    while True:
        notes = _read_notes(path)
        distinct = len({tuple(note[:-1]) for note in notes})
        if distinct >= wanted:
            return notes
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {distinct} of {wanted} notes after {timeout}s")
        time.sleep(0.01)


def _first_times(notes: Sequence[Sequence[str]]) -> dict[tuple[str, ...], float]:
    """Each note's earliest time, by its other fields (a call that ran twice counts
    from its first start)."""
    first: dict[tuple[str, ...], float] = {}
    for note in notes:
        key, at = tuple(note[:-1]), float(note[-1])
        first[key] = min(at, first.get(key, at))
    return first


@dataclasses.dataclass
class Service:
    """A running worker service and the application's side of it."""

    label: str
    process: subprocess.Popen[str]
    session_factory: Any
    notes: Path
    server: str

    #: When the last commit completed (set by an ``after_commit`` listener).
    committed_at: float = 0.0
    #: The application's Coordinator (registrations only, never started).
    application: Any = None

    def insert(self, item_id: int) -> float:
        """Commit one row; the time the database's commit completed."""
        from .latency_work import LatencyItem

        with self.session_factory.begin() as session:
            session.add(LatencyItem(id=item_id))
        return self.committed_at

    def stamp(self, _session: Any) -> None:
        self.committed_at = time.time()

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        return _read_json_line(self.process.stdout, timeout)

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(message)
        return self.receive(timeout)


#: Notes per row: bench_pickup's start and end, bench_after's start.
NOTES_PER_ITEM = 3


@contextlib.contextmanager
def service(backend: str, notifications: bool, args: argparse.Namespace) -> Iterator[Service]:
    """A worker service on a scratch database, warmed up with ``--warmup`` rows."""
    import sqlalchemy as sa
    from sqlalchemy import event
    from sqlalchemy.orm import sessionmaker

    from .latency_work import OUT_ENV, build

    label = f"dbworker/{backend}/{'notify' if notifications else 'poll'}"
    with (
        scratch_database(backend, "latency") as url,
        tempfile.TemporaryDirectory(prefix="dbw_latency_") as scratch,
    ):
        out = Path(scratch) / "notes"
        trace = {TRACE_ENV: str(Path(scratch) / "trace")} if args.trace else {}
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._latency_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_environment(**{OUT_ENV: str(out)}, **trace),
            cwd=REPOSITORY,
        )
        engine = sa.create_engine(url)
        try:
            session_factory = sessionmaker(engine)
            running = Service(label, process, session_factory, out, "")
            # Listening before dbworker does, the stamp is taken as the commit completes,
            # before dbworker's own after_commit sends a wake-up (SQLite, MariaDB).
            event.listen(session_factory, "after_commit", running.stamp)
            # The application's side: registering is enough for its commits to announce.
            running.application = build(session_factory, url, notifications)
            running.server = running.request(
                {"url": url, "notifications": notifications}, args.timeout
            )["server"]
            for i in range(1, args.warmup + 1):
                running.insert(i)
                _wait_for(out, NOTES_PER_ITEM * i, f"{label} warm-up", args.timeout)
            yield running
            assert process.stdin is not None and process.stdout is not None
            process.stdin.close()
            _read_json_line(process.stdout, 60)
            process.wait(timeout=30)
        finally:
            engine.dispose()
            if process.poll() is None:
                stop_process(process)


def run_dbworker(
    backend: str, notifications: bool, gaps: Sequence[float], args: argparse.Namespace
) -> dict[str, Any]:
    from .latency_work import AFTER, PICKUP

    with service(backend, notifications, args) as running:
        committed: dict[int, float] = {}
        for n, gap in enumerate(gaps):
            time.sleep(gap)
            item_id = args.warmup + 1 + n
            committed[item_id] = running.insert(item_id)
        total = NOTES_PER_ITEM * (args.warmup + len(gaps))
        notes = _wait_for(running.notes, total, running.label, args.timeout + 30)
        stamps = {(w, int(i), e): t for (w, i, e), t in _first_times(notes).items()}
        stages = None
        if args.trace:
            time.sleep(3 * FLUSH_SECONDS)  # the processes write their marks meanwhile
            started = {i: stamps[(PICKUP, i, "start")] for i in committed}
            stages = breakdown(running.notes.with_name("trace"), committed, started)
    label, server = running.label, running.server
    pickup = [stamps[(PICKUP, i, "start")] - t for i, t in committed.items()]
    dependent = [stamps[(AFTER, i, "start")] - stamps[(PICKUP, i, "end")] for i in committed]
    traced = {} if stages is None else {"stages": stages}
    return traced | {
        "system": label,
        "server": server,
        "notifications": notifications,
        "items": len(committed),
        "pickup": latency_summary(pickup),
        "dependent": latency_summary(dependent),
    }


def measure_idle(backends: Sequence[str], args: argparse.Namespace) -> dict[str, Any]:
    """Every backend's worker service at once (wake-ups on), idle after its warm-up:
    statements per second once the backoff has reached ``max_poll_seconds`` and the
    watermark has stood still past the sweep horizon (``--idle-settle``)."""
    with contextlib.ExitStack() as stack:
        services = {b: stack.enter_context(service(b, True, args)) for b in backends}
        time.sleep(args.idle_settle)
        for running in services.values():  # all windows at once
            running.send({"idle": args.idle_seconds})
        found = {}
        for backend, running in services.items():
            found[backend] = running.receive(args.idle_seconds + args.timeout)
            found[backend]["workers"] = 2
            found[backend]["per_worker_per_second"] = round(found[backend]["per_second"] / 2, 4)
    return found


def run_celery(gaps: Sequence[float], args: argparse.Namespace) -> dict[str, Any]:
    import celery
    import redis

    from . import celery_app

    keys = f"dbw_latency_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    app = celery_app.make_app("fast", keys)
    task = app.tasks[celery_app.STAMP_TASK]
    worker = subprocess.Popen(
        celery_app.worker_command(keys, 2),
        env=child_environment(**{celery_app.CONFIG_ENV: "fast", celery_app.KEYS_ENV: keys}),
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with tempfile.TemporaryDirectory(prefix="dbw_latency_") as scratch:
            out = Path(scratch) / "notes"
            for i in range(1, args.warmup + 1):
                task.apply_async((i, str(out)), queue=keys)
                _wait_for(out, i, "celery warm-up", args.timeout)
            sent: dict[int, float] = {}
            for n, gap in enumerate(gaps):
                time.sleep(gap)
                item_id = args.warmup + 1 + n
                task.apply_async((item_id, str(out)), queue=keys)
                sent[item_id] = time.time()
            notes = _wait_for(out, args.warmup + len(gaps), "celery", args.timeout + 30)
    finally:
        stop_process(worker)
        app.connection_for_write().default_channel.queue_delete(keys)
        client.delete(*celery_app.unacked_keys(keys).values())
        client.close()
    started = {int(i): t for (i,), t in _first_times(notes).items()}
    return {
        "system": "celery_fast",
        "server": f"celery {celery.__version__}, redis-py {redis.__version__}",
        "items": len(sent),
        "pickup": latency_summary([started[i] - t for i, t in sent.items()]),
    }


def run_limit(backend: str, gaps: Sequence[float], args: argparse.Namespace) -> dict[str, Any]:
    """The pickup limit on ``backend`` (``benchmarks.latency_limit``)."""
    committed, started = measure_pickup_limit(backend, gaps, args)
    return {
        "system": f"limit/{backend}",
        "items": len(committed),
        "pickup": latency_summary([started[i] - t for i, t in committed.items()]),
    }


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pickup p50 and p95 of each system against Celery's and against its database's
    limit, and each limit against Celery's."""
    found: dict[str, Any] = {}
    celery = runs.get("celery_fast", {}).get("pickup")
    for name, run in runs.items():
        if name == "celery_fast":
            continue
        pickup, against = run["pickup"], {}
        if celery is not None:
            against["celery"] = celery
        backend = name.split("/")[1]
        limit = runs.get(f"limit/{backend}", {}).get("pickup")
        if limit is not None and not name.startswith("limit/"):
            against["limit"] = limit
        for other, theirs in against.items():
            for q in ("p50_ms", "p95_ms"):
                found.setdefault(name, {})[f"{q[:3]}_vs_{other}"] = round(pickup[q] / theirs[q], 3)
    return found


def acceptance(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 12's bars, checked on this run's figures."""
    checks: dict[str, Any] = {}
    celery_p95 = runs.get("celery_fast", {}).get("pickup", {}).get("p95_ms")
    for backend in ("postgresql", "sqlite"):
        run = runs.get(f"dbworker/{backend}/notify")
        if run is None:
            continue
        p50, p95 = run["pickup"]["p50_ms"], run["pickup"]["p95_ms"]
        checks[f"{backend}_pickup_p50_le_5ms"] = {"p50_ms": p50, "ok": p50 <= 5}
        if celery_p95 is not None:
            checks[f"{backend}_pickup_p95_le_4x_celery_p95"] = {
                "p95_ms": p95,
                "celery_p95_ms": celery_p95,
                "ratio": round(p95 / celery_p95, 2),
                "ok": p95 <= 4 * celery_p95,
            }
    mysql = runs.get("dbworker/mysql/notify")
    if mysql is not None:
        p50 = mysql["pickup"]["p50_ms"]
        checks["mariadb_pickup_p50_le_50ms"] = {"p50_ms": p50, "ok": p50 <= 50}
    pg = runs.get("dbworker/postgresql/notify")
    if pg is not None:
        p50 = pg["dependent"]["p50_ms"]
        checks["postgresql_dependent_p50_le_10ms"] = {"p50_ms": p50, "ok": p50 <= 10}
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__)
    add_dialects_argument(parser)
    parser.add_argument("--items", type=int, default=100, help="timed rows per system")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-gap", type=float, default=0.2, help="seconds")
    parser.add_argument("--max-gap", type=float, default=2.5, help="seconds")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--idle-settle", type=float, default=140.0, help="seconds")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="0: skip")
    parser.add_argument("--no-celery", action="store_true")
    parser.add_argument(
        "--no-limit", action="store_true", help="leave out the raw-driver pickup limit"
    )
    parser.add_argument("--modes", default="notify,poll", help="notify,poll")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument(
        "--trace",
        action="store_true",
        help="split dbworker's pickup into stages (benchmarks.latency_trace): commit -> "
        "wake-up -> claim -> dispatch -> handler process -> handler start",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "latency.json")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    gaps = [rng.uniform(args.min_gap, args.max_gap) for _ in range(args.items)]
    report = new_report("latency", argv)
    report["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    runs: dict[str, dict[str, Any]] = {}
    if not args.no_celery:
        log("celery: measuring")
        runs["celery_fast"] = run_celery(gaps, args)
    for backend in args.dialects:
        if not args.no_limit:
            log(f"limit/{backend}: measuring")
            runs[f"limit/{backend}"] = run_limit(backend, gaps, args)
            log(f"  pickup {runs[f'limit/{backend}']['pickup']}")
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            log(f"dbworker/{backend}/{mode}: measuring")
            run = run_dbworker(backend, mode == "notify", gaps, args)
            runs[run["system"]] = run
            log(f"  pickup {run['pickup']}, dependent {run['dependent']}")
            if "stages" in run:
                log(f"  stages {run['stages']}")
    report["runs"] = runs
    report["ratios"] = ratios(runs)
    if args.idle_seconds > 0:
        log("idle cost: measuring every database at once")
        report["idle"] = measure_idle(args.dialects, args)
    report["acceptance"] = acceptance(runs)
    write_report(args.output, report)
    print(
        json.dumps(
            {
                "runs": {k: v["pickup"] for k, v in runs.items()},
                "ratios": report["ratios"],
                "acceptance": report["acceptance"],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
