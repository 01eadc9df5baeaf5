"""nbconvert preprocessors that turn an instructor lesson into a student one, as nbgrader does.

``mgpu-edu student`` runs :func:`student_preprocessors`. nbgrader's ``generate_assignment``, in a
course folder made by ``mgpu-edu nbgrader``, runs its own pipeline with :class:`ClearSolutions`
in place of nbgrader's (:func:`generate_assignment_preprocessors`), so both write the same
student cells; ``tests/test_nbgrader.py`` compares them. :class:`LockCells` and
:class:`ClearHiddenTests` follow nbgrader's rules (nbgrader/preprocessors/lockcells.py and
clearhiddentests.py, 0.9) so that ``mgpu-edu student`` works without nbgrader installed.

Needs nbconvert (the ``instructor`` extra); nbgrader only for :func:`generate_assignment_preprocessors`.
"""

from __future__ import annotations

from typing import Any

from nbconvert.preprocessors import ClearOutputPreprocessor, Preprocessor
from traitlets import Bool

from mgpu_edu.course.manifest import CELL_ROLE, student_badges
from mgpu_edu.course.markers import (
    CHECK_MARKER,
    MARKDOWN_STUB,
    STUB_COMMENT,
    STUDENT_FLAG,
    SolutionMarkerError,
    has_region,
    solution_stub,
    strip_hidden_tests,
    strip_solutions,
)


def _nbgrader(cell: Any, key: str) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get(key, False))


def is_solution(cell: Any) -> bool:
    """A cell nbgrader marks ``solution: true`` (students write in it)."""
    return _nbgrader(cell, "solution")


def is_grade(cell: Any) -> bool:
    """A cell nbgrader marks ``grade: true`` (it scores points)."""
    return _nbgrader(cell, "grade")


def is_locked(cell: Any) -> bool:
    """nbgrader's rule: grade cells and ``locked: true`` cells are locked, solution cells never."""
    return not is_solution(cell) and (is_grade(cell) or _nbgrader(cell, "locked"))


def _where(resources: dict, index: int) -> str:
    """Names the cell in an error: the notebook (nbconvert's "name", nbgrader's "unique_key") and its index."""
    return f"{resources.get('name') or resources.get('unique_key') or 'notebook'}, cell {index}"


class _Step(Preprocessor):
    """Enabled unless configured off, like nbgrader's own preprocessors (nbconvert's default is off)."""

    enabled = Bool(True).tag(config=True)


class LockCells(_Step):
    """Solution cells can't be deleted; grade cells and read-only cells can't be deleted or edited."""

    def preprocess_cell(self, cell, resources, index):
        if is_solution(cell):
            cell.metadata["deletable"] = False
        elif is_locked(cell):
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
        return cell, resources


class ClearSolutions(_Step):
    """Replace solution regions by stubs that still run, and drop nbval's ``# NBVAL_CHECK_OUTPUT`` lines.

    It also drops saved widget state, points the lesson's Colab and Binder buttons at the course's
    student versions (``student/``, not ``lessons/``, which holds the solutions), and marks the
    notebook as a student version (metadata ``mgpu_edu_student``).

    A solution cell without markers is replaced whole. With ``enforce_metadata`` (nbgrader's
    option of the same name), a solution region outside a solution cell is an error.
    """

    enforce_metadata = Bool(False, help="Raise if a solution region sits in a cell not marked "
                                        "`solution: true` (nbgrader needs the mark to grade it).").tag(config=True)

    def preprocess(self, nb, resources):
        nb, resources = super().preprocess(nb, resources)
        nb.metadata.pop("celltoolbar", None)  # as nbgrader's ClearSolutions does
        nb.metadata.pop("widgets", None)  # saved widget state would show the instructor's runs
        nb.metadata[STUDENT_FLAG] = True
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        where = _where(resources, index)
        text = cell.cell_type != "code"  # markdown and raw cells get the text stub, as in nbgrader
        if has_region(cell.source, "solution"):
            if self.enforce_metadata and not is_solution(cell):
                raise SolutionMarkerError(f"{where}: a solution region in a cell not marked as a solution cell. "
                                          "Give it nbgrader metadata `solution: true` and a grade_id.")
            cell.source = strip_solutions(cell.source, where, markdown=text)
        elif is_solution(cell):
            try:
                cell.source = MARKDOWN_STUB if text else solution_stub(cell.source)
            except SyntaxError:  # e.g. an IPython magic: nothing to keep but the comment
                cell.source = STUB_COMMENT
        if cell.cell_type == "code":
            cell.source = "\n".join(line for line in cell.source.split("\n") if line.strip() != CHECK_MARKER)
        if cell.get("metadata", {}).get(CELL_ROLE) == "badges":  # buttons that open a student version
            cell.source = student_badges(cell.source)
        return cell, resources


class ClearHiddenTests(_Step):
    """Drop ``### BEGIN HIDDEN TESTS`` … ``### END HIDDEN TESTS`` regions (nbgrader's autograde restores them)."""

    def preprocess_cell(self, cell, resources, index):
        if has_region(cell.source, "hidden tests"):
            cell.source = strip_hidden_tests(cell.source, _where(resources, index))
        return cell, resources


def student_preprocessors() -> list[Any]:
    """What ``mgpu-edu student`` runs, in nbgrader's order: lock, clear solutions, clear outputs, clear hidden tests."""
    return [LockCells(), ClearSolutions(), ClearOutputPreprocessor(enabled=True), ClearHiddenTests()]


def generate_assignment_preprocessors() -> list[type]:
    """nbgrader's generate_assignment pipeline with :class:`ClearSolutions` in place of nbgrader's.

    For ``c.GenerateAssignment.preprocessors`` in nbgrader_config.py (``mgpu-edu nbgrader`` writes it).
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.preprocessors import ClearSolutions as NbgraderClearSolutions

    default = GenerateAssignment.class_traits()["preprocessors"].default()
    return [ClearSolutions if step is NbgraderClearSolutions else step for step in default]
