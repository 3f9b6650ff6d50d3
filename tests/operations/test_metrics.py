"""Prometheus metrics after a run with failures, retries and a crash: the endpoint is
scraped over HTTP and parsed with prometheus-client's own text parser; the counts
must be exactly what the run did."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dbworker import Event, EventKind, ExecutionStatus, RetryPolicy, prometheus_metrics
from dbworker.registry import Timing

from . import app
from .support import Site, wait_until

FINISHED_IDS = [1, 2, 3]  # 3 fails once, then finishes on its retry
FAILED_IDS = [4, 5]  # 4 fails every run, 5 kills its process


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_after_failures_retries_and_a_crash(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(
        name="jobs",
        source=app.Job,
        concurrency=2,
        retry=RetryPolicy(max_retries=2, base_delay=0.01, jitter=0),
        max_crashes=1,
    )(app.run_job)
    coordinator.create_worker_tables()
    coordinator._registry_timing = Timing(heartbeat=0.1, stats=0.1)
    metrics = prometheus_metrics(coordinator, CollectorRegistry())
    events: list[Event] = []
    coordinator.events.subscribe(events.append)
    server, _ = metrics.serve(0)
    port = server.server_port
    ops.add_jobs([1, 2], app.QUICK)
    ops.add_jobs([3], app.FAIL, fail_times=1, error="value")
    ops.add_jobs([4], app.FAIL, fail_times=99, error="value")
    ops.add_jobs([5], app.KILL)
    ops.add_jobs([6], app.QUICK)
    with coordinator.session_factory() as session:  # cancelled before it ever runs
        assert coordinator.cancel(session, worker="jobs", source_id=6)
        session.commit()
    try:
        coordinator.start()
        ops.wait_for_status(coordinator, "jobs", FINISHED_IDS, ExecutionStatus.FINISHED)
        ops.wait_for_status(coordinator, "jobs", FAILED_IDS, ExecutionStatus.FAILED)
        # The backlog gauge comes from the coordinators' cached count: wait for one
        # taken after the last item ended.
        wait_until(
            lambda: scrape(port).get(("dbworker_backlog", (("worker", "jobs"),))) == 0,
            "a cached backlog count of 0",
        )
        samples = scrape(port)
    finally:
        coordinator.stop()
        server.shutdown()

    def value(name: str, **labels: Any) -> float:
        return samples[(name, tuple(sorted({"worker": "jobs", **labels}.items())))]

    # Claims: 1, 2 once; 3 twice; 4 three times (two retries); 5 once.
    assert value("dbworker_items_claimed_total") == 8
    assert value("dbworker_items_finished_total") == 3
    assert value("dbworker_items_retried_total") == 3
    assert value("dbworker_items_failed_total") == 1
    assert value("dbworker_items_crashed_total") == 1
    assert value("dbworker_items_timed_out_total") == 0
    assert value("dbworker_items_lost_total") == 0
    assert value("dbworker_items_released_total") == 0
    assert value("dbworker_items_cancelled_total") == 1
    assert samples[("dbworker_database_errors_total", ())] == 0
    # Every invocation that ran its handler to an end: 3 finished, 3 retried, 1 failed.
    assert value("dbworker_handler_duration_seconds_count") == 7
    assert value("dbworker_handler_duration_seconds_bucket", le="+Inf") == 7
    assert value("dbworker_pickup_latency_seconds_count") == 7
    assert value("dbworker_handler_duration_seconds_sum") > 0
    assert value("dbworker_slots") == 2
    assert value("dbworker_running") == 0
    assert value("dbworker_free_slots") == 2
    # The listener saw the same events the counters count.
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.CLAIMED) == 8 and kinds.count(EventKind.CRASHED) == 1
    [crash] = [e for e in events if e.kind is EventKind.CRASHED]
    assert crash.worker == "jobs" and crash.source_id == 5 and crash.attempt == 1
