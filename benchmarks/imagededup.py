"""The image-deduplication examples side by side: dbworker against Redis + Celery.

Both systems get the same generated image set (planted near-duplicate groups: resized,
re-encoded, cropped, brightened variants of a scene and of a few real photographs
bundled in scikit-image, plus unrelated scenes), the same database kind, the same
concurrency (2 hash processes), and run as their READMEs say:
the API under uvicorn, the worker service as its own process tree. The benchmark
registers the set's directory through the API, asks for the comparison at once, and
polls the API's progress until the comparison has finished.

Reported per system: wall time; images/s hashed (until the last image was hashed);
pairs/s compared (after that, until the groups were written); peak memory of the
worker's process tree; precision and recall of the duplicate pairs against the planted
truth and against the other system; and, with ``--kill`` (the default), what killing
one busy worker process (SIGKILL) a third of the way through the hashing lost or
repeated: images never hashed, hash runs committed more than once, and whether the
comparison finished at all.

    ./dev bench imagededup                      # ~3,300 images, SQLite, writes results
    ./dev bench imagededup -- --database sqlite postgresql mysql
    ./dev bench imagededup -- --groups 20 --singles 40 --output /tmp/small.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ._common import (
    DIALECTS,
    RESULTS_DIR,
    TreeMemory,
    command_line,
    cpu_seconds,
    log,
    new_report,
    process_tree,
    scratch_database,
    write_report,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REDIS_URL = os.environ.get("DBWORKER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SYSTEMS = ("dbworker", "celery")
CONCURRENCY = 2


def _examples_importable() -> None:
    # The examples are top-level packages of examples/, as their READMEs run them.
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


def _pairs(groups: Sequence[frozenset[str]]) -> set[frozenset[str]]:
    return {frozenset(p) for g in groups for p in itertools.combinations(sorted(g), 2)}


def _agreement(found: set[frozenset[str]], truth: set[frozenset[str]]) -> dict[str, Any]:
    hits = len(found & truth)
    return {
        "pairs_found": len(found),
        "pairs_expected": len(truth),
        "precision": round(hits / len(found), 4) if found else None,
        "recall": round(hits / len(truth), 4) if truth else None,
    }


class _Service:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, **kw: Any):
        self.log_path = log_path
        self._out = log_path.open("wb")
        self.popen = subprocess.Popen(
            argv, cwd=EXAMPLES, env=env, stdout=self._out, stderr=subprocess.STDOUT, **kw
        )

    def stop(self, timeout: float = 60) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            return None
        finally:
            self._out.close()


def _busiest_handler(root: int) -> int | None:
    """The busiest leaf of the worker's tree: a handler process at work. Leaves only,
    so never a supervisor or dbworker's fork server (whose children the handler
    processes are); never multiprocessing's resource tracker."""
    tree = process_tree([root])
    leaves = [
        pid
        for pid in tree
        if pid != root
        and process_tree([pid]) == [pid]
        and "resource_tracker" not in command_line(pid, 400)
    ]
    return max(leaves, key=lambda pid: cpu_seconds([pid]), default=None)


def run_system(
    system: str, database_url: str, images: Path, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(EXAMPLES), *sys.path]),
        "IMAGEDEDUP_DATABASE_URL": database_url,
        "IMAGEDEDUP_MEDIA": str(work / "media"),
        "IMAGEDEDUP_HASH_CONCURRENCY": str(CONCURRENCY),
        "IMAGEDEDUP_REDIS_URL": REDIS_URL,
        "IMAGEDEDUP_CELERY_QUEUE": f"imagededup-bench-{uuid.uuid4().hex}",
    }
    package = f"imagededup_{system}"
    if system == "dbworker":
        worker_argv = [sys.executable, "-m", "imagededup_dbworker.worker"]
    else:
        worker_argv = [sys.executable, "-m", "celery", "-A", "imagededup_celery.tasks", "worker"]
        worker_argv += ["--concurrency", str(CONCURRENCY), "--loglevel", "WARNING"]
        worker_argv += ["--without-gossip", "--without-mingle"]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    api_argv = [sys.executable, "-m", "uvicorn", f"{package}.api:app", "--fd", str(sock.fileno())]
    api = _Service(api_argv, env, work / "api.log", pass_fds=[sock.fileno()])
    sock.close()
    worker: _Service | None = None
    result: dict[str, Any] = {"system": system}
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.get("/health").raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or api.popen.poll() is not None:
                    output = api.log_path.read_text()
                    raise RuntimeError(f"the API did not start: {output}") from None
                time.sleep(0.1)
        worker = _Service(worker_argv, env, work / "worker.log")
        memory = TreeMemory([worker.popen.pid]).start()
        time.sleep(2.0)  # let the worker service start before the clock does
        collection = client.post("/collections", json={"name": "bench"}).json()["id"]
        started = time.monotonic()
        client.post(f"/collections/{collection}/directory", json={"path": str(images)})
        client.post(f"/collections/{collection}/compare").raise_for_status()
        hashed_at: float | None = None
        killed: dict[str, Any] | None = None
        total = None
        finished = False
        deadline = started + args.timeout
        while time.monotonic() < deadline:
            progress = client.get(f"/collections/{collection}").json()
            total = progress["images"]
            now = time.monotonic()
            if args.kill and killed is None and progress["hashed"] >= total // 3:
                victim = _busiest_handler(worker.popen.pid)
                if victim is not None:
                    killed = {
                        "pid": victim,
                        "cmd": command_line(victim),
                        "at_hashed": progress["hashed"],
                    }
                    os.kill(victim, signal.SIGKILL)
                    log(f"{system}: killed {victim} ({killed['cmd']}) at {progress['hashed']}")
            if hashed_at is None and progress["hashed"] == total:
                hashed_at = now
            if progress["compare"] == "finished":
                finished = True
                break
            time.sleep(0.1)
        ended = time.monotonic()
        result["memory"] = memory.stop()
        result["memory"].pop("at_peak", None)
        groups = client.get(f"/collections/{collection}/groups").json()["groups"]
        result["found_groups"] = [sorted(i["filename"] for i in g["images"]) for g in groups]
        result.update(
            completed=finished,
            images=total,
            wall_seconds=round(ended - started, 3),
            hash_seconds=round(hashed_at - started, 3) if hashed_at else None,
            images_per_second=round(total / (hashed_at - started), 1)
            if hashed_at and total
            else None,
            pairs_compared=progress["pairs_compared"],
            pages_compared=progress["pages_compared"],
            compare_seconds=round(ended - hashed_at, 3) if finished and hashed_at else None,
            # Below half a second the 0.1 s polling makes a rate meaningless.
            pairs_per_second=(
                round(progress["pairs_compared"] / (ended - hashed_at))
                if finished and hashed_at and ended - hashed_at >= 0.5
                else None
            ),
            killed=killed,
            last_progress=progress,
        )
        result["kill_effects"] = _kill_effects(database_url, system)
    finally:
        if worker is not None:
            result["worker_exit"] = worker.stop()
        result["api_exit"] = api.stop()
    return result


def _kill_effects(database_url: str, system: str) -> dict[str, Any]:
    import sqlalchemy as sa

    from imagededup_shared.models import Image

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            runs = [row[0] for row in conn.execute(sa.select(Image.hash_runs))]
            crashed = None
            if system == "dbworker":
                # dbworker's own record of the kill: the item whose process died.
                query = "SELECT count(*) FROM dbworker_hash WHERE crashes > 0"
                crashed = conn.exec_driver_sql(query).scalar()
    finally:
        engine.dispose()
    return {
        "items_recording_a_crash": crashed,
        "images_never_hashed": sum(1 for r in runs if r == 0),
        "images_hashed_more_than_once": sum(1 for r in runs if r > 1),
        "repeated_hash_runs": sum(r - 1 for r in runs if r > 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=600, help="planted duplicate groups")
    parser.add_argument("--singles", type=int, default=1200, help="unrelated images")
    parser.add_argument(
        "--photographs",
        type=int,
        default=6,
        help="real photographs (bundled in scikit-image) planted with all four variants",
    )
    parser.add_argument(
        "--database",
        nargs="+",
        choices=DIALECTS,
        default=["sqlite"],
        help="one or more; each gets both systems, reported under databases.NAME",
    )
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--no-kill", dest="kill", action="store_false")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "imagededup.json")
    args = parser.parse_args(argv)
    _examples_importable()
    from imagededup_shared import samples

    report = new_report("imagededup", argv)
    with tempfile.TemporaryDirectory(prefix="dbw_imagededup_") as scratch:
        root = Path(scratch)
        log(
            f"generating {args.groups} groups, {args.singles} singles"
            f" and {args.photographs} photographs"
        )
        sample_set = samples.generate(
            root / "images",
            groups=args.groups,
            singles=args.singles,
            photographs=args.photographs,
        )
        truth = _pairs(sample_set.groups)
        report["image_set"] = {
            "images": len(sample_set.files),
            "planted_groups": len(sample_set.groups),
            "planted_pairs": len(truth),
            "variants": list(samples.VARIANTS),
            "photographs": [
                f"skimage/data/{name}" for name in samples.PHOTOGRAPHS[: args.photographs]
            ],
        }
        report.update(concurrency=CONCURRENCY, kill=args.kill, databases={})
        for database in args.database:
            report["databases"][database] = _run_database(database, root, truth, args)
    write_report(args.output, report)
    log(f"wrote {args.output}")


def _run_database(
    database: str, root: Path, truth: set[frozenset[str]], args: argparse.Namespace
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    report: dict[str, Any] = {}
    for system in args.systems:
        work = root / database / system
        work.mkdir(parents=True)
        with scratch_database(database, f"dedup_{system}") as url:
            log(f"{system}: running on {database}")
            results[system] = run_system(system, url, root / "images", args, work)
        found = _pairs([frozenset(g) for g in results[system].pop("found_groups")])
        results[system]["vs_truth"] = _agreement(found, truth)
        results[system]["_pairs"] = found
        log(f"{system} on {database}: {_summary(results[system])}")
    if len(results) == 2:
        a, b = (results[s]["_pairs"] for s in SYSTEMS)
        report["dbworker_vs_celery"] = _agreement(a, b)
    for value in results.values():
        value.pop("_pairs")
    report["results"] = results
    return report


def _summary(result: dict[str, Any]) -> str:
    keys = ("completed", "wall_seconds", "images_per_second", "pairs_per_second")
    return (
        ", ".join(f"{k} {result.get(k)}" for k in keys)
        + f", {result['vs_truth']}, {result['kill_effects']}"
    )


if __name__ == "__main__":
    main()
