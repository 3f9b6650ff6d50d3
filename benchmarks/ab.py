"""Two checkouts of dbworker, side by side: a benchmark run from each in turn, round
after round, and the medians compared.

For a change that must not cost speed (a refactor): this machine's speed drifts by
more than the few percent such a change may cost, so the two trees alternate within
each round (the order swapped every round) instead of being measured an hour apart.
Each tree runs the benchmark with its own interpreter (its ``.venv``) and its own code;
the figures compared are dbworker's items per second (``throughput``), pickup p50
and p95 with wake-ups (``latency``), and drain seconds, alone and over Celery's in the
same run (``io``).

    python -m benchmarks.ab --base ../base-checkout --rounds 3 throughput
    python -m benchmarks.ab --base ../base-checkout --rounds 3 latency
    python -m benchmarks.ab --base ../base-checkout --rounds 3 io --modes asyncio
    python -m benchmarks.ab --base ../base-checkout throughput --dialects sqlite

Results go to ``benchmarks/results/ab_<benchmark>.json`` (``--output``): every run's
figures, and per figure the medians, this tree's median over the base's, and the
ratio within each round (this over base, run back to back): the machine's speed has
drifted by up to 2x within one A/B run, which moves both trees' medians, while the
ratios within rounds keep the comparison (``round_ratios``, their median
``round_median`` and how many rounds came out above 1, ``rounds_above``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import RESULTS_DIR, log, new_report, write_report

HERE = Path(__file__).resolve().parents[1]

#: The benchmark's arguments for one quick run per tree (no peers: only dbworker
#: changes between the trees).
ARGUMENTS = {
    "throughput": [
        "--sizes",
        "3000",
        "--repeat",
        "1",
        "--no-celery",
        "--no-limit",
        "--no-floor",
    ],
    "latency": [
        "--items",
        "30",
        "--min-gap",
        "0.2",
        "--max-gap",
        "1.0",
        "--modes",
        "notify",
        "--no-celery",
        # Left out for a tree from before the pickup limit (56140d1), which has no such option.
        "--no-limit",
        "--idle-seconds",
        "0",
    ],
    # Celery runs too: the machine's speed drifts between rounds, its ratio less.
    "io": ["--repeat", "1", "--no-celery-writes"],
}


def figures(benchmark: str, report: dict[str, Any]) -> dict[str, float]:
    """The figures one run of ``benchmark`` gives, by name."""
    found: dict[str, float] = {}
    if benchmark == "throughput":
        for name, sizes in report["results"].items():
            if name.startswith("dbworker/"):
                for size, result in sizes.items():
                    found[f"{name}/{size} items/s"] = float(result["items_per_second"])
    elif benchmark == "io":
        for name, medians in report["medians"].items():
            if name.startswith("dbworker_"):
                found[f"{name} seconds"] = float(medians["seconds"])
                found[f"{name} x Celery threads"] = float(medians["seconds_vs_celery"])
    else:
        for name, run in report["runs"].items():
            if name.startswith("dbworker/") and "pickup" in run:
                found[f"{name} pickup p50 ms"] = float(run["pickup"]["p50_ms"])
                found[f"{name} pickup p95 ms"] = float(run["pickup"]["p95_ms"])
    return found


def run(tree: Path, benchmark: str, extra: Sequence[str]) -> dict[str, float]:
    arguments = ARGUMENTS[benchmark]
    if not (tree / "benchmarks" / "latency_limit.py").exists():
        arguments = [a for a in arguments if a != "--no-limit" or benchmark != "latency"]
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "report.json"
        command = [
            str(tree / ".venv" / "bin" / "python"),
            "-m",
            f"benchmarks.{benchmark}",
            *arguments,
            *extra,
            "--output",
            str(output),
        ]
        log(f"{tree}: {' '.join(command[1:])}")
        subprocess.run(command, cwd=tree, check=True)
        return figures(benchmark, json.loads(output.read_text()))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__)
    parser.add_argument("benchmark", choices=sorted(ARGUMENTS))
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path)
    # Whatever else is given goes to the benchmark (e.g. --dialects sqlite).
    args, extra = parser.parse_known_args(argv)
    extra = [arg for arg in extra if arg != "--"]
    benchmark: str = args.benchmark
    trees = {"this": HERE, "base": args.base.resolve()}
    report = new_report("ab", argv)
    report["trees"] = {
        name: subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.strip()
        for name, tree in trees.items()
    }
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    for round_ in range(args.rounds):
        order = ["this", "base"] if round_ % 2 == 0 else ["base", "this"]
        for name in order:
            runs.append({"round": round_, "tree": name, **run(trees[name], benchmark, extra)})
    report["runs"] = runs
    comparison: dict[str, dict[str, Any]] = {}
    keys = sorted({key for r in runs for key in r if key not in ("round", "tree")})
    for key in keys:
        medians = {
            name: statistics.median(float(r[key]) for r in runs if r["tree"] == name and key in r)
            for name in trees
        }
        by_round = {(r["round"], r["tree"]): float(r[key]) for r in runs if key in r}
        ratios = [
            round(by_round[(n, "this")] / by_round[(n, "base")], 3)
            for n in range(args.rounds)
            if (n, "this") in by_round and by_round.get((n, "base"))
        ]
        comparison[key] = {
            **medians,
            "this_over_base": round(medians["this"] / medians["base"], 3),
            "round_ratios": ratios,
            "round_median": round(statistics.median(ratios), 3) if ratios else float("nan"),
            "rounds_above": sum(ratio > 1 for ratio in ratios),
        }
    report["comparison"] = comparison
    report["total_seconds"] = round(time.monotonic() - started, 1)
    output = args.output or RESULTS_DIR / f"ab_{benchmark}.json"
    write_report(output, report)
    for key, row in comparison.items():
        log(
            f"{key}: this {row['this']:.3f}, base {row['base']:.3f} ({row['this_over_base']}x);"
            f" within rounds {row['round_median']}x, above 1 in {row['rounds_above']}"
            f" of {len(row['round_ratios'])}"
        )


if __name__ == "__main__":
    main()
