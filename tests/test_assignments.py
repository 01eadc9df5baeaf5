"""Student versions: solutions become runnable stubs; each exercise is an nbgrader prompt, answer and check.
(Every lesson's student version runs once per `make test`, under nbgrader: tests/test_nbgrader.py.)"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from mgpu_edu import assignments, course, markers
from mgpu_edu.course import grading

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
FILES = [lesson.file for lesson in course.load(LESSONS).lessons]


def test_solution_stubs_keep_indentation_and_markdown_answers():
    source = "if True:\n    ### BEGIN SOLUTION\n    a, (b, *c) = 1, (2, 3)\n    ### END SOLUTION\n    print(a)"
    assert markers.strip_solutions(source) == (
        "if True:\n    # YOUR CODE HERE: replace ... with your answer.\n    a = ...\n    b = ...\n    c = ...\n"
        "    print(a)")
    text = "Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION"
    assert markers.strip_solutions(text, markdown=True) == "Why?\nYOUR ANSWER HERE"
    assert markers.solution_stub("print('no names')") == "# YOUR CODE HERE"
    with pytest.raises(markers.SolutionMarkerError, match="line 2.*without"):
        markers.strip_solutions("x\n### END SOLUTION")
    with pytest.raises(markers.SolutionMarkerError, match="again before"):
        markers.strip_solutions("### BEGIN SOLUTION\n### BEGIN SOLUTION")
    with pytest.raises(markers.SolutionMarkerError, match="not valid Python"):
        markers.strip_solutions("### BEGIN SOLUTION\nx = (\n### END SOLUTION")


def test_markers_are_found_where_nbgrader_finds_them():
    # nbgrader's ClearSolutions and ClearHiddenTests match any line that *contains* the words, so a
    # mention in prose opens a region too; the course does the same, so both agree on every notebook
    assert markers.strip_solutions("a\nsee BEGIN SOLUTION here\nb\nEND SOLUTION.\nc", markdown=True) == \
        "a\nYOUR ANSWER HERE\nc"
    grade = "f = check.x(answer)\n### BEGIN HIDDEN TESTS\nassert f.correct, f\n### END HIDDEN TESTS\nprint(1)"
    assert markers.strip_hidden_tests(grade) == "f = check.x(answer)\nprint(1)"
    with pytest.raises(markers.SolutionMarkerError, match="BEGIN HIDDEN TESTS.*never closed"):
        markers.strip_hidden_tests("### BEGIN HIDDEN TESTS\nassert False")


def exercises(nb) -> list[tuple[int, int, int]]:
    """(prompt, answer, check) cell indexes of each exercise, from the nbgrader metadata."""
    ids = {c.metadata["nbgrader"]["grade_id"]: i for i, c in enumerate(nb.cells) if "nbgrader" in c.metadata}
    count = len(ids) // 3
    assert sorted(ids) == sorted(f"ex{n}_{part}" for n in range(1, count + 1) for part in ("prompt", "answer", "check"))
    return [(ids[f"ex{n}_prompt"], ids[f"ex{n}_answer"], ids[f"ex{n}_check"]) for n in range(1, count + 1)]


@pytest.mark.parametrize("file", FILES)
def test_every_exercise_is_an_nbgrader_prompt_answer_and_check(file):
    nb = nbformat.read(LESSONS / file, as_version=4)
    found = exercises(nb)
    assert len(found) >= 2
    for n, (prompt, answer, grade) in enumerate(found, start=1):
        assert (prompt, answer) == (grade - 2, grade - 1), "prompt, answer and check follow each other"
        p, a, g = (nb.cells[i] for i in (prompt, answer, grade))
        assert p.cell_type == "markdown" and p.source.startswith(f"**Exercise {n}.**")
        assert p.metadata.nbgrader == {"grade": False, "grade_id": f"ex{n}_prompt", "locked": True,
                                       "schema_version": 3, "solution": False, "task": False}
        assert a.metadata.nbgrader == {"grade": False, "grade_id": f"ex{n}_answer", "locked": False,
                                       "schema_version": 3, "solution": True, "task": False}
        assert g.metadata.nbgrader == {"grade": True, "grade_id": f"ex{n}_check", "locked": True, "points": 1,
                                       "schema_version": 3, "solution": False, "task": False}
        assert a.source.startswith(markers.BEGIN) and a.source.endswith(markers.END)
        # the check: nbval compares its stored output with a fresh run, and nbgrader's hidden assert fails
        # unless the check said "correct"
        assert g.source.startswith(markers.CHECK_MARKER + "\n") and markers.CHECK_CALL.search(g.source)
        assert g.source.endswith(f"\n{markers.HIDDEN_BEGIN}\nassert feedback.correct, feedback\n"
                                 f"{markers.HIDDEN_END}")
    # no marker words anywhere else: nbgrader would take them for markers
    for i, cell in enumerate(nb.cells):
        if i not in {a for _, a, _ in found}:
            assert not markers.has_region(cell.source, "solution"), i
        if i not in {g for _, _, g in found}:
            assert not markers.has_region(cell.source, "hidden tests"), i
        # nbgrader's other markers would change cells too
        assert not any(word in cell.source for word in ("MARK SCHEME", "AUTOTEST")), i


@pytest.mark.parametrize("file", FILES)
def test_instructor_version_stores_a_correct_answer_for_every_exercise(file):
    results = grading.stored_results(nbformat.read(LESSONS / file, as_version=4), file)
    assert len(results) >= 2
    assert [r.status for r in results] == ["correct"] * len(results), results


def test_student_version_follows_nbgrader_cell_by_cell_kind():
    def cell(kind, source, **nbgrader):
        made = nbformat.v4.new_code_cell(source) if kind == "code" else (
            nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_raw_cell(source))
        if nbgrader:
            made.metadata["nbgrader"] = {"grade_id": f"c{len(source)}", "schema_version": 3, **nbgrader}
        return made

    nb = nbformat.v4.new_notebook(cells=[
        cell("markdown", "**Task.**", locked=True),
        cell("code", "%time answer = 1", solution=True),  # no markers, not Python: the whole cell goes
        cell("code", "# NBVAL_CHECK_OUTPUT\nok = check.x(answer)\n### BEGIN HIDDEN TESTS\nassert ok\n"
                     "### END HIDDEN TESTS", grade=True, points=1),
        cell("raw", "### BEGIN SOLUTION\nfree text\n### END SOLUTION", solution=True),
        cell("code", "x = 1"),
    ])
    student = assignments.student_version(nb)
    assert [c.source for c in student.cells] == [
        "**Task.**", markers.STUB_COMMENT, "ok = check.x(answer)", markers.MARKDOWN_STUB, "x = 1"]
    locks = [(c.metadata.get("editable"), c.metadata.get("deletable")) for c in student.cells]
    assert locks == [(False, False), (None, False), (False, False), (None, False), (None, None)]
    nb.cells.append(cell("code", "y = 2\n### END SOLUTION"))  # nbgrader would drop the line without a word
    with pytest.raises(markers.SolutionMarkerError, match="cell 5, line 2.*without"):
        assignments.student_version(nb)
