"""What the benchmarks share: scratch databases, machine facts, arguments and reports."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

DIALECTS = ("sqlite", "postgresql", "mysql")
URL_ENV_VARS = {
    "postgresql": "DBWORKER_BENCH_POSTGRESQL_URL",
    "mysql": "DBWORKER_BENCH_MYSQL_URL",
}
DEFAULT_URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql+mysqldb://root@127.0.0.1:3306/mysql",
}
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def render(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def admin_url(backend: str) -> URL:
    return make_url(os.environ.get(URL_ENV_VARS[backend], DEFAULT_URLS[backend]))


@contextlib.contextmanager
def scratch_database(backend: str, tag: str) -> Iterator[str]:
    """A new, empty database for one benchmark pass, dropped afterwards.

    Its name carries the pid, so a concurrent run never touches another run's data.
    """
    name = f"dbw_bench_{tag}_{os.getpid()}"
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="dbw_bench_")
        try:
            yield f"sqlite:///{directory}/{name}.db"
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    url = admin_url(backend)
    admin = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    quote = admin.dialect.identifier_preparer.quote
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote(name)}")
            conn.exec_driver_sql(f"CREATE DATABASE {quote(name)}")
        try:
            yield render(url.set(database=name))
        finally:
            with admin.connect() as conn:
                force = " WITH (FORCE)" if backend == "postgresql" else ""
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote(name)}{force}")
    finally:
        admin.dispose()


def server_version(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            return "SQLite " + str(conn.exec_driver_sql("select sqlite_version()").scalar())
        return str(conn.exec_driver_sql("select version()").scalar())


def machine_info() -> dict[str, Any]:
    import sqlalchemy

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "sqlalchemy": sqlalchemy.__version__,
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_kib"] = int(line.split()[1])
                break
    return info


def summarize(seconds: Sequence[float]) -> dict[str, Any]:
    """Latency figures in milliseconds."""
    ms = sorted(s * 1000.0 for s in seconds)
    if not ms:
        return {"n": 0}
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) > 1 else ms[0]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 4),
        "p95_ms": round(p95, 4),
        "mean_ms": round(statistics.fmean(ms), 4),
        "min_ms": round(ms[0], 4),
        "max_ms": round(ms[-1], 4),
    }


def csv(text: str) -> list[str]:
    """A comma-separated command-line value, as a list."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _dialect_list(text: str) -> list[str]:
    names = csv(text)
    unknown = sorted(set(names) - set(DIALECTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown dialects {unknown}; choose from {DIALECTS}")
    return names


def add_dialects_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dialects",
        type=_dialect_list,
        default=list(DIALECTS),
        help="comma-separated: " + ",".join(DIALECTS),
    )


def new_report(benchmark: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """A result file's header: which benchmark, run how, when, on what."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return {
        "benchmark": benchmark,
        "command": " ".join([f"python -m benchmarks.{benchmark}", *arguments]),
        "started_at": now_iso(),
        "machine": machine_info(),
    }


def log(message: str) -> None:
    """Progress on stderr, stamped with the local time (stdout stays for results)."""
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` as JSON, whole or not at all (a reader never sees half of it)."""
    report["finished_at"] = now_iso()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2, default=str) + "\n")
    partial.replace(path)
