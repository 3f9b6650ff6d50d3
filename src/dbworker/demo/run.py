"""Running the demo: the documents, the progress display, the repair, the checks."""

from __future__ import annotations

import argparse
import io
import logging
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    Engine,
    case,
    create_engine,
    func,
    select,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionStatus

from .app import (
    PUBLISH_CONCURRENCY,
    Base,
    Document,
    Publication,
    build_coordinator,
    make_documents,
    paragraphs,
    repaired,
)

PROGRESS_EVERY_SECONDS = 0.5
#: New documents arrive in batches while the workers run.
ARRIVAL_BATCH = 5
ARRIVAL_EVERY_SECONDS = 0.4

DEFAULT_DB = Path("demo-data") / "demo.sqlite"
SUMMARY_COLUMNS: tuple[tuple[str, ExecutionStatus | None], ...] = (
    ("pending", None),
    ("working", ExecutionStatus.WORKING),
    ("unfinished", ExecutionStatus.UNFINISHED),
    ("finished", ExecutionStatus.FINISHED),
    ("failed", ExecutionStatus.FAILED),
)


# --- Observing ------------------------------------------------------------------------------

Counts = dict[str, dict[ExecutionStatus | None, int]]


def snapshot(session_factory: sessionmaker[Session], coordinator: Coordinator) -> Counts:
    """Documents per worker and status, in one query built from has_execution_status."""
    conditions = [
        (
            worker,
            status,
            coordinator.has_execution_status(
                worker=worker, source_id=Document.id, statuses=(status,)
            ),
        )
        for worker in coordinator.workers
        for status in ExecutionStatus
    ]
    query = select(
        func.count(),
        *(func.coalesce(func.sum(case((cond, 1), else_=0)), 0) for _, _, cond in conditions),
    ).select_from(Document)
    with session_factory() as session:
        total, *values = session.execute(query).one()
    counts: Counts = {worker: {} for worker in coordinator.workers}
    for (worker, status, _), value in zip(conditions, values, strict=True):
        counts[worker][status] = int(value)
    for per_status in counts.values():
        per_status[None] = int(total) - sum(per_status.values())
    return counts


def progress_line(elapsed: float, counts: Counts) -> str:
    short = {
        None: "pend",
        ExecutionStatus.WORKING: "work",
        ExecutionStatus.UNFINISHED: "unfin",
        ExecutionStatus.FINISHED: "fin",
        ExecutionStatus.FAILED: "fail",
    }
    parts = []
    for worker, per_status in counts.items():
        cells = " ".join(
            f"{short[status]} {per_status[status]:>3}" for _, status in SUMMARY_COLUMNS
        )
        parts.append(f"{worker}: {cells}")
    return f"{elapsed:6.1f}s  " + "  |  ".join(parts)


def summary_table(counts: Counts) -> str:
    width = max(len("worker"), *(len(worker) for worker in counts))
    header = f"{'worker':<{width}}  " + "  ".join(f"{label:>11}" for label, _ in SUMMARY_COLUMNS)
    rows = [header, "-" * len(header)]
    for worker, per_status in counts.items():
        cells = "  ".join(f"{per_status[status]:>11}" for _, status in SUMMARY_COLUMNS)
        rows.append(f"{worker:<{width}}  {cells}")
    return "\n".join(rows)


@dataclass
class Clock:
    started: float

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class DemoTimeout(Exception):
    pass


def watch(
    session_factory: sessionmaker[Session],
    coordinator: Coordinator,
    clock: Clock,
    deadline: float,
    done: Callable[[Counts], bool],
    arrivals: list[Document] | None = None,
) -> Counts:
    """Print progress every PROGRESS_EVERY_SECONDS (inserting ``arrivals`` in batches
    meanwhile) until ``done`` holds."""
    arrivals = arrivals if arrivals is not None else []
    next_arrival = clock.elapsed() + ARRIVAL_EVERY_SECONDS
    next_report = clock.elapsed()
    while True:
        now = clock.elapsed()
        if arrivals and now >= next_arrival:
            batch, arrivals[:] = arrivals[:ARRIVAL_BATCH], arrivals[ARRIVAL_BATCH:]
            with session_factory.begin() as session:
                session.add_all(batch)
            print(
                f"{now:6.1f}s  + inserted documents {batch[0].id}-{batch[-1].id} "
                "(a plain INSERT; no enqueue call)"
            )
            next_arrival = now + ARRIVAL_EVERY_SECONDS
        if now >= next_report:
            counts = snapshot(session_factory, coordinator)
            print(progress_line(now, counts))
            next_report = now + PROGRESS_EVERY_SECONDS
            if not arrivals and done(counts):
                return counts
        if now > deadline:
            raise DemoTimeout(f"the work did not settle within {deadline:.0f}s")
        time.sleep(0.05)


# --- The run --------------------------------------------------------------------------------


def default_database() -> Path:
    try:
        DEFAULT_DB.parent.mkdir(parents=True, exist_ok=True)
        probe = DEFAULT_DB.parent / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError:
        return Path(tempfile.mkdtemp(prefix="dbworker-demo-")) / "demo.sqlite"
    return DEFAULT_DB


DEMO_TABLES = frozenset({"documents", "publications", "dbworker_summarize", "dbworker_publish"})


def prepare_file(path: Path) -> None:
    """Start from an empty file, but only ever replace a previous demo database."""
    if path.exists():
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        except sqlite3.DatabaseError as exc:
            raise SystemExit(f"demo: {path} exists and is not an SQLite database ({exc})") from exc
        ours = (
            DEMO_TABLES
            | {f"{table}_{index}" for table in DEMO_TABLES for index in ("status_ix", "open_ix")}
            | {name for name in names if name.startswith("sqlite_autoindex_")}
        )
        if not names <= ours:
            raise SystemExit(
                f"demo: {path} exists and is not a dbworker demo database; pass another --db path"
            )
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)


def app_engine(url: URL) -> Engine:
    # The application's own engine. A generous busy timeout: handlers and claims
    # take SQLite's write lock for short moments, and an INSERT may have to wait.
    engine = create_engine(url, connect_args={"timeout": 30})
    with engine.connect() as conn:
        # WAL lets these status queries read while a worker writes.
        conn.exec_driver_sql("PRAGMA journal_mode = WAL")
    return engine


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dbworker.demo",
        description="Run two dbworker workers on an embedded SQLite file and watch them.",
    )
    parser.add_argument("--items", type=int, default=40, help="documents to process (>= 4)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="summarize handler processes (default 4)"
    )
    parser.add_argument(
        "--db",
        type=Path,
        help=f"SQLite file to (re)create (default: ./{DEFAULT_DB}, or a temporary directory)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated documents")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="give up after this many seconds (default 120)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every invocation")
    args = parser.parse_args(argv)
    if args.items < 4:
        parser.error("--items must be at least 4")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(sys.stdout, io.TextIOWrapper):
        # Progress should appear as it happens, also when piped (./dev demo | tee).
        sys.stdout.reconfigure(line_buffering=True)
    # On stdout, so the log lines land between the progress lines they belong to.
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="          log: %(message)s",
    )
    path: Path = (args.db or default_database()).resolve()
    prepare_file(path)
    url = URL.create("sqlite", database=str(path))
    print(f"database: {path}")

    engine = app_engine(url)
    # expire_on_commit=False: the demo prints ids of documents after inserting them.
    session_factory = sessionmaker(engine, expire_on_commit=False)
    coordinator = build_coordinator(session_factory, url, args.concurrency)
    app_tables = [Base.metadata.tables[name] for name in ("documents", "publications")]
    Base.metadata.create_all(engine, tables=app_tables)
    coordinator.create_worker_tables()

    broken = max(2, args.items // 3)
    documents = make_documents(args.items, broken, random.Random(args.seed))
    first, later = documents[: args.items // 2], documents[args.items // 2 :]
    with session_factory.begin() as session:
        session.add_all(first)
    steps = sum(len(paragraphs(d.body)) for d in documents)
    print(
        f"{len(documents)} documents, {steps} paragraphs; {len(first)} inserted before start(), "
        f"{len(later)} arriving while the workers run; document {broken} has an unreadable page"
    )
    print(
        f"workers: summarize (concurrency {args.concurrency}, one paragraph per invocation), "
        f"publish (concurrency {PUBLISH_CONCURRENCY}, eligible once summarize is FINISHED)"
    )
    print()

    clock = Clock(time.monotonic())
    coordinator.start()
    try:
        run(session_factory, coordinator, clock, args.timeout, args.items, broken, later)
    except DemoTimeout as exc:
        print(f"\ndemo: {exc}; stopping (handlers still running after 5s are killed)")
        coordinator.stop(timeout=5)
        print(summary_table(snapshot(session_factory, coordinator)))
        return 1
    except BaseException:
        coordinator.stop(timeout=5)
        raise
    coordinator.stop()
    print(f"\ncoordinator stopped after {clock.elapsed():.1f}s\n")

    counts = snapshot(session_factory, coordinator)
    print(summary_table(counts))
    problems = verify(session_factory, counts, args.items)
    print()
    for problem in problems:
        print(f"CHECK FAILED: {problem}")
    if not problems:
        print(
            f"checks passed: {args.items} documents summarized paragraph by paragraph and "
            f"published exactly once each. Inspect them with: sqlite3 {path}"
        )
    engine.dispose()
    return 1 if problems else 0


def run(
    session_factory: sessionmaker[Session],
    coordinator: Coordinator,
    clock: Clock,
    deadline: float,
    items: int,
    broken: int,
    arrivals: list[Document],
) -> None:
    """Let the workers run until only the broken document is left, repair it, and let
    them finish."""

    def settled(counts: Counts) -> bool:
        summarized, published = counts["summarize"], counts["publish"]
        return (
            summarized[ExecutionStatus.FINISHED] == items - 1
            and summarized[ExecutionStatus.FAILED] == 1
            and published[ExecutionStatus.FINISHED] == items - 1
        )

    watch(session_factory, coordinator, clock, deadline, settled, arrivals)

    summarizer = coordinator.workers["summarize"]
    with session_factory() as session:
        state = summarizer.state(session, broken)
        published = coordinator.execution_status(session, worker="publish", source_id=broken)
        document = session.get_one(Document, broken)
        read, body = document.paragraphs_read, document.body
    if state is None:
        raise RuntimeError(f"document {broken} has no summarize execution")
    print(
        f"\ndocument {broken}: summarize is {state['execution_status'].name} after "
        f"{state['attempts']} invocations; the {read} paragraph(s) read before the error are kept"
    )
    print(f"  error:          {state['error']}")
    print(f"  publish status: {published} (it never became eligible, so it was never claimed)")
    print(f"repairing document {broken} and calling reset_failed()\n")
    with session_factory.begin() as session:
        # The repair and the reset commit together: no claim can see one without the other.
        session.execute(update(Document).where(Document.id == broken).values(body=repaired(body)))
        if not summarizer.reset_failed(session, broken):
            raise RuntimeError(f"reset_failed({broken}) found no FAILED execution")

    def complete(counts: Counts) -> bool:
        return all(c[ExecutionStatus.FINISHED] == items for c in counts.values())

    watch(session_factory, coordinator, clock, deadline, complete)


def verify(session_factory: sessionmaker[Session], counts: Counts, items: int) -> list[str]:
    """What the application's own tables must say if every handler's writes committed
    exactly once, together with its status change."""
    problems = []
    for worker, per_status in counts.items():
        if per_status[ExecutionStatus.FINISHED] != items:
            problems.append(f"{worker}: {per_status[ExecutionStatus.FINISHED]} of {items} FINISHED")
    with session_factory() as session:
        documents = session.scalars(select(Document)).all()
        publications = session.scalars(select(Publication)).all()
        for document in documents:
            parts = paragraphs(document.body)
            expected_words = sum(len(part.split()) for part in parts)
            if document.paragraphs_read != len(parts) or document.words != expected_words:
                problems.append(
                    f"document {document.id}: read {document.paragraphs_read}/{len(parts)} "
                    f"paragraphs, counted {document.words} of {expected_words} words"
                )
            if document.summary is None:
                problems.append(f"document {document.id} has no summary")
    published = sorted(p.document_id for p in publications)
    if published != list(range(1, items + 1)):
        problems.append(f"publications cover documents {published}, expected 1..{items}")
    return problems
