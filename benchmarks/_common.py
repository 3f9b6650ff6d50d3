"""What the benchmarks share: scratch databases, machine facts, arguments, reports, and
the memory and CPU of process trees.

SQLAlchemy is imported where it is used, not at import time: the reference runners'
child processes (``benchmarks.limit``) import this module and run on raw drivers alone.
"""

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
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL

DIALECTS = ("sqlite", "postgresql", "mysql")
#: The executors dbworker's throughput may be measured with (``Coordinator``'s names).
EXECUTORS = ("pool", "subprocess")
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
    from sqlalchemy.engine import make_url

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
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

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


def new_report(
    benchmark: str, argv: Sequence[str] | None, module: str | None = None
) -> dict[str, Any]:
    """A result file's header: which benchmark, run how (``module``: the module run, when
    it is not named as the benchmark), when, on what."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return {
        "benchmark": benchmark,
        "command": " ".join([f"python -m benchmarks.{module or benchmark}", *arguments]),
        "started_at": now_iso(),
        "machine": machine_info(),
    }


def append_line(path: str, line: str) -> None:
    """Append ``line`` to the file at ``path`` in one write (O_APPEND): whole lines from
    several processes at once."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


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


# -- process trees (Linux /proc) ----------------------------------------------------------

#: Clock ticks per second, the unit of /proc/<pid>/stat's CPU times.
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_tree(roots: Sequence[int]) -> list[int]:
    """``roots`` and every live descendant of theirs (children of any of their threads)."""
    found: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited
        found.append(pid)
        for tid in threads:
            with contextlib.suppress(OSError):
                stack.extend(
                    int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                )
    return found


def _kib_fields(path: str, wanted: Sequence[str]) -> dict[str, int]:
    """``Name:   123 kB`` lines of a /proc file, in KiB (missing file: empty)."""
    values: dict[str, int] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return values
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in wanted:
            values[name] = int(rest.split()[0])
    return values


def command_line(pid: int, limit: int = 120) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:limit]


def _cpu_busy_and_total() -> tuple[int, int]:
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_for_quiet_machine(
    busy_below: float = 0.1, window: float = 0.25, longest: float = 15.0
) -> float:
    """Write out the page cache, then wait until the machine's CPUs are less than
    ``busy_below`` busy over ``window`` seconds (at most ``longest``); return how long
    that took.

    Between measurements the machine goes on working for a while (the kernel writing
    back the files a run dirtied, such as a SQLite database and its WAL; PostgreSQL's
    background writer and checkpointer; InnoDB purging old row versions): a measurement
    started at once pays for the one before it, and always the same one in a
    round-robin. Every system is measured after the same wait.
    """
    started = time.monotonic()
    os.sync()
    while True:
        busy0, total0 = _cpu_busy_and_total()
        time.sleep(window)
        busy1, total1 = _cpu_busy_and_total()
        quiet = (busy1 - busy0) < busy_below * max(1, total1 - total0)
        waited = time.monotonic() - started
        if quiet or waited >= longest:
            return waited


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time the processes ``pids`` have used so far (their own, not
    their reaped children's)."""
    ticks = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces: count fields after its ')'.
        fields = stat.rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return ticks / _CLOCK_TICKS


def tree_cpu_seconds(roots: Sequence[int]) -> float:
    return cpu_seconds(process_tree(roots))


class TreeMemory:
    """Samples the resident memory of process trees from a thread, keeping the peak.

    Per sample: the sum over the trees' processes of VmRSS (what ``ps`` shows; pages
    shared between processes, e.g. after a fork, count once per process) and of PSS
    (each shared page split between its sharers, so the sum is the trees' real share
    of memory). ``rss_hwm_sum_kib`` adds each process's own peak (VmHWM) instead: an
    upper bound that no sampling interval can miss.
    """

    def __init__(self, roots: Sequence[int], interval: float = 0.1) -> None:
        self.roots = list(roots)
        self.interval = interval
        self.samples = 0
        self.peak_rss_kib = 0
        self.peak_pss_kib = 0
        self.at_peak: list[dict[str, Any]] = []
        self._hwm: dict[int, int] = {}
        self._commands: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._report: dict[str, Any] | None = None

    def add_roots(self, pids: Sequence[int]) -> None:
        self.roots.extend(pids)

    def sample(self) -> None:
        rss_total = pss_total = 0
        processes = []
        for pid in process_tree(self.roots):
            status = _kib_fields(f"/proc/{pid}/status", ("VmRSS", "VmHWM"))
            if "VmRSS" not in status:
                continue
            pss = _kib_fields(f"/proc/{pid}/smaps_rollup", ("Pss",)).get("Pss", 0)
            self._hwm[pid] = max(self._hwm.get(pid, 0), status.get("VmHWM", 0))
            if pid not in self._commands:
                self._commands[pid] = command_line(pid)
            rss_total += status["VmRSS"]
            pss_total += pss
            processes.append(
                {"pid": pid, "rss_kib": status["VmRSS"], "pss_kib": pss, "cmd": self._commands[pid]}
            )
        self.samples += 1
        if rss_total > self.peak_rss_kib:
            self.peak_rss_kib = rss_total
            self.at_peak = processes
        self.peak_pss_kib = max(self.peak_pss_kib, pss_total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> TreeMemory:
        # The first sample before the caller's clock starts: walking /proc and reading
        # smaps_rollup (a few ms, holding this process's GIL) would otherwise delay what
        # the caller times first (the application's INSERT of a drain, a send).
        self.sample()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling (one last sample first) and say what was seen (again, if called
        again)."""
        if self._report is not None:
            return self._report
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self._report = {
            "peak_rss_kib": self.peak_rss_kib,
            "peak_pss_kib": self.peak_pss_kib,
            "rss_hwm_sum_kib": sum(self._hwm.values()),
            "processes": len(self.at_peak),
            "at_peak": self.at_peak,
            "samples": self.samples,
            "interval_ms": round(self.interval * 1000),
        }
        return self._report
