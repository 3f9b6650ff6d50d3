"""The Celery side of ``benchmarks.throughput``: one no-op task, in two configurations.

* ``results``: Redis as broker and result backend, Celery's defaults otherwise (acks
  on receipt, prefetch 4): an ordinary deployment that wants to know each outcome.
* ``fast``: configured for speed: no result backend (``task_ignore_result``), acks
  after the task ran (``task_acks_late``, so an acknowledgement means "done"),
  ``worker_prefetch_multiplier=4``. The benchmark sees completion in Redis itself:
  the queue is empty and no message is awaiting its acknowledgement.

Both keep kombu's unacknowledged-message bookkeeping under keys of their own
(``<keys>:unacked``...), so the count is this run's and no one else's.

The worker (``celery -A benchmarks.celery_app worker``) reads its configuration from
the environment (``DBWORKER_BENCH_CELERY_CONFIG``, ``DBWORKER_BENCH_CELERY_KEYS``);
the benchmark builds the same app for sending with ``make_app``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from celery import Celery

from ._common import append_line
from .io_trace import mark

REDIS_URL = os.environ.get("DBWORKER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
CONFIG_ENV = "DBWORKER_BENCH_CELERY_CONFIG"
KEYS_ENV = "DBWORKER_BENCH_CELERY_KEYS"
CONFIGS = ("fast", "results")
TASK = "dbworker_bench.noop"
STAMP_TASK = "dbworker_bench.stamp"
WAIT_TASK = "dbworker_bench.wait"
WRITE_TASK = "dbworker_bench.wait_write"
#: The engines of ``_wait_and_write``, one per database URL, shared by the worker's threads.
_ENGINES: dict[str, Any] = {}


def worker_command(queue: str, concurrency: int, pool: str = "prefork") -> list[str]:
    """The ``celery worker`` command of the benchmarks: prefork (or ``pool``), on a
    private queue, without the cluster chatter (gossip, mingle, heartbeats) a lone
    worker needs not."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "benchmarks.celery_app",
        "worker",
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--queues",
        queue,
        "--hostname",
        f"{queue}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        "WARNING",
    ]


def unacked_keys(keys: str) -> dict[str, str]:
    """kombu's Redis transport options naming its unacknowledged-message keys."""
    return {
        "unacked_key": f"{keys}:unacked",
        "unacked_index_key": f"{keys}:unacked_index",
        "unacked_mutex_key": f"{keys}:unacked_mutex",
    }


def _noop() -> None:
    return None


def _stamp(item_id: int, path: str) -> None:
    """Note when the task started (``benchmarks.latency``): ``<id> <epoch seconds>``."""
    append_line(path, f"{item_id} {time.time():.6f}\n")


def _wait(seconds: float) -> None:
    """An I/O-bound task (``benchmarks.io``): it only waits."""
    mark("start", 0)
    time.sleep(seconds)
    mark("ret", 0)


def _wait_and_write(seconds: float, url: str, call_id: int) -> None:
    """``_wait``, then what dbworker's handler in ``benchmarks.io`` writes: one row, added
    through a SQLAlchemy session and committed (the same work, without dbworker's load
    of the source row and fenced finish, and without exactly-once)."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from .io_work import Done

    mark("start", call_id)
    time.sleep(seconds)
    mark("ret", call_id)
    engine = _ENGINES.get(url)
    if engine is None:
        # One connection per thread of the pool, as dbworker's threads executor keeps.
        engine = _ENGINES.setdefault(url, sa.create_engine(url, pool_size=64, max_overflow=8))
    with Session(engine) as session, session.begin():
        session.add(Done(call_id=call_id))


def make_app(config: str, keys: str = "dbw_bench") -> Any:
    if config not in CONFIGS:
        raise ValueError(f"unknown Celery configuration {config!r}; choose from {CONFIGS}")
    common: dict[str, Any] = {
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "broker_transport_options": unacked_keys(keys),
    }
    if config == "results":
        app = Celery("dbworker_bench", broker=REDIS_URL, backend=REDIS_URL)
        app.conf.update(common, result_expires=600)
    else:
        app = Celery("dbworker_bench", broker=REDIS_URL)
        app.conf.update(
            common,
            task_ignore_result=True,
            task_acks_late=True,
            worker_prefetch_multiplier=4,
        )
    app.task(name=TASK, shared=False)(_noop)
    app.task(name=STAMP_TASK, shared=False)(_stamp)
    app.task(name=WAIT_TASK, shared=False)(_wait)
    app.task(name=WRITE_TASK, shared=False)(_wait_and_write)
    return app


app = make_app(os.environ.get(CONFIG_ENV, "results"), os.environ.get(KEYS_ENV, "dbw_bench"))
noop = app.tasks[TASK]
