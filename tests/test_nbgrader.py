"""nbgrader 0.9 itself, offline, in a temporary course folder made by ``mgpu-edu nbgrader``.

- ``nbgrader generate_assignment`` on every lesson writes the same student cells as ``mgpu-edu student``;
- ``nbgrader autograde`` runs every lesson's untouched student version: every cell runs, every check
  says "not solved yet", and nbgrader gives it zero points. This is the one run of each student
  version in ``make test``;
- it gives the instructor's version full points, graded from the outputs stored in lessons/ (made by
  ``make lessons``) without running it: in the same ``make test``, nbval runs every lesson in the
  Colab-like and Binder-like environments and fails if a cell raises or a check cell prints other
  feedback than it stored, so those runs reproduce the stored outputs (``make test-main`` alone
  doesn't check that). That grading reads the outputs is checked too: an error stored in a check cell costs
  its point;
- on lesson 03's exercises (a notebook of just them, which runs in a second), a solved student copy
  gets full points, and one whose locked checks were edited zero (nbgrader restores them); one whose
  check cells were deleted gets zero, and one that replaces the checks full points unsolved (nbgrader's
  limits, which docs/instructors.md states);
- ``nbgrader generate_feedback`` writes an HTML report for each.

The kernels of the runs above are forked from one process that has imported TensorFlow and Keras
(``tests/warm_kernels.py``): each starts without importing them again, but those of lessons 15 and 16,
which must import TensorFlow themselves.

The scores go to build/nbgrader/scores.md (git-ignored), for the record. Every test here is marked
``lessons``: it runs whole lessons (``make check`` and the oldest-Python job leave them out).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from warm_kernels import warm_kernels

from mgpu_edu import assignments, course, markers
from mgpu_edu.course import grading

# nbgrader and nbconvert come with the dev extra, not with a learner's or Colab's install: they are
# imported when these tests run (and fail them if missing), not when pytest collects this file, so
# `pytest tests -m widgets` collects in the Colab-like environment (.ci/env-colab).

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
FILES = [lesson.file for lesson in course.load(LESSONS).lessons]
STUDENTS = {"instructor": "the instructor's version, solutions in", "untouched": "the student version, untouched"}
EXERCISES = "03_exercises"  # lesson 03's exercises alone, for the solved, edited, deleted and patched copies
#: An answer cell that replaces every check with one that says "correct" (nbgrader's hidden asserts then pass).
PATCH_CHECKS = """\
import types, mgpu_edu
for name in dir(mgpu_edu.check):
    if not name.startswith("_") and callable(getattr(mgpu_edu.check, name)):
        setattr(mgpu_edu.check, name, lambda *a, **k: types.SimpleNamespace(correct=True))
answer = ..."""

pytestmark = pytest.mark.lessons


def is_solution(cell) -> bool:
    from mgpu_edu.course.preprocessors import is_solution

    return is_solution(cell)


def is_grade(cell) -> bool:
    from mgpu_edu.course.preprocessors import is_grade

    return is_grade(cell)


def gradebook(course_dir: Path):
    """The course's gradebook, opened as nbgrader's own tools open it."""
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}", course_id="mgpu_edu")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a command with this environment's scripts first on PATH (nbgrader runs `alembic` by name)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, (f"{' '.join(args)} failed:\n{_errors(done.stderr)}\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-6000:]}")
    return done


def _errors(log: str) -> str:
    """Each error nbgrader logged, with the lines after it (its traceback): a batch's failure is often far
    above the tail of its log."""
    lines, starts = log.splitlines(), []
    for i, line in enumerate(lines):
        if ("| ERROR]" in line or line.startswith("Traceback")) and (not starts or i >= starts[-1] + 30):
            starts.append(i)
    return "\n".join("\n".join(lines[i:i + 30]) for i in starts[:5])[-8000:]


def nbgrader(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = run(sys.executable, "-m", "nbgrader", *args, cwd=cwd)
    assert "[ERROR]" not in done.stderr and "| ERROR]" not in done.stderr, _errors(done.stderr) or done.stderr[-6000:]
    return done


def exercises_only(lesson: Path):
    """The lesson cut down to its exercises (each prompt, answer and check) after one cell that imports check."""
    nb = nbformat.read(lesson, as_version=4)
    nb.cells = [nbformat.v4.new_code_cell("from mgpu_edu import check")] + [
        c for c in nb.cells if "nbgrader" in c.metadata]
    return nb


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A course folder, as `mgpu-edu nbgrader` makes it, after `nbgrader generate_assignment` on every lesson
    (and on lesson 03's exercises alone)."""
    root = tmp_path_factory.mktemp("nbgrader")
    run(sys.executable, "-m", "mgpu_edu", "nbgrader", str(LESSONS), "course", cwd=root)
    course_dir = root / "course"
    (course_dir / "source" / EXERCISES).mkdir()
    target = course_dir / "source" / EXERCISES / f"{EXERCISES}.ipynb"
    nbformat.write(exercises_only(LESSONS / "03_allreduce.ipynb"), target)
    nbgrader("generate_assignment", "*", cwd=course_dir)
    return course_dir


def submit(course_dir: Path, student: str, stem: str, nb) -> None:
    target = course_dir / "submitted" / student / stem / f"{stem}.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(nb, target)


@pytest.fixture(scope="module")
def graded(released, executions) -> Path:
    """Every lesson's submissions, autograded, with feedback generated."""
    # the instructor's versions, graded from their stored outputs, not run (see the module's docstring); and
    # one with an error stored in lesson 03's first check, to show the grade comes from those outputs
    for file in FILES:
        submit(released, "instructor", file.removesuffix(".ipynb"), nbformat.read(LESSONS / file, as_version=4))
    broken = nbformat.read(LESSONS / "03_allreduce.ipynb", as_version=4)
    first_check = next(c for c in broken.cells if is_grade(c))
    first_check.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="wrong", traceback=[])]
    submit(released, "stored-error", "03_allreduce", broken)
    for student in ("instructor", "stored-error"):
        nbgrader("autograde", "*", "--student", student, "--ClearOutput.enabled=False", "--Execute.enabled=False",
                 cwd=released)
    # the untouched student versions, run: the one run of each in `make test`
    for file in FILES:
        stem = file.removesuffix(".ipynb")
        submit(released, "untouched", stem, nbformat.read(released / "release" / stem / file, as_version=4))
    with warm_kernels():  # forked from a process that has imported TensorFlow (tests/warm_kernels.py)
        nbgrader("autograde", "*", "--student", "untouched", cwd=released)
    for file in FILES:
        executions("student version", file)
    # two students on lesson 03's exercises: one solved the handed-out copy, one "fixed" its locked checks instead
    source = nbformat.read(released / "source" / EXERCISES / f"{EXERCISES}.ipynb", as_version=4)
    answers = [c.source for c in source.cells if is_solution(c)]
    solved = nbformat.read(released / "release" / EXERCISES / f"{EXERCISES}.ipynb", as_version=4)
    for cell, answer in zip([c for c in solved.cells if is_solution(c)], answers, strict=True):
        cell.source = "\n".join(line for line in answer.split("\n") if "SOLUTION" not in line)
    edited = nbformat.read(released / "release" / EXERCISES / f"{EXERCISES}.ipynb", as_version=4)
    for cell in edited.cells:
        if is_grade(cell):
            cell.source = "feedback = 'correct'"
    deleted = nbformat.from_dict(copy.deepcopy(dict(solved)))  # solved, its check cells deleted
    deleted.cells = [c for c in deleted.cells if not is_grade(c)]
    patched = nbformat.read(released / "release" / EXERCISES / f"{EXERCISES}.ipynb", as_version=4)
    next(c for c in patched.cells if is_solution(c)).source = PATCH_CHECKS
    submit(released, "solved", EXERCISES, solved)
    submit(released, "edited", EXERCISES, edited)
    submit(released, "deleted", EXERCISES, deleted)
    submit(released, "patched", EXERCISES, patched)
    with warm_kernels():
        nbgrader("autograde", EXERCISES, cwd=released)
    nbgrader("generate_feedback", "*", cwd=released)
    scores = {}
    with gradebook(released) as gb:
        for file in FILES:
            stem = file.removesuffix(".ipynb")
            scores[stem] = {student: (gb.find_submission(stem, student).score,
                                      gb.find_submission(stem, student).max_score) for student in STUDENTS}
    record = ROOT / "build" / "nbgrader" / "scores.md"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("| lesson | " + " | ".join(STUDENTS.values()) + " |\n|---|---:|---:|\n" + "".join(
        f"| {stem} | " + " | ".join(f"{s:g} / {m:g}" for s, m in row.values()) + " |\n"
        for stem, row in scores.items()), encoding="utf-8")
    return released


@pytest.mark.parametrize("file", FILES)
def test_generate_assignment_writes_what_mgpu_edu_student_writes(released, file):
    stem = file.removesuffix(".ipynb")
    theirs = nbformat.read(released / "release" / stem / file, as_version=4)
    ours = assignments.student_version(nbformat.read(LESSONS / file, as_version=4), name=file)

    def cells(nb):
        return [(c.cell_type, c.source, c.get("outputs"), c.metadata.get("editable"), c.metadata.get("deletable"))
                for c in nb.cells]

    assert cells(ours) == cells(theirs)
    assert ours.metadata == theirs.metadata
    # and it is a student version: stubs instead of solutions, no hidden asserts, checks locked
    code = "\n".join(c.source for c in theirs.cells if c.cell_type == "code")
    assert markers.BEGIN not in code and "assert feedback.correct" not in code
    assert code.count(markers.STUB_COMMENT) == len(course.load(LESSONS).lesson(file).checks)
    checks = [c for c in theirs.cells if is_grade(c)]
    assert checks and all(c.metadata.editable is False and c.metadata.deletable is False for c in checks)


@pytest.mark.parametrize("file", FILES)
def test_autograde_gives_the_solutions_full_points_and_the_untouched_version_zero(graded, file):
    stem = file.removesuffix(".ipynb")
    with gradebook(graded) as gb:
        instructor = gb.find_submission(stem, "instructor")
        untouched = gb.find_submission(stem, "untouched")
        points = sum(cell.max_score for cell in gb.find_notebook(stem, stem).grade_cells)
        assert points == instructor.max_score == len(course.load(LESSONS).lesson(file).checks)
        assert instructor.score == points
        assert untouched.score == 0
    # the untouched version ran top to bottom: only its exercise checks failed, each with "not solved yet"
    nb = nbformat.read(graded / "autograded" / "untouched" / stem / file, as_version=4)
    failed = [c for c in nb.cells if c.cell_type == "code" and any(o.output_type == "error" for o in c.outputs)]
    assert failed == [c for c in nb.cells if is_grade(c)]
    for cell in failed:
        [error] = [o for o in cell.outputs if o.output_type == "error"]
        assert error.ename == "AssertionError" and error.evalue.startswith("⏳ Not solved yet"), error.evalue
        cell.outputs = [o for o in cell.outputs if o.output_type != "error"]  # nbgrader's hidden assert, not ours
    # and, without the hidden asserts, it is what a student sees: each check printed "not solved yet"
    results = grading.stored_results(nb, file)
    assert len(results) == points
    assert [r.status for r in results] == ["unsolved"] * len(results), results
    assert all(r.message for r in results)
    for student in STUDENTS:
        html = (graded / "feedback" / student / stem / f"{stem}.html").read_text(encoding="utf-8")
        expected = points if student == "instructor" else 0
        assert f"{stem} (Score: {expected:.1f} / {points:.1f})" in html, html[:2000]


def test_autograde_scores_a_solved_student_copy_and_restores_edited_checks(graded):
    with gradebook(graded) as gb:
        assert gb.find_submission(EXERCISES, "solved").score == 2
        assert gb.find_submission(EXERCISES, "edited").score == 0  # its checks were put back, and failed
        # nbgrader's limits, as docs/instructors.md states them: a deleted check cell isn't put back (the
        # solved answers score nothing), and the checks run in the student's kernel, so an answer cell that
        # replaces them scores full points unsolved. `mgpu-edu grade` gives these 2 and 0 (tests/test_grading.py).
        assert gb.find_submission(EXERCISES, "deleted").score == 0
        assert gb.find_submission(EXERCISES, "patched").score == 2
    nb = nbformat.read(graded / "autograded" / "edited" / EXERCISES / f"{EXERCISES}.ipynb", as_version=4)
    assert all("assert feedback.correct" in c.source for c in nb.cells if is_grade(c))


def test_grading_without_running_reads_the_stored_outputs(graded):
    with gradebook(graded) as gb:
        assert gb.find_submission("03_allreduce", "stored-error").score == 1  # of 2: the check with an error
