"""The work ``benchmarks.latency`` measures: rows whose handlers note when they start.

Two workers: ``bench_pickup`` runs every row, ``bench_after`` runs a row once
``bench_pickup`` has finished it (``has_execution_status`` in its ``eligible``). Each
handler appends ``<worker> <id> <event> <epoch seconds>`` to the file named by
``DBWORKER_BENCH_LATENCY_OUT`` (O_APPEND: whole lines from several processes).
Module-level, so handler processes import it.
"""

from __future__ import annotations

import os
import time

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished

from . import latency_trace
from ._common import append_line

# The throughput benchmarks' row (its key alone) serves here too.
from .noop_work import ITEMS_TABLE, Base
from .noop_work import NoopItem as LatencyItem

__all__ = ["ITEMS_TABLE", "Base", "LatencyItem", "build"]

OUT_ENV = "DBWORKER_BENCH_LATENCY_OUT"

# benchmarks.latency --trace: marks along each item's path, in every process of the
# service (this module is imported by the service and by each handler process).
latency_trace.install()
PICKUP = "bench_pickup"
AFTER = "bench_after"


def _note(worker: str, item_id: int, event: str) -> None:
    append_line(os.environ[OUT_ENV], f"{worker} {item_id} {event} {time.time():.6f}\n")


def pickup(source: LatencyItem, session: Session) -> Finished:
    _note(PICKUP, source.id, "start")
    _note(PICKUP, source.id, "end")
    return Finished()


def after(source: LatencyItem, session: Session) -> Finished:
    _note(AFTER, source.id, "start")
    return Finished()


def build(session_factory: sessionmaker[Session], url: str, notifications: bool) -> Coordinator:
    """The coordinator both sides build: the worker service starts it; the application
    side only registers (its session factory then announces commits)."""
    coordinator = Coordinator(session_factory, database_url=url, notifications=notifications)
    coordinator.transactional_worker(name=PICKUP, source=LatencyItem, concurrency=2)(pickup)
    finished = coordinator.has_execution_status(
        worker=PICKUP, source_id=LatencyItem.id, statuses=(ExecutionStatus.FINISHED,)
    )
    coordinator.transactional_worker(
        name=AFTER,
        source=LatencyItem,
        eligible=lambda: select(LatencyItem).where(finished).order_by(LatencyItem.id),
        concurrency=2,
    )(after)
    return coordinator
