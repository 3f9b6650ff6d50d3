"""The Celery side of ``benchmarks.throughput``: one app, one no-op task."""

from __future__ import annotations

import os

from celery import Celery

REDIS_URL = os.environ.get("DBWORKER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("dbworker_bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    # Celery's defaults otherwise (acks, prefetch, serializer): an ordinary deployment.
    result_expires=600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="dbworker_bench.noop")  # type: ignore[untyped-decorator]
def noop() -> None:
    return None
