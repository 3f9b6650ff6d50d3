"""End-to-end no-op throughput and memory: dbworker on each database against Celery +
Redis (two configurations) and against the limit of each database, in one run.

Every system runs the same shape of job: N no-op units of work (``--sizes``, default
3,000 and 20,000), two worker processes, and a wall clock from "work exists" to "every
outcome is recorded".

* dbworker: a ``Coordinator`` (default executor: the process pool) with one worker at
  ``concurrency=2`` whose handler returns ``Finished()``, in a process of its own
  (``benchmarks._dbworker_process``). The clock starts before this process inserts the
  rows (one transaction, through a session factory the application's side of the
  worker registers, so that its commit wakes the coordinator as an application's does;
  ``--no-wakeups``: on a plain engine, found by polling every 50 ms) and stops when it
  sees every record finished (polled every ``--poll-ms``), or after ``--max-seconds``
  for that size: the rate is then the records finished so far over that time
  (``truncated`` in the output).
* Celery ``fast``: ``celery worker --pool prefork --concurrency 2`` on a private queue,
  Redis as broker, no result backend (``task_ignore_result``), ``task_acks_late``,
  ``worker_prefetch_multiplier=4``. The clock stops when the queue is empty and no
  message awaits its acknowledgement (polled every ``--poll-ms``; with late acks a
  message is acknowledged only once its task has returned). Nothing is added to the
  task: this is the cheapest signal that is still "every task has run".
* Celery ``results``: the same worker with Redis also as result backend and Celery's
  defaults otherwise; the clock stops when every result has been received.
* pgqueuer and procrastinate (``--peers``, on PostgreSQL): the fastest PostgreSQL-native
  queues, two worker processes each (``benchmarks.pg_peers``), ratios ``vs_pgqueuer``
  and ``vs_procrastinate``.
* limit: ``benchmarks.limit``'s reference runner, dbworker's claim and finish SQL on the
  raw driver in two worker processes, with the work created before the clock starts.

Each system first runs a warm-up batch (processes started, connections open), in a
scratch database (or Celery queue) of its own. ``--repeat`` runs everything that many
times, round-robin (each round starting at another place in the list), and reports
medians. Each measurement starts once the machine is quiet
(``_common.wait_for_quiet_machine``; ``--no-settle`` starts at once): otherwise the one
after a database's run pays for its server's flushing. Also measured, for every run: the
CPU time per item of the system's processes during the timed window (/proc; the database
and Redis servers are not counted) and the peak resident memory of its process tree,
sampled every ``--rss-interval-ms`` from the start of its processes to the end of the
timed window: dbworker's coordinator process with everything under it (fork server,
resource tracker, handler processes), Celery's worker (main process and its two prefork
children), the limit's two workers. RSS counts a page shared by several processes once
per process; PSS splits it between them (both are reported).

dbworker's figures are also given as ratios: ``vs_celery_fastest`` (items/s against the
faster Celery configuration at the same size), ``vs_limit`` (against the limit of the
same database and size), ``vs_celery_nearest`` and ``vs_limit_nearest`` (the median over
dbworker's runs of each run against the runs nearest to it in time: this machine's
speed changes from one spell to the next, and runs close in time share one),
``rss_vs_celery`` (peak RSS against that Celery run's worker tree) and
``at_<largest>_vs_<smallest>`` (items/s at the largest size against the smallest).

Run: ``python -m benchmarks.throughput --help``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import select
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ._common import (
    EXECUTORS,
    RESULTS_DIR,
    TreeMemory,
    add_dialects_argument,
    csv,
    log,
    new_report,
    scratch_database,
    tree_cpu_seconds,
    wait_for_quiet_machine,
    write_report,
)
from ._floor import TREE_PROCESSES, floors
from .limit import measure_limit, median_of
from .pg_peers import PEERS, run_peer

if TYPE_CHECKING:
    import sqlalchemy as sa

REDIS_URL = os.environ.get("DBWORKER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
REPOSITORY = Path(__file__).resolve().parent.parent
CELERY_CONFIGS = ("fast", "results")
OPEN_STATUSES = "('pending', 'unfinished', 'working')"


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment for a benchmark subprocess: its import path too."""
    return {
        **os.environ,
        "DBWORKER_BENCH_REDIS_URL": REDIS_URL,
        "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p),
        **extra,
    }


def size_label(size: int) -> str:
    return f"{size // 1000}k" if size % 1000 == 0 else str(size)


def stop_process(process: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- dbworker ------------------------------------------------------------------------------


def _read_json_line(stream: IO[str], timeout: float) -> dict[str, Any]:
    ready, _, _ = select.select([stream], [], [], timeout)
    line = stream.readline() if ready else ""
    if not line:
        raise RuntimeError(f"the dbworker process said nothing within {timeout} s (or exited)")
    result: dict[str, Any] = json.loads(line)
    return result


def _wait_all_finished(
    engine: sa.Engine, table: str, last_id: int, poll: float, deadline: float
) -> float | None:
    """Wait until every record up to ``last_id`` exists and none is open: when, or None
    once ``deadline`` (monotonic) passes.

    One statement per look (two index lookups, whatever the history), on one connection
    in autocommit: the looks are the benchmark's, not dbworker's, and a look made of two
    statements and a rollback was a twentieth of the server's statements per item."""
    look = (
        f"SELECT (SELECT max(source_id) FROM {table}), "
        f"EXISTS (SELECT 1 FROM {table} WHERE status IN {OPEN_STATUSES})"
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while True:
            known, still_open = conn.exec_driver_sql(look).one()
            now = time.perf_counter()
            if known == last_id and not still_open:
                return now
            if time.monotonic() > deadline:
                return None
            time.sleep(poll)


def _count_finished(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        query = f"SELECT count(*) FROM {table} WHERE status = 'finished'"
        return int(conn.exec_driver_sql(query).scalar() or 0)


def run_dbworker(
    backend: str, items: int, max_seconds: float, args: argparse.Namespace
) -> dict[str, Any]:
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from .noop_work import insert_items, insert_items_through, throughput_coordinator

    poll = args.poll_ms / 1000
    with scratch_database(backend, "throughput") as url:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks._dbworker_process",
                "--concurrency",
                str(args.concurrency),
                "--executor",
                args.executor,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_environment(),
            cwd=REPOSITORY,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(url + "\n")
        process.stdin.flush()
        memory = TreeMemory([process.pid], args.rss_interval_ms / 1000).start()
        options = {"connect_args": {"timeout": 30}} if backend == "sqlite" else {}
        engine = sa.create_engine(url, **options)

        # The application's side: a coordinator that only registers the worker, so that
        # commits through its session factory wake the service.
        application = sessionmaker(engine)
        if args.wakeups:
            throughput_coordinator(application, url, args.concurrency)

        def insert(first: int, count: int) -> None:
            if args.wakeups:
                insert_items_through(application, first, count)
            else:
                insert_items(engine, first, count)

        try:
            ready = _read_json_line(process.stdout, args.timeout)
            table = ready["table"]
            insert(1, args.warmup)
            deadline = time.monotonic() + args.timeout
            if _wait_all_finished(engine, table, args.warmup, poll, deadline) is None:
                raise TimeoutError(f"dbworker/{backend}: the warm-up items did not finish")
            cpu = tree_cpu_seconds([process.pid])
            start = time.perf_counter()
            deadline = time.monotonic() + max_seconds
            insert(args.warmup + 1, items)
            end = _wait_all_finished(engine, table, args.warmup + items, poll, deadline)
            completed: int | None = None
            if end is None:  # truncated: the rate of what finished in time
                completed = _count_finished(engine, table) - args.warmup
                end = time.perf_counter()
            cpu = tree_cpu_seconds([process.pid]) - cpu
            memory_report = memory.stop()
            if completed is None:
                completed = _count_finished(engine, table) - args.warmup
            process.stdin.close()
            stopped = _read_json_line(process.stdout, 60)
            if not stopped.get("stopped"):
                raise RuntimeError(f"dbworker/{backend}: unexpected {stopped}")
            process.wait(timeout=30)
        finally:
            memory.stop()
            engine.dispose()
            if process.poll() is None:
                stop_process(process)
    seconds = end - start
    return {
        "system": f"dbworker/{backend}",
        "server": ready["server"],
        "items": items,
        "items_completed": completed,
        "truncated": completed < items,
        "max_seconds": max_seconds,
        "concurrency": args.concurrency,
        "executor": args.executor,
        "seconds": round(seconds, 3),
        "items_per_second": round(completed / seconds, 1),
        "cpu_ms_per_item": round(cpu * 1000 / max(completed, 1), 4),
        "memory": memory_report,
    }


# -- Celery --------------------------------------------------------------------------------


def _queue_keys(queue: str) -> list[str]:
    """The Redis lists of one kombu queue: one per priority step (0, 3, 6, 9)."""
    return [queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9))]


def _wait_drained(client: Any, queue: str, unacked: str, poll: float, deadline: float) -> float:
    """Wait until ``queue`` is empty and no message awaits an acknowledgement: when.

    A message the worker has just popped is in neither place until kombu records it as
    unacknowledged a moment later, so "drained" must be seen twice, 2 ms apart.
    """

    def pending() -> int:
        pipe = client.pipeline(transaction=True)
        for key in _queue_keys(queue):
            pipe.llen(key)
        pipe.hlen(unacked)
        return sum(int(n) for n in pipe.execute())

    while True:
        if pending() == 0:
            seen = time.perf_counter()
            time.sleep(0.002)
            if pending() == 0:
                return seen
        if time.monotonic() > deadline:
            raise TimeoutError(f"Celery queue {queue} did not drain")
        time.sleep(poll)


def run_celery(config: str, items: int, args: argparse.Namespace) -> dict[str, Any]:
    import celery
    import redis
    from celery import group

    from . import celery_app

    keys = f"dbw_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    queue = keys
    app = celery_app.make_app(config, keys)
    task = app.tasks[celery_app.TASK]
    unacked = celery_app.unacked_keys(keys)["unacked_key"]
    poll = args.poll_ms / 1000
    worker = subprocess.Popen(
        celery_app.worker_command(queue, args.concurrency),
        env=child_environment(**{celery_app.CONFIG_ENV: config, celery_app.KEYS_ENV: keys}),
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,  # its banner; warnings and errors still reach stderr
    )
    memory = TreeMemory([worker.pid], args.rss_interval_ms / 1000).start()
    client = redis.Redis.from_url(REDIS_URL)
    try:

        def send(n: int) -> Any:
            return group(task.s() for _ in range(n)).apply_async(queue=queue)

        if config == "results":
            warm = send(args.warmup)
            warm.get(timeout=args.timeout)
            cpu = tree_cpu_seconds([worker.pid])
            start = time.perf_counter()
            batch = send(items)
            results = batch.get(timeout=args.timeout)
            end = time.perf_counter()
            cpu = tree_cpu_seconds([worker.pid]) - cpu
            if len(results) != items:
                raise RuntimeError(f"got {len(results)} Celery results, expected {items}")
            batch.forget()
            warm.forget()
        else:
            send(args.warmup)
            _wait_drained(client, queue, unacked, poll, time.monotonic() + args.timeout)
            cpu = tree_cpu_seconds([worker.pid])
            start = time.perf_counter()
            send(items)
            end = _wait_drained(client, queue, unacked, poll, time.monotonic() + args.timeout)
            cpu = tree_cpu_seconds([worker.pid]) - cpu
        memory_report = memory.stop()
    finally:
        memory.stop()
        stop_process(worker)
        app.connection_for_write().default_channel.queue_delete(queue)
        client.delete(*celery_app.unacked_keys(keys).values())
        client.close()
    seconds = end - start
    return {
        "system": f"celery_{config}",
        "server": f"celery {celery.__version__}, redis-py {redis.__version__}",
        "config": config,
        "items": items,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 3),
        "items_per_second": round(items / seconds, 1),
        "cpu_ms_per_item": round(cpu * 1000 / items, 4),
        "memory": memory_report,
    }


# -- the report ----------------------------------------------------------------------------


def summarize_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    summary = median_of(runs)
    if any("truncated" in run for run in runs):
        summary["truncated"] = any(run["truncated"] for run in runs)
        summary["items_completed"] = statistics.median(run["items_completed"] for run in runs)
    return summary


def ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def nearest_ratio(ours: dict[str, Any], others: Sequence[dict[str, Any]]) -> float | None:
    """The median, over ``ours``'s runs, of each run's items/s against the faster of
    ``others`` (summaries of other systems at the same size) in their runs nearest to it
    in time. This machine's speed drifts between spells within a round; runs close in
    time share a spell, so their ratios vary less than the ratio of medians does."""
    ratios = []
    for run in ours["runs"]:
        at = run.get("measured_at")
        if at is None:
            return None
        nearest = [
            min(other["runs"], key=lambda theirs: abs(theirs.get("measured_at", 0) - at))
            for other in others
        ]
        value = ratio(run["items_per_second"], max(r["items_per_second"] for r in nearest))
        if value is not None:
            ratios.append(value)
    return round(statistics.median(ratios), 3) if ratios else None


def compare(
    results: dict[str, dict[str, dict[str, Any]]],
    dialects: Sequence[str],
    sizes: Sequence[int],
    floor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """dbworker's figures as ratios, and how each system scales from the smallest size."""
    celery = [f"celery_{config}" for config in CELERY_CONFIGS if f"celery_{config}" in results]
    ratios: dict[str, Any] = {}
    for backend in dialects:
        ours = results[f"dbworker/{backend}"]
        our_floor = (floor or {}).get(f"dbworker/{backend}")
        entry: dict[str, Any] = {}
        for size in sizes:
            key = str(size)
            figures: dict[str, Any] = {}
            if celery:
                fastest = max(celery, key=lambda name: results[name][key]["items_per_second"])
                theirs = results[fastest][key]
                figures["celery_fastest"] = fastest
                figures["vs_celery_fastest"] = ratio(
                    ours[key]["items_per_second"], theirs["items_per_second"]
                )
                figures["vs_celery_nearest"] = nearest_ratio(
                    ours[key], [results[name][key] for name in celery]
                )
                figures["rss_vs_celery"] = ratio(ours[key]["peak_rss_kib"], theirs["peak_rss_kib"])
                figures["pss_vs_celery"] = ratio(ours[key]["peak_pss_kib"], theirs["peak_pss_kib"])
                if our_floor is not None:
                    # What no design could go below, against the same Celery tree.
                    figures["floor_rss_vs_celery"] = ratio(
                        our_floor["tree_rss_kib"], theirs["peak_rss_kib"]
                    )
            if our_floor is not None:
                figures["rss_vs_floor"] = ratio(
                    ours[key]["peak_rss_kib"], our_floor["tree_rss_kib"]
                )
            if backend == "postgresql":
                for peer in PEERS:
                    if peer in results:
                        figures[f"vs_{peer}"] = ratio(
                            ours[key]["items_per_second"], results[peer][key]["items_per_second"]
                        )
                        figures[f"vs_{peer}_nearest"] = nearest_ratio(
                            ours[key], [results[peer][key]]
                        )
            limit = results.get(f"limit/{backend}")
            if limit is not None:
                figures["vs_limit"] = ratio(
                    ours[key]["items_per_second"], limit[key]["items_per_second"]
                )
                figures["vs_limit_nearest"] = nearest_ratio(ours[key], [limit[key]])
            entry[key] = figures
        ratios[f"dbworker/{backend}"] = entry
    if len(sizes) > 1:
        small, large = str(min(sizes)), str(max(sizes))
        name = f"at_{size_label(max(sizes))}_vs_{size_label(min(sizes))}"
        for backend in dialects:
            ours = results[f"dbworker/{backend}"]
            ratios[f"dbworker/{backend}"][name] = ratio(
                ours[large]["items_per_second"], ours[small]["items_per_second"]
            )
        ratios["scaling"] = {
            "of": f"items/s {name}",
            **{
                system: ratio(
                    by_size[large]["items_per_second"], by_size[small]["items_per_second"]
                )
                for system, by_size in results.items()
            },
        }
    return ratios


def print_summary(report: dict[str, Any], sizes: Sequence[int]) -> None:
    print(
        f"{'system':<22}{'size':>7}{'items/s':>10}{'CPU ms/item':>13}{'RSS MiB':>9}"
        f"{'PSS MiB':>9}  ratios"
    )
    for system, by_size in report["results"].items():
        for size in sizes:
            figures = by_size[str(size)]
            extra = report["ratios"].get(system, {}).get(str(size), {})
            shown = ", ".join(
                f"{k} {v}" for k, v in extra.items() if k != "celery_fastest" and v is not None
            )
            if figures.get("truncated"):
                shown = f"(truncated at {figures['items_completed']}) {shown}"
            print(
                f"{system:<22}{size:>7}{figures['items_per_second']:>10}"
                f"{figures.get('cpu_ms_per_item', ''):>13}"
                f"{figures.get('peak_rss_kib', 0) / 1024:>9.1f}"
                f"{figures.get('peak_pss_kib', 0) / 1024:>9.1f}  {shown}"
            )
    for tree, figures in report.get("memory_floor", {}).items():
        print(
            f"floor of {tree}: {figures['tree_rss_kib'] / 1024:.1f} MiB RSS "
            f"({TREE_PROCESSES} x {figures['process_rss_kib'] / 1024:.1f}: "
            f"{', '.join(figures['imports'])})"
        )
    scaling = report["ratios"].get("scaling")
    if scaling:
        print(f"{scaling['of']}:")
        for system, value in scaling.items():
            if system != "of":
                print(f"  {system:<20}{value}")


def per_size(values: Sequence[float], sizes: Sequence[int]) -> dict[int, float]:
    """One value per size, in order; the last value serves the remaining sizes."""
    if not values:
        raise ValueError("--max-seconds needs at least one value")
    return {size: values[min(i, len(values) - 1)] for i, size in enumerate(sizes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description="No-op throughput and memory of dbworker on each database against "
        "Celery + Redis (fast and with results) and the limit of each database.",
    )
    add_dialects_argument(parser)
    parser.add_argument(
        "--sizes",
        "--items",
        type=lambda text: [int(n) for n in csv(text)],
        default=[3000, 20000],
        help="comma-separated numbers of timed items; default 3000,20000",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="start each measurement at once, not once the machine is quiet (CPUs under"
        " 10%% busy for 0.25 s, waiting at most 15 s)",
    )
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="pool",
        help="dbworker's executor (default: the default, pool)",
    )
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument(
        "--max-seconds",
        type=lambda text: [float(n) for n in csv(text)],
        default=[30.0, 60.0],
        help="per size (in --sizes order; the last value serves the rest): measure "
        "dbworker on one database for at most this long, the rate is then items "
        "finished so far / time; default 30,60",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="give up on a warm-up, a Celery run or a limit run after this",
    )
    parser.add_argument("--no-celery", dest="celery", action="store_false")
    parser.add_argument(
        "--peers",
        type=lambda text: [p for p in csv(text) if p],
        default=list(PEERS),
        help=f"PostgreSQL-native queues run beside dbworker on PostgreSQL (comma-separated"
        f" from {', '.join(PEERS)}; empty for none); default all",
    )
    parser.add_argument("--no-limit", dest="limit", action="store_false")
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the memory floor (fresh interpreters that only import what each "
        "process of a tree needs)",
    )
    parser.add_argument(
        "--no-wakeups",
        dest="wakeups",
        action="store_false",
        help="insert dbworker's rows on a plain engine (found by polling alone), not "
        "through the application's session factory, whose commits wake the coordinator",
    )
    parser.add_argument("--limit-batch", type=int, default=2, help="records per limit claim")
    parser.add_argument("--rss-interval-ms", type=float, default=100.0)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "throughput.json")
    parser.add_argument("--label", help="a note stored in the report (e.g. 'smoke run')")
    args = parser.parse_args(argv)
    dialects: list[str] = args.dialects
    sizes: list[int] = args.sizes
    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    max_seconds = per_size(args.max_seconds, sizes)

    report: dict[str, Any] = new_report("throughput", argv) | {
        "label": args.label,
        "config": {
            "sizes": sizes,
            "repeat": args.repeat,
            "settle": args.settle,
            "max_seconds_per_database": {str(s): m for s, m in max_seconds.items()},
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "executor": args.executor,
            "poll_ms": args.poll_ms,
            "dbworker_wakeups": args.wakeups,
            "limit_batch": args.limit_batch,
            "peers": args.peers,
            "rss_interval_ms": args.rss_interval_ms,
            "redis": REDIS_URL,
        },
    }
    measurements: list[tuple[str, int, Callable[[], dict[str, Any]]]] = []
    for size in sizes:
        if args.celery:
            for config in CELERY_CONFIGS:
                measurements.append(
                    (f"celery_{config}", size, functools.partial(run_celery, config, size, args))
                )
        for backend in dialects:
            if args.limit:
                limit = functools.partial(
                    measure_limit,
                    backend,
                    size,
                    warmup=args.warmup,
                    batch=args.limit_batch,
                    processes=args.concurrency,
                    timeout=args.timeout,
                    rss_interval=args.rss_interval_ms / 1000,
                )
                measurements.append((f"limit/{backend}", size, limit))
            if backend == "postgresql":
                for peer in args.peers:
                    run = functools.partial(run_peer, peer, size, args, child_environment())
                    measurements.append((peer, size, run))
            dbworker = functools.partial(run_dbworker, backend, size, max_seconds[size], args)
            measurements.append((f"dbworker/{backend}", size, dbworker))
    started = time.perf_counter()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for repeat in range(args.repeat):
        # Each round starts at another place in the list: on this machine a run after a
        # long busy one (Celery with results: 30 s) is measurably slower, whatever runs.
        shift = (repeat * len(measurements)) // max(1, args.repeat)
        for system, size, measure in measurements[shift:] + measurements[:shift]:
            settled = wait_for_quiet_machine() if args.settle else 0.0
            measured_at = time.time()
            result = measure()
            result["settled_seconds"] = round(settled, 2)
            result["measured_at"] = round(measured_at, 3)
            runs.setdefault(system, {}).setdefault(size, []).append(result)
            truncated = " truncated" if result.get("truncated") else ""
            log(
                f"[{repeat + 1}/{args.repeat}] {system} {size}: {result['items_per_second']} "
                f"items/s ({result['seconds']} s{truncated}, {result['cpu_ms_per_item']} ms "
                f"CPU/item, {result['memory']['peak_rss_kib'] / 1024:.1f} MiB RSS)"
            )
    report["results"] = {
        system: {str(size): summarize_runs(by_size[size]) for size in sizes}
        for system, by_size in runs.items()
    }
    if args.floor:
        report["memory_floor"] = floors(dialects, child_environment(), REPOSITORY)
    report["ratios"] = compare(report["results"], dialects, sizes, report.get("memory_floor"))
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    write_report(args.output, report)
    log(f"wrote {args.output} ({report['total_seconds']} s)")
    print_summary(report, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
