"""The memory floor of a process tree: what its processes hold once they have imported
what they cannot run without, before doing anything.

Every process of dbworker's tree (the coordinator and each handler process) imports
SQLAlchemy's ORM, the database driver and the handler's module (which imports
dbworker); every process of Celery's, Celery and the task module. A fresh interpreter
importing exactly that, and nothing else, has the least resident memory any process of
that tree can have, whatever the design; a tree of a coordinator and two handler
processes holds at least three times that. ``benchmarks.throughput`` reports it beside
each measured tree, so that its RSS reads against what no design could go below.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import DEFAULT_URLS, URL_ENV_VARS

#: The module holding dbworker's measured work (it imports dbworker itself).
DBWORKER_WORK = "benchmarks.noop_work"
CELERY_WORK = "benchmarks.celery_app"
#: A coordinator and two handler processes; Celery's main process and two children.
TREE_PROCESSES = 3

#: Imports the modules named as arguments, and the database driver of the URL on stdin
#: (if any: SQLAlchemy picks it, as an engine would), then prints VmRSS in KiB. The
#: URL is read here, not in the benchmark's process, which must not import SQLAlchemy
#: (the limit's workers check that they run without it).
_MEASURE = """
import importlib, sys
url = sys.stdin.readline().strip()
if url:
    from sqlalchemy.engine import make_url
    make_url(url).get_dialect().import_dbapi()
for name in sys.argv[1:]:
    importlib.import_module(name)
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")))
"""


def process_rss_kib(
    modules: Sequence[str], environment: dict[str, str], cwd: Path, url: str = ""
) -> int:
    """VmRSS of a fresh interpreter that has imported ``modules`` (and ``url``'s driver)."""
    output = subprocess.run(
        [sys.executable, "-c", _MEASURE, *modules],
        input=url + "\n",
        env=environment,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(output.split()[-1])


def _url(backend: str) -> str:
    """The benchmark's URL for ``backend``, as a string: parsing it would import
    SQLAlchemy here."""
    if backend == "sqlite":
        return "sqlite://"
    return os.environ.get(URL_ENV_VARS[backend], DEFAULT_URLS[backend])


def floors(
    backends: Sequence[str], environment: dict[str, str], cwd: Path, repeat: int = 5
) -> dict[str, Any]:
    """The floor of each tree: its process's imports, the median RSS over ``repeat``
    interpreters, and ``TREE_PROCESSES`` times that."""
    trees: dict[str, tuple[list[str], str]] = {
        f"dbworker/{b}": (["sqlalchemy.orm", DBWORKER_WORK], _url(b)) for b in backends
    }
    trees["celery"] = ([CELERY_WORK], "")
    found: dict[str, Any] = {}
    for tree, (modules, url) in trees.items():
        sizes = [process_rss_kib(modules, environment, cwd, url) for _ in range(repeat)]
        process = int(statistics.median(sizes))
        driver = [f"the driver of {url.split(':', 1)[0]}"] if url else []
        found[tree] = {
            "imports": [*modules, *driver],
            "process_rss_kib": process,
            "tree_rss_kib": TREE_PROCESSES * process,
        }
    return found
