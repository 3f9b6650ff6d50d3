"""Prometheus metrics (the ``dbworker[prometheus]`` extra), fed by the scheduler's events.

``prometheus_metrics(coordinator)`` subscribes a listener to ``coordinator.events`` and
registers, per worker (label ``worker``):

- counters ``dbworker_items_claimed_total``, ``..._finished_total``, ``..._unfinished_total``,
  ``..._failed_total``, ``..._retried_total``, ``..._crashed_total``, ``..._timed_out_total``,
  ``..._lost_total``, ``..._released_total``, ``..._cancelled_total``,
  ``dbworker_loop_lags_total`` (a handler blocked the asyncio executor's loop) and
  ``dbworker_database_errors_total``
  (no ``worker`` label);
- histograms ``dbworker_handler_duration_seconds`` (how long handlers ran) and
  ``dbworker_pickup_latency_seconds`` (from the claim to the handler's start);
- gauges read when scraped: ``dbworker_slots`` (concurrency), ``dbworker_running``
  (handlers running now), ``dbworker_free_slots``, ``dbworker_held`` (claims held,
  including items claimed ahead), and from the coordinators' cached count
  (``dbworker.registry``) ``dbworker_backlog`` (eligible and not claimed) and
  ``dbworker_backlog_oldest_seconds``, with ``dbworker_backlog_age_seconds`` saying how
  old that count is;
- for workers with limits (``exclusive_by``, ``rate_limit``), counted in SQL at scrape
  time (``Operations.limits``; no query when no worker has limits):
  ``dbworker_items_key_busy`` (waiting items whose key a working item holds),
  ``dbworker_rate_slots_used`` (rate slots used in the current window) and
  ``dbworker_items_rate_limited`` (waiting items whose key used all its slots). A
  scrape while the database cannot answer leaves them out.

Per item the listener increments a counter and observes a histogram: no SQL, no lock
beyond the client library's own. Serve the registry with ``serve(port)`` (``dbworker run
--metrics-port``) or mount ``asgi_app()`` / ``wsgi_app()`` in the application.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from ..core.errors import ConfigurationError, DBWorkerError
from ..events import Event, EventKind

if TYPE_CHECKING:
    from ..coordinator import Coordinator

#: Histogram buckets (seconds): from a fast handler to a long one.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_COUNTED = {
    EventKind.CLAIMED: "items_claimed",
    EventKind.FINISHED: "items_finished",
    EventKind.UNFINISHED: "items_unfinished",
    EventKind.FAILED: "items_failed",
    EventKind.RETRIED: "items_retried",
    EventKind.CRASHED: "items_crashed",
    EventKind.TIMED_OUT: "items_timed_out",
    EventKind.LOST: "items_lost",
    EventKind.RELEASED: "items_released",
    EventKind.CANCELLED: "items_cancelled",
    # Not items: a handler blocked its event loop (async def handlers), starving the others.
    EventKind.LOOP_LAG: "loop_lags",
}
#: Invocations that ran a handler to its end (their duration means something).
_RAN = frozenset({EventKind.FINISHED, EventKind.UNFINISHED, EventKind.FAILED, EventKind.RETRIED})


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "Prometheus metrics need the prometheus-client package: "
            "pip install 'dbworker[prometheus]'"
        ) from None
    return prometheus_client


class PrometheusMetrics:
    """The metrics of one coordinator in a prometheus-client registry."""

    def __init__(self, coordinator: Coordinator, registry: Any = None) -> None:
        client = _client()
        self.client = client
        self.coordinator = coordinator
        self.registry = client.REGISTRY if registry is None else registry
        names = list(coordinator.workers)
        counters = {
            kind: client.Counter(
                f"dbworker_{name}",
                f"Items of each worker {kind.value}",
                ["worker"],
                registry=self.registry,
            )
            for kind, name in _COUNTED.items()
        }
        self.database_errors = client.Counter(
            "dbworker_database_errors",
            "Coordination transactions that failed (outages, errors)",
            registry=self.registry,
        )
        self.contention = client.Counter(
            "dbworker_contention",
            "Coordination transactions that lost to a concurrent one and were tried again "
            "(deadlocks, Galera certification conflicts)",
            registry=self.registry,
        )

        def histogram(name: str, description: str, buckets: tuple[float, ...]) -> Any:
            return client.Histogram(
                name, description, ["worker"], buckets=buckets, registry=self.registry
            )

        duration = histogram(
            "dbworker_handler_duration_seconds", "How long handlers ran", DURATION_BUCKETS
        )
        latency = histogram(
            "dbworker_pickup_latency_seconds",
            "From an item's claim to its handler's start",
            LATENCY_BUCKETS,
        )
        # Children bound once per worker: an event costs two dict lookups and the
        # client's increment, not a label resolution.
        self._counters = {
            (kind, worker): counter.labels(worker)
            for kind, counter in counters.items()
            for worker in names
        }
        for child in self._counters.values():
            child.inc(0)
        self._duration = {worker: duration.labels(worker) for worker in names}
        self._latency = {worker: latency.labels(worker) for worker in names}
        self.registry.register(_Gauges(coordinator, client))
        coordinator.events.subscribe(self.observe)

    def observe(self, event: Event) -> None:
        """The listener: count ``event``."""
        if event.kind is EventKind.DATABASE_ERROR:
            self.database_errors.inc()
            return
        if event.kind is EventKind.CONTENTION:
            self.contention.inc()
            return
        counter = self._counters.get((event.kind, event.worker or ""))
        if counter is None:
            return
        counter.inc()
        if event.kind in _RAN and event.worker is not None:
            if event.duration is not None:
                self._duration[event.worker].observe(event.duration)
            if event.latency is not None:
                self._latency[event.worker].observe(event.latency)

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns the server."""
        return self.client.start_http_server(port, addr=addr, registry=self.registry)

    def asgi_app(self) -> Any:
        """An ASGI app serving the metrics, to mount in the application."""
        return self.client.make_asgi_app(registry=self.registry)

    def wsgi_app(self) -> Any:
        """A WSGI app serving the metrics, to mount in the application."""
        return self.client.make_wsgi_app(registry=self.registry)

    def text(self) -> str:
        """The exposition text, as a scrape would read it."""
        return str(self.client.generate_latest(self.registry).decode())


def prometheus_metrics(coordinator: Coordinator, registry: Any = None) -> PrometheusMetrics:
    """Export ``coordinator``'s metrics to ``registry`` (prometheus-client's default one
    unless given); call before ``start()`` to count from the first claim."""
    return PrometheusMetrics(coordinator, registry)


class _Gauges:
    """Gauges read at scrape time from the scheduler and the cached backlog."""

    def __init__(self, coordinator: Coordinator, client: Any) -> None:
        self.coordinator = coordinator
        self.families = client.metrics_core.GaugeMetricFamily

    def describe(self) -> list[Any]:
        return []  # unchecked: the families depend on the workers and the cache

    def collect(self) -> Iterator[Any]:
        gauge = self.families
        slots = gauge("dbworker_slots", "Handler processes (concurrency)", labels=["worker"])
        running = gauge("dbworker_running", "Handlers running now", labels=["worker"])
        free = gauge("dbworker_free_slots", "Slots with no handler running", labels=["worker"])
        held = gauge("dbworker_held", "Claims held, with items claimed ahead", labels=["worker"])
        live = self.coordinator.operations.live()
        for name, load in live.workers.items():
            slots.add_metric([name], load.slots)
            running.add_metric([name], load.running)
            free.add_metric([name], load.free)
            held.add_metric([name], load.held)
        yield from (slots, running, free, held)
        yield from self._limits()
        if live.backlog_age is None:
            return
        backlog = gauge("dbworker_backlog", "Items eligible and not claimed", labels=["worker"])
        oldest = gauge(
            "dbworker_backlog_oldest_seconds", "Age of the oldest waiting item", labels=["worker"]
        )
        for name, figures in live.backlog.items():
            if figures.waiting is not None:
                backlog.add_metric([name], figures.waiting)
            if figures.oldest_waiting_seconds is not None:
                oldest.add_metric([name], figures.oldest_waiting_seconds)
        age = gauge("dbworker_backlog_age_seconds", "How old the backlog count is")
        age.add_metric([], live.backlog_age)
        yield from (backlog, oldest, age)

    def _limits(self) -> Iterator[Any]:
        """The limited workers' gauges, counted now (nothing if none is limited)."""
        try:
            found = self.coordinator.operations.limits()
        except (DBWorkerError, SQLAlchemyError):
            return  # the database is down or not set up: the scrape goes on without them
        if not found:
            return
        gauge = self.families
        busy = gauge(
            "dbworker_items_key_busy",
            "Waiting items whose exclusive key a working item holds",
            labels=["worker"],
        )
        used = gauge(
            "dbworker_rate_slots_used", "Rate slots used in the current window", labels=["worker"]
        )
        limited = gauge(
            "dbworker_items_rate_limited",
            "Waiting items whose rate limit's slots are all used this window",
            labels=["worker"],
        )
        for name, figures in found.items():
            if figures.key_busy is not None:
                busy.add_metric([name], figures.key_busy)
            if figures.rate_slots_used is not None:
                used.add_metric([name], figures.rate_slots_used)
            if figures.rate_limited is not None:
                limited.add_metric([name], figures.rate_limited)
        yield from (busy, used, limited)
