"""Student versions of every lesson run top to bottom in a fresh kernel, and every check says "not solved yet"."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from mgpu_edu import assignments, course

LESSONS = Path(__file__).resolve().parents[1] / "lessons"


@pytest.mark.parametrize("file", [file for file, _ in course.LESSONS])
def test_student_version_runs_and_reports_not_solved_yet(tmp_path, file):
    [student] = assignments.write_student_versions(LESSONS / file, tmp_path / "student")
    nb = assignments.run_notebook(student, timeout=300)
    errors = [(i, o.get("ename"), o.get("evalue")) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
              for o in cell.outputs if o.output_type == "error"]
    assert errors == [], f"the student version of {file} raised: {errors}"
    results = assignments.exercise_results(nb, file)
    assert len(results) >= 2
    assert [r.status for r in results] == ["unsolved"] * len(results), results
    assert all(r.message for r in results)
    # the run wrote nothing next to the instructor lessons
    assert not any(p.name.startswith(Path(file).stem) and p.suffix != ".ipynb" for p in LESSONS.iterdir())


@pytest.mark.parametrize("file", [file for file, _ in course.LESSONS])
def test_instructor_version_stores_a_correct_answer_for_every_exercise(file):
    results = assignments.exercise_results(nbformat.read(LESSONS / file, as_version=4), file)
    assert len(results) >= 2
    assert [r.status for r in results] == ["correct"] * len(results), results
    # and nbval compares those stored outputs with a fresh run: each check cell is a checked cell
    nb = nbformat.read(LESSONS / file, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and assignments._CHECK_CALL.search(cell.source):
            assert cell.source.startswith(assignments.CHECK_MARKER) and assignments.BEGIN in cell.source
