"""A two-lesson course for the grading tests, and the class that hands it in: honest students and forgers.

The lessons are as small as a lesson can be and still be one (nbgrader prompt, answer and check cells,
a course.toml), so a batch of twenty notebooks grades in seconds: lesson 01 needs no TensorFlow;
lesson 02 places tensors on two logical CPUs, and its check takes the devices the lesson set up.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from mgpu_edu import assignments

MANIFEST = """\
[course]
repo = "example/course"
ref = "main"

[[lesson]]
file = "01_mini.ipynb"
title = "Mini"
minutes = 5
checks = ["ring_bytes", "combine_function"]
tensorflow = false

[[lesson]]
file = "02_placed.ipynb"
title = "Placed"
minutes = 5
checks = ["spread_function", "ring_steps"]
"""

RING = "answer = 2 * (6 - 1) / 6 * 6_000_000"
COMBINE = "def combine(sums, counts):\n    return sum(sums) / sum(counts)"
SPREAD = ("def spread(values):\n    tensors = []\n    for i, value in enumerate(values):\n"
          "        with tf.device(layout[i % len(layout)]):\n            tensors.append(tf.constant(value))\n"
          "    return tensors")


def _metadata(grade_id: str, **flags: object) -> dict:
    return {"nbgrader": {"grade": False, "grade_id": grade_id, "locked": False, "schema_version": 3,
                         "solution": False, "task": False, **flags}}


def _exercise(number: int, answer: str, check: str) -> list:
    return [new_markdown_cell(f"**Exercise {number}.**", metadata=_metadata(f"ex{number}_prompt", locked=True)),
            new_code_cell(f"### BEGIN SOLUTION\n{answer}\n### END SOLUTION", metadata=_metadata(
                f"ex{number}_answer", solution=True)),
            new_code_cell(f"feedback = check.{check}\n### BEGIN HIDDEN TESTS\nassert feedback.correct, feedback\n"
                          "### END HIDDEN TESTS", metadata=_metadata(f"ex{number}_check", grade=True, locked=True,
                                                                      points=1))]


def write_course(folder: Path) -> Path:
    """The course (instructor versions) in folder; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "course.toml").write_text(MANIFEST)
    mini = new_notebook(cells=[new_markdown_cell("# 01 · Mini"), new_code_cell("from mgpu_edu import check"),
                               *_exercise(1, RING, "ring_bytes(answer, n=6, nbytes=6_000_000)"),
                               *_exercise(2, COMBINE, "combine_function(combine)")])
    placed = new_notebook(cells=[
        new_markdown_cell("# 02 · Placed"),
        new_code_cell("from mgpu_edu import check, setup_devices\nlayout = setup_devices(2)\n"
                      "import tensorflow as tf"),
        *_exercise(1, SPREAD, "spread_function(spread, layout)"),
        *_exercise(2, "answer = 2 * (8 - 1)", "ring_steps(answer, n=8)")])
    for nb, name in ((mini, "01_mini.ipynb"), (placed, "02_placed.ipynb")):
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / name)
    return folder


def student(course: Path, lesson: str = "01_mini.ipynb") -> nbformat.NotebookNode:
    """The student version of a lesson, as handed out."""
    return assignments.student_version(nbformat.read(course / lesson, as_version=4), name=lesson)


def _answer(nb: nbformat.NotebookNode, number: int, source: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"ex{number}_answer")
    cell.source = source
    return nb


def _check_cell(nb: nbformat.NotebookNode, number: int) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"ex{number}_check")


def solved(course: Path, ring: str = RING, combine: str = COMBINE) -> nbformat.NotebookNode:
    return _answer(_answer(student(course), 1, ring), 2, combine)


#: The forgery the guide's threat model starts from: replace every check by one that prints "correct".
PATCH_CHECKS = """\
import mgpu_edu
for name in dir(mgpu_edu.check):
    if not name.startswith("_") and callable(getattr(mgpu_edu.check, name)):
        setattr(mgpu_edu.check, name, lambda *a, **k: print("✅ Correct"))
answer = ..."""

PATCH_LIBRARIES = """\
import builtins, math, numpy, types
from mgpu_edu import check
math.isclose = lambda *a, **k: True
numpy.isclose = numpy.allclose = lambda *a, **k: True
builtins.print = lambda *a, **k: None
check._report = lambda status, message: types.SimpleNamespace(status="correct", message=message, correct=True)
check.Feedback.correct = property(lambda self: True)
answer = 0"""

ALWAYS_EQUAL = """\
class Anything(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__
answer = Anything(0.0)"""

# a kernel that replaces the capture itself can hand over an answer of its choosing (as anyone can, by
# writing it), but no verdict: these keys mean nothing to the grader
FORGED_CAPTURE = """\
from mgpu_edu.course import answers
from IPython.display import publish_display_data
import json
def forged(token, check, answer, arguments):
    publish_display_data({answers.MIME: json.dumps({"token": token, "status": "correct", "points": 1,
                                                     "verdict": "correct"})})
answers.capture = forged
answer = ..."""

PRINTED = 'answer = ...\nprint("✅ Correct: 10,000,000 bytes")'

ENDLESS = "while True:\n    pass"
DEAF_LOOP = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
MEMORY_BOMB = "hoard = []\nwhile True:\n    hoard.append(bytearray(50 * 2**20))"
KILL_LAUNCHER = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(5)\nanswer = ..."


def vandal(targets: list[Path]) -> str:
    """A cell that tries to delete, overwrite and read files outside its folder, then answers with what it read."""
    paths = [str(p) for p in targets]
    return (f"import os, shutil\nstolen = None\nfor path in {paths!r}:\n"
            "    for attempt in (lambda: open(path).read(), lambda: open(path, 'w').write('x'),\n"
            "                    lambda: os.remove(path), lambda: shutil.rmtree(os.path.dirname(path))):\n"
            "        try:\n            stolen = attempt() or stolen\n        except Exception:\n            pass\n"
            "answer = 10_000_000 if stolen else ...")


def lingerer(marker: str) -> str:
    """A cell that starts processes meant to outlive it: one detached, one in a new session, one double-forked."""
    return ("import os, subprocess, sys\n"
            f"code = 'import time; time.sleep(600)  # {marker}'\n"
            "subprocess.Popen([sys.executable, '-c', code])\n"
            "subprocess.Popen([sys.executable, '-c', code], start_new_session=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n        os.execv(sys.executable, [sys.executable, '-c', code])\n"
            "    os._exit(0)\n"
            f"{RING}")


def caller(port: int) -> str:
    """A cell that tries to reach a server on the grader's machine, and answers only if it can."""
    return ("import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'leak')\n"
            f"    {RING}\nexcept OSError:\n    answer = ...")


def class_of(course: Path, folder: Path, port: int, marker: str) -> dict[str, tuple[float | None, str]]:
    """Write every submission into folder; return each file's (expected points, or None, expected total status)."""
    folder.mkdir(parents=True, exist_ok=True)
    handed = student(course)
    honest = {
        "honest": (solved(course), 2),
        "unsolved": (handed, 0),
        "half": (solved(course, combine="def combine(sums, counts):\n    return sum(s / c for s, c in "
                                       "zip(sums, counts)) / len(sums)"), 1),
        "wrong": (solved(course, ring="answer = 6_000_000", combine="def combine(sums, counts):\n    return 0"), 0),
    }
    deleted = solved(course)
    deleted.cells = [c for c in deleted.cells if "check" not in c.metadata.get("nbgrader", {}).get("grade_id", "")]
    honest["checks-deleted"] = (deleted, 2)  # its true grade: the course's checks are put back
    moved = solved(course)
    cell = _check_cell(moved, 1)
    moved.cells.remove(cell)
    moved.cells.insert(1, cell)  # before its answer: it would check nothing
    honest["check-moved"] = (moved, 2)
    split = solved(course)  # the first answer over two cells, the check after the second
    answer_cell = next(c for c in split.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_answer")
    answer_cell.source = "n, size = 6, 6_000_000"
    split.cells.insert(split.cells.index(answer_cell) + 1, new_code_cell("answer = 2 * (n - 1) / n * size"))
    honest["answer-split"] = (split, 2)
    pasted = solved(course)  # an old attempt above the final answer, pasted with the same nbgrader id
    answer_cell = next(c for c in pasted.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_answer")
    old_try = copy.deepcopy(answer_cell)
    old_try.source = "answer = 6_000_000"
    pasted.cells.insert(pasted.cells.index(answer_cell), old_try)
    honest["answer-pasted-twice"] = (pasted, 2)
    forgeries = {
        "printed": _answer(handed, 1, PRINTED),
        "patched-checks": _answer(handed, 1, PATCH_CHECKS),
        "patched-libraries": _answer(handed, 1, PATCH_LIBRARIES),
        "always-equal": _answer(handed, 1, ALWAYS_EQUAL),
        "forged-capture": _answer(handed, 1, FORGED_CAPTURE),
        "endless-loop": _answer(handed, 1, ENDLESS),
        "memory-bomb": _answer(handed, 1, MEMORY_BOMB),
        "kills-its-launcher": _answer(handed, 1, KILL_LAUNCHER),
        "vandal": _answer(handed, 1, vandal([folder / "honest.ipynb", folder.parent / "grades.csv"])),
        "lingerer": _answer(handed, 1, lingerer(marker)),
        "caller": _answer(handed, 1, caller(port)),
    }
    edited = copy.deepcopy(handed)
    _check_cell(edited, 1).source = "answer = 0\nfeedback = check.ring_bytes(answer, n=1, nbytes=0)"
    _check_cell(edited, 2).source = "print('✅ Correct')"
    forgeries["checks-edited"] = edited
    stored = copy.deepcopy(handed)  # outputs that claim success, on a notebook whose answers are unsolved
    for cell in stored.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ Correct: yes\n")]
            cell.execution_count = 1
    forgeries["stored-outputs"] = stored
    deaf = _answer(handed, 2, DEAF_LOOP)  # exercise 1 solved, then a loop that ignores interrupts
    deaf = _answer(deaf, 1, RING)
    expected: dict[str, tuple[float | None, str]] = {}
    for name, (nb, points) in honest.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
        expected[name] = (points, "graded")
    for name, nb in forgeries.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
        expected[name] = (0, "graded")
    expected["lingerer"] = (1, "graded")  # it answered the first exercise; its processes are what it tests
    # a name and an error a spreadsheet would run as formulas, were they not kept as text
    raised = '"raised": [\'=HYPERLINK("http://example.com")\', "x"],\n'
    formula = _answer(handed, 1, FORGED_CAPTURE.replace('"status": "correct", "points": 1,\n', raised))
    nbformat.write(formula, folder / "=2+3.ipynb")
    expected["=2+3"] = (0, "graded")
    nbformat.write(deaf, folder / "deaf-loop.ipynb")
    expected["deaf-loop"] = (1, "graded")  # its first exercise was right before the loop: it keeps that point
    bom = folder / "byte-order-mark.ipynb"  # saved by an editor that marks UTF-8
    bom.write_text("\ufeff" + nbformat.writes(solved(course)), encoding="utf-8")
    expected["byte-order-mark"] = (2, "graded")
    odd = json.loads(nbformat.writes(solved(course)))
    odd["cells"][2]["metadata"] = {"nbgrader": "x", "mgpu_edu_check": 7}  # metadata of the wrong shape
    odd["cells"][3]["metadata"]["mgpu_edu_timeout"] = -1  # and the grader's own keys, which it drops
    (folder / "odd-cells.ipynb").write_text(json.dumps(odd))
    expected["odd-cells"] = (2, "graded")
    wrong_ids = json.loads(nbformat.writes(solved(course)))
    wrong_ids["cells"].append({"cell_type": "nonsense", "source": 5})
    for cell in wrong_ids["cells"]:
        cell.get("metadata", {}).get("nbgrader", {})["grade_id"] = ["x"]
        cell.pop("metadata", None) if cell["cell_type"] == "markdown" else None
    (folder / "no-ids.ipynb").write_text(json.dumps(wrong_ids))
    expected["no-ids"] = (None, "failed")  # not a valid notebook: one row, with the reason
    (folder / "empty.ipynb").write_text("")
    expected["empty"] = (None, "failed")
    (folder / "essay.ipynb").write_text("Dear professor, my notebook is attached.")
    expected["essay"] = (None, "failed")
    nbformat.write(student(course, "02_placed.ipynb"), folder / "other-lesson.ipynb")
    expected["other-lesson"] = (None, "wrong lesson")
    return expected
