"""Student versions: solutions become runnable stubs, and every lesson's student version runs top to bottom
in a fresh kernel with every check saying "not solved yet"."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from mgpu_edu import assignments, course

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
FILES = [lesson.file for lesson in course.load(LESSONS).lessons]


def test_solution_stubs_keep_indentation_and_markdown_answers():
    source = "if True:\n    ### BEGIN SOLUTION\n    a, (b, *c) = 1, (2, 3)\n    ### END SOLUTION\n    print(a)"
    assert assignments.strip_solutions(source) == (
        "if True:\n    # YOUR CODE HERE: replace ... with your answer.\n    a = ...\n    b = ...\n    c = ...\n"
        "    print(a)")
    text = "Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION"
    assert assignments.strip_solutions(text, markdown=True) == "Why?\nYOUR ANSWER HERE"
    assert assignments.solution_stub("print('no names')") == "# YOUR CODE HERE"
    with pytest.raises(assignments.SolutionMarkerError, match="line 2.*without"):
        assignments.strip_solutions("x\n### END SOLUTION")
    with pytest.raises(assignments.SolutionMarkerError, match="again before"):
        assignments.strip_solutions("### BEGIN SOLUTION\n### BEGIN SOLUTION")
    with pytest.raises(assignments.SolutionMarkerError, match="not valid Python"):
        assignments.strip_solutions("### BEGIN SOLUTION\nx = (\n### END SOLUTION")


@pytest.mark.parametrize("file", FILES)
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


@pytest.mark.parametrize("file", FILES)
def test_instructor_version_stores_a_correct_answer_for_every_exercise(file):
    results = assignments.exercise_results(nbformat.read(LESSONS / file, as_version=4), file)
    assert len(results) >= 2
    assert [r.status for r in results] == ["correct"] * len(results), results
    # and nbval compares those stored outputs with a fresh run: each check cell is a checked cell
    nb = nbformat.read(LESSONS / file, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and assignments._CHECK_CALL.search(cell.source):
            assert cell.source.startswith(assignments.CHECK_MARKER) and assignments.BEGIN in cell.source
