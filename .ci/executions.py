"""How many times `make test` ran each lesson, read from the log its test runs wrote (conftest.py's
``note_execution``): each lesson must run exactly once in each environment that runs whole lessons
(Colab-like, Binder-like: 2 runs in all, within the budget of 3), and its student version exactly once (in
the main environment, under nbgrader). A run of a lesson's
widget cells alone (the browser tests) is listed, not counted as a run of the lesson.

Usage: python .ci/executions.py build/executions.tsv      (exit status 1 if a count is off)
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mgpu_edu import course  # noqa: E402 - after the path is set

ENVIRONMENTS = ("colab", "binder")  # MGPU_EDU_PLATFORM of the Colab-like and Binder-like runs


def main(log: Path) -> int:
    if not log.exists():
        print(f"{log} is missing: no test run noted an execution (run `make test`, which sets MGPU_EDU_EXECUTION_LOG)")
        return 1
    runs = Counter(tuple(line.split("\t")) for line in log.read_text(encoding="utf-8").splitlines() if line)
    files = [lesson.file for lesson in course.load(ROOT / "lessons").lessons]
    print("| lesson | " + " | ".join(f"{env} (nbval)" for env in ENVIRONMENTS) + " | lesson runs | student version "
          "runs | widget's cells (browser) |\n|---|" + "---:|" * (len(ENVIRONMENTS) + 3))
    problems = []
    for file in files:
        per_env = [runs[(env, "lesson", file)] for env in ENVIRONMENTS]
        lessons = sum(n for (_, kind, f), n in runs.items() if kind == "lesson" and f == file)
        students = sum(n for (_, kind, f), n in runs.items() if kind == "student version" and f == file)
        widgets = sum(n for (_, kind, f), n in runs.items() if kind == "widget's cells" and f == file)
        print(f"| {file} | " + " | ".join(map(str, per_env)) + f" | {lessons} | {students} | {widgets} |")
        if per_env != [1] * len(ENVIRONMENTS) or lessons != len(ENVIRONMENTS):
            problems.append(f"{file} ran {per_env} times in {ENVIRONMENTS} ({lessons} in all): once in each, please")
        if students != 1:
            problems.append(f"{file}'s student version ran {students} times: once, please")
    unknown = sorted({f for (_, _, f) in runs} - set(files))
    problems += [f"{f} ran but is no lesson in lessons/course.toml" for f in unknown]
    for line in problems:
        print(f"EXECUTION COUNT WRONG: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "executions.tsv"))
