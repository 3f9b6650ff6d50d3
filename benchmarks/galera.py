"""Throughput on a MariaDB Galera cluster of 1 node against 3 nodes.

    python -m benchmarks.galera [--items 1000] [--out benchmarks/results/galera.json]

Builds the clusters the topology tests build (``tests/topologies/galera.py``: mariadbd
processes on loopback ports of this machine, so the nodes share its cores) and runs the
crash suite's worker (each handler inserts one effect row and returns ``Finished()``)
over ``--items`` items, timed from the insert of the rows to the last effect seen:

* ``1 node``: one coordinator (concurrency 2 each, here and below) on a one-node cluster;
* ``3 nodes, 3 writers``: a coordinator on each node of a three-node cluster;
* ``3 nodes, 1 writer``: three coordinators, all on the first node.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from crash import app
from crash.support import add_items, effect_count, make_coordinator
from topologies.galera import Galera

CONCURRENCY = 2


def measure(urls: list[str], items: int) -> dict[str, float]:
    engine = create_engine(urls[0])
    with engine.begin() as conn:
        for table in ("crash_effects", "crash_items", "dbworker_crash", "dbworker_coordinators"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engines = [create_engine(url) for url in urls]
    made = [
        make_coordinator(e, url, lease_seconds=10, concurrency=CONCURRENCY)
        for e, url in zip(engines, urls, strict=True)
    ]
    for coordinator in made:
        coordinator.start()
    time.sleep(2)  # processes started, connections open
    with tempfile.TemporaryDirectory() as workdir:
        started = time.monotonic()
        add_items(engine, Path(workdir), [app.QUICK] * items)
        while effect_count(engine) < items:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    contention = sum(c._scheduler.health.contention for c in made if c._scheduler)
    for coordinator in made:
        coordinator.stop()
    for e in (engine, *engines):
        e.dispose()
    return {
        "seconds": round(elapsed, 3),
        "items_per_second": round(items / elapsed, 1),
        "contention_retries": contention,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--out", default="benchmarks/results/galera.json")
    args = parser.parse_args(argv)
    results: dict[str, object] = {"items": args.items, "concurrency_per_coordinator": CONCURRENCY}
    single = Galera(size=1)
    try:
        results["1 node"] = measure([single.nodes[0].url(single.database)], args.items)
    finally:
        single.stop()
    cluster = Galera(size=3)
    try:
        urls = [node.url(cluster.database) for node in cluster.nodes]
        results["3 nodes, 3 writers"] = measure(urls, args.items)
        results["3 nodes, 1 writer"] = measure([urls[0]] * 3, args.items)
    finally:
        cluster.stop()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
