"""Measure `mgpu-edu grade` on a class: COPIES copies of one lesson's solved notebook, JOBS at a time.

Usage (from the repository root, inside the dev environment):

    python benchmarks/grading.py                      # 30 copies of lesson 03, --jobs 2, into build/benchmarks/
    python benchmarks/grading.py --lesson 01 --copies 10 --jobs 1
    python benchmarks/grading.py --commit             # into the tracked benchmarks/results-grading.md

Each copy is the instructor version of the lesson (every exercise solved), so every notebook runs to the
end and must grade full marks; the script fails if one doesn't. The wall time is the whole command's,
from start to the CSV, as an instructor would wait for it; the per-notebook times are what the grader
reports for each (kernel start to verdicts). Measured, never asserted: a busy machine is slower.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lesson", default="03", help="lesson number or file stem (default 03)")
    parser.add_argument("--copies", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--commit", action="store_true", help="write benchmarks/results-grading.md")
    args = parser.parse_args()
    [lesson] = [p for p in sorted((ROOT / "lessons").glob("*.ipynb")) if p.stem.startswith(args.lesson)]
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as folder:
        handed = Path(folder) / "handed-in"
        handed.mkdir()
        for k in range(args.copies):
            shutil.copy(lesson, handed / f"student{k:03d}.ipynb")
        command = [str(Path(sys.executable).parent / "mgpu-edu"), "grade", "handed-in", "--lesson", lesson.stem,
                   "--jobs", str(args.jobs), "--csv", "grades.csv"]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
            return 1
        rows = list(csv.DictReader((Path(folder) / "grades.csv").read_text().splitlines()))
        totals = [r for r in rows if r["exercise"] == "total"]
        full = [r for r in totals if r["points"] == r["max_points"] and float(r["points"]) > 0]
        if len(full) != args.copies:
            print(f"only {len(full)} of {args.copies} copies graded full marks", file=sys.stderr)
            return 1
        seconds = [float(line.rsplit(" in ", 1)[1].split()[0]) for line in done.stderr.splitlines()
                   if line.startswith("graded ") and " in " in line]
    lines = [
        "# Grading a class (benchmarks/grading.py)", "",
        f"`mgpu-edu grade` on {args.copies} copies of {lesson.name} (solved), `--jobs {args.jobs}`, "
        f"on {os.cpu_count()} cores ({platform.machine()}, Python {platform.python_version()}).", "",
        "| measure | value |", "|---|---:|",
        f"| wall time, whole batch | {wall:.0f} s |",
        f"| per notebook (median, kernel start to verdicts) | {statistics.median(seconds):.0f} s |" if seconds else "",
        f"| notebooks per minute | {60 * args.copies / wall:.1f} |",
        f"| notebooks graded full marks | {len(full)} of {args.copies} |", "",
    ]
    text = "\n".join(line for line in lines if line is not None) + "\n"
    target = ROOT / "benchmarks" / "results-grading.md" if args.commit else ROOT / "build" / "benchmarks" / "grading.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
