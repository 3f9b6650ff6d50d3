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

import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._common import admin_url

#: The module holding dbworker's measured work (it imports dbworker itself).
DBWORKER_WORK = "benchmarks.noop_work"
CELERY_WORK = "benchmarks.celery_app"
#: A coordinator and two handler processes; Celery's main process and two children.
TREE_PROCESSES = 3

_MEASURE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")))
"""


def driver_module(backend: str) -> str:
    """The DBAPI module SQLAlchemy imports for ``backend``'s benchmark URL."""
    if backend == "sqlite":
        return "sqlite3"
    return str(admin_url(backend).get_dialect().import_dbapi().__name__)


def process_rss_kib(modules: Sequence[str], environment: dict[str, str], cwd: Path) -> int:
    """VmRSS of a fresh interpreter that has imported ``modules``."""
    output = subprocess.run(
        [sys.executable, "-c", _MEASURE, *modules],
        env=environment,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(output.split()[-1])


def floors(
    backends: Sequence[str],
    environment: dict[str, str],
    cwd: Path,
    repeat: int = 5,
    measure: Callable[[Sequence[str], dict[str, str], Path], int] = process_rss_kib,
) -> dict[str, Any]:
    """The floor of each tree: its process's imports, the median RSS over ``repeat``
    interpreters, and ``TREE_PROCESSES`` times that."""
    trees = {f"dbworker/{b}": ["sqlalchemy.orm", driver_module(b), DBWORKER_WORK] for b in backends}
    trees["celery"] = [CELERY_WORK]
    found: dict[str, Any] = {}
    for tree, modules in trees.items():
        process = int(statistics.median(measure(modules, environment, cwd) for _ in range(repeat)))
        found[tree] = {
            "imports": modules,
            "process_rss_kib": process,
            "tree_rss_kib": TREE_PROCESSES * process,
        }
    return found
