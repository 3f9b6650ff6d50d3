"""The micro-benchmarks that drive dbworker's private parts still run (on SQLite, a few
items each): ``pass_cost`` broke unseen when the scheduler learned to read rows with
its claims (its stand-in executor had no ``uses_rows``), and was found broken only
when next needed. Nothing is timed here: a run must finish and write its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

QUICK = {
    "pass_cost": ["--passes", "5", "--warmup", "1", "--repeat", "1"],
    "child_path": ["--items", "20", "--warmup", "2", "--repeat", "1"],
    "group_path": ["--items", "20", "--group", "1,4", "--repeat", "1"],
    "limits_cost": ["--items", "20", "--repeat", "1", "--mode", "micro", "--warmup", "2"],
    "batch_insert": ["--rows", "2,3", "--batches", "3", "--repeat", "1"],
    "statement_cost": ["--statements", "5", "--repeat", "1"],
}


@pytest.mark.parametrize("benchmark", sorted(QUICK))
def test_the_benchmark_runs(benchmark: str, tmp_path: Path) -> None:
    output = tmp_path / f"{benchmark}.json"
    command = [sys.executable, "-m", f"benchmarks.{benchmark}", "--dialects", "sqlite"]
    done = subprocess.run(
        [*command, *QUICK[benchmark], "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(output.read_text())["finished_at"]


def test_the_pickup_trace_finds_its_stages(tmp_path: Path) -> None:
    """``benchmarks.latency --trace``: the marks the worker service and its handler
    processes buffer reach the file, and each stage is found in them."""
    output = tmp_path / "latency.json"
    quick = ["--items", "4", "--warmup", "1", "--min-gap", "0.02", "--max-gap", "0.05"]
    alone = ["--modes", "notify", "--idle-seconds", "0", "--no-celery", "--no-limit"]
    command = [sys.executable, "-m", "benchmarks.latency", "--dialects", "sqlite"]
    done = subprocess.run(
        [*command, *quick, *alone, "--trace", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stages = json.loads(output.read_text())["runs"]["dbworker/sqlite/notify"]["stages"]
    for stage in ("notify", "discover", "claim", "to_dispatch", "to_process", "load_and_call"):
        assert stages[stage]["n"] >= 3, stages
