"""A pytest plugin for budgets.py: for each lesson notebook, when its cells ran and how long they took.

budgets.py runs the whole lesson suite in one pytest process, as CI does, with ``-p lesson_timing``.
nbval makes each notebook a file of test items (one per cell); its kernel starts in the first
item's setup and stops in the last item's teardown. For each file this records each cell's summed
duration over its phases (setup, call, teardown; their sum is the lesson's time, kernel start and
stop included), the file's first start and last end on the wall clock (so the memory samples taken
in between can be told apart), and how many cells passed and failed, into the JSON file named by
``MGPU_EDU_TIMING_FILE``.
"""

from __future__ import annotations

import json
import os
import time

_files: dict[str, dict] = {}


def _entry(nodeid: str) -> dict:
    return _files.setdefault(nodeid.split("::")[0], {"start": time.time(), "end": 0.0, "passed": 0, "failed": 0,
                                                     "cells": {}})


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _entry(nodeid)


def pytest_runtest_logreport(report) -> None:  # noqa: ANN001 - pytest's TestReport
    entry = _entry(report.nodeid)
    cell = report.nodeid.split("::")[-1]
    entry["cells"][cell] = entry["cells"].get(cell, 0.0) + report.duration
    entry["end"] = time.time()
    if report.failed:
        entry["failed"] += 1
    elif report.when == "call" and report.passed:
        entry["passed"] += 1


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    target = os.environ.get("MGPU_EDU_TIMING_FILE")
    if target:
        with open(target, "w", encoding="utf-8") as out:
            json.dump(_files, out)
