"""One dbworker coordinator in a process of its own, for ``benchmarks.throughput``.

The measured process tree is then dbworker's alone (this process, multiprocessing's
fork server and resource tracker, the handler processes): the benchmark inserts the
items, polls for completion and samples memory from its own process.

Protocol: the database URL comes as the first line of stdin (not the command line,
which any process can read, nor the report's list of processes). This process creates
the tables, starts the coordinator and prints one JSON line (``{"ready": ..., "table":
..., "server": ...}``); it stops the coordinator when its stdin closes, and prints
``{"stopped": true}``.

Run by the benchmark: ``python -m benchmarks._dbworker_process --concurrency 2``.
"""

from __future__ import annotations

import argparse
import json
import sys

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from dbworker.dialects import for_url

from ._common import EXECUTORS, server_version
from .noop_work import ITEMS_TABLE, THROUGHPUT_WORKER, Base, throughput_coordinator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._dbworker_process")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--poll-seconds", type=float, default=0.05)
    parser.add_argument("--executor", choices=EXECUTORS, default="pool")
    args = parser.parse_args(argv)
    url = sys.stdin.readline().strip()
    dialect = for_url(url)
    engine = sa.create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    try:
        # Short waits after an empty poll, as a latency-minded deployment would set
        # them: rows committed without a wake-up are found within 50 ms.
        coordinator = throughput_coordinator(
            sessionmaker(engine), url, args.concurrency, args.poll_seconds, args.executor
        )
        table = coordinator.workers[THROUGHPUT_WORKER].execution_table
        Base.metadata.create_all(engine, tables=[ITEMS_TABLE])
        coordinator.create_worker_tables()
        coordinator.start()
        try:
            ready = {"ready": True, "table": table.name, "server": server_version(engine)}
            print(json.dumps(ready), flush=True)
            sys.stdin.read()  # until the benchmark closes it
        finally:
            coordinator.stop(timeout=30)
    finally:
        engine.dispose()
    print(json.dumps({"stopped": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
