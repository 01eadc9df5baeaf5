"""Student versions of the lessons, and grading of what students hand back.

The lessons are nbgrader notebooks. Each exercise is a *solution cell* (nbgrader metadata
``solution: true``) whose answer sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``,
then a locked *grade cell* (``grade: true``, with points) that calls a check from
:mod:`mgpu_edu.check`, followed by an assert between ``### BEGIN HIDDEN TESTS`` and
``### END HIDDEN TESTS``.

A student version (``mgpu-edu student``, or nbgrader's ``generate_assignment`` configured by
``mgpu-edu nbgrader``: both use :mod:`mgpu_edu.preprocessors`) replaces each solution with a stub
that still runs: the names the solution defined are set to ``...``, which every check reports
as "not solved yet", so a student version runs top to bottom. (nbgrader's own stub raises
NotImplementedError, which would stop the notebook at the first exercise.) The hidden asserts are
dropped, so students see friendly feedback; nbgrader's ``autograde`` puts them back, so a grade
cell fails, and scores zero, unless its check said "correct".

Markers are matched the way nbgrader matches them: any line that contains "BEGIN SOLUTION"
starts a region, so keep those words out of prose in the lessons.

Grading is :mod:`mgpu_edu.course.grading`. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mgpu_edu.course.manifest import MANIFEST, STUDENT
from mgpu_edu.course.markers import CHECK_CALL, has_region


def student_version(nb: Any, name: str = "notebook") -> Any:
    """Return a student copy of an nbformat notebook, as nbgrader's generate_assignment makes it.

    Cells are locked where nbgrader locks them, solutions become stubs, outputs are cleared and
    hidden tests and saved widget state dropped (:func:`mgpu_edu.preprocessors.student_preprocessors`).
    """
    import copy

    from mgpu_edu.course.preprocessors import student_preprocessors

    nb = copy.deepcopy(nb)
    resources: dict[str, Any] = {"name": name}
    for preprocessor in student_preprocessors():
        nb, resources = preprocessor(nb, resources)
    return nb


def _notebooks(source: Path, example: str = "mgpu-edu student my-lessons handout") -> list[Path]:
    """The notebooks of source (a notebook, or a folder of them); errors give example, the command that was run."""
    if not source.exists():
        raise FileNotFoundError(f"{str(source)!r} does not exist. Give a lesson notebook or a folder of them, "
                                f"for example: {example}")
    if source.is_file():
        if source.suffix != ".ipynb":
            raise ValueError(f"{str(source)!r} is not a notebook (.ipynb). Give a lesson notebook or a folder.")
        return [source]
    found = sorted(p for p in source.glob("*.ipynb") if not p.name.startswith("."))
    if not found:
        raise FileNotFoundError(f"{str(source)!r} holds no .ipynb notebooks. Point at the lessons folder, "
                                f"for example: {example}")
    return found


def _read_notebook(path: Path) -> Any:
    """A lesson notebook read with nbformat; a file that isn't one is a ValueError naming it."""
    import nbformat

    try:
        return nbformat.read(path, as_version=4)
    except (ValueError, KeyError, AttributeError) as error:  # NotJSONError is a ValueError; so is a bad schema
        raise ValueError(f"{str(path)!r} is not a notebook file ({' '.join(str(error).split())[:120]}): "
                         "remove it from the folder, or replace it with the .ipynb it should be") from None


def without_exercises(paths: Sequence[Path]) -> list[Path]:
    """The notebooks among paths that hold no exercise: no solution region and no ``check.*`` call.

    Read as plain JSON, so it works without nbformat. An unreadable file counts as one without.
    """
    import json

    empty = []
    for path in paths:
        try:
            cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
            text = "\n".join("".join(c.get("source", "")) for c in cells)
        except (OSError, ValueError, AttributeError):
            text = ""
        if not (has_region(text) or CHECK_CALL.search(text)):
            empty.append(Path(path))
    return empty


def write_student_versions(source: Path, destination: Path, force: bool = False) -> list[Path]:
    """Write student versions of source (a notebook or a folder) into the folder destination.

    Refuses, with FileExistsError, to overwrite existing notebooks unless force is True, and
    never writes into the source folder itself. Returns the files written.
    """
    import nbformat

    source, destination = Path(source), Path(destination)
    notebooks = _notebooks(source)
    if destination.exists() and not destination.is_dir():
        raise FileExistsError(f"{str(destination)!r} exists and is not a folder. Give a folder for the "
                              "student versions, for example: handout")
    if destination.resolve() == (source if source.is_dir() else source.parent).resolve():
        raise ValueError(f"{str(destination)!r} is the folder the instructor versions are in: writing there "
                         "would replace them. Choose another folder, for example: handout")
    targets = [destination / path.name for path in notebooks]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise FileExistsError(f"{len(existing)} student notebook(s) already exist, e.g. {existing[0]!r}. "
                              "Pass --force to overwrite them, or choose an empty folder.")
    converted = []
    for path in notebooks:  # convert all before writing any, so a bad notebook leaves nothing half-done
        converted.append(student_version(_read_notebook(path), name=path.name))
    destination.mkdir(parents=True, exist_ok=True)
    for nb, target in zip(converted, targets, strict=True):
        nbformat.write(nb, target)
    manifest = source / MANIFEST if source.is_dir() else None
    if manifest is not None and manifest.is_file():  # the student folder is a course of its own
        (destination / MANIFEST).write_bytes(manifest.read_bytes())
        targets.append(destination / MANIFEST)
    return targets


def refresh_student_folder(lessons: Path, student: Path, folder: str = STUDENT) -> list[Path]:
    """Bring the course's student folder up to date with its lessons; return the files changed.

    ``student`` gets a student version of every lesson in ``lessons``' manifest, with its badges
    and Colab install cell pointing at ``folder`` in the course's repository at its ref (what a
    learner's Colab or Binder button opens), and nothing else: no manifest, which a learner's file
    browser would show among the lessons. Only files that differ are written, and notebooks of
    lessons no longer in the manifest are removed, so running it twice changes nothing. ``make lessons``
    and ``mgpu-edu badges`` run it; nothing in ``student`` is edited by hand.
    """
    import nbformat

    from mgpu_edu.course import manifest as course

    lessons, student = Path(lessons), Path(student)
    known = course.load(lessons)
    wanted: dict[Path, str] = {}
    for lesson in known.lessons:
        nb = student_version(nbformat.read(lessons / lesson.file, as_version=4), name=lesson.file)
        course.configure_notebook(nb, lesson.file, known.repo, known.ref, folder, gpu=lesson.tensorflow)
        text = nbformat.writes(nb)
        wanted[student / lesson.file] = text if text.endswith("\n") else text + "\n"
    student.mkdir(parents=True, exist_ok=True)
    changed = []
    for path, text in wanted.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for path in [*sorted(student.glob("*.ipynb")), student / MANIFEST]:
        if path.exists() and path not in wanted:  # a lesson that left the manifest, or a manifest written earlier
            path.unlink()
            changed.append(path)
    return changed


NBGRADER_CONFIG = """\
# nbgrader configuration for the mgpu_edu lessons, written by `mgpu-edu nbgrader`.
from mgpu_edu import preprocessors

c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = {course_id!r}
# Solutions become stubs that still run, as `mgpu-edu student` makes them, instead of nbgrader's
# `raise NotImplementedError()`, which would stop a student's notebook at the first exercise.
c.GenerateAssignment.preprocessors = preprocessors.generate_assignment_preprocessors()
c.ClearSolutions.enforce_metadata = True
# The lessons train models: give a cell up to 10 minutes (nbgrader's default is 30 seconds).
c.Execute.timeout = 600
"""


def write_nbgrader_course(source: Path, course: Path, course_id: str = "mgpu_edu", force: bool = False) -> list[Path]:
    """Make (or add to) an nbgrader course folder: one assignment per lesson, and its nbgrader_config.py.

    Each notebook in source goes to ``course/source/<its name without .ipynb>/``. Refuses, with
    FileExistsError, to overwrite files already there unless force is True. Returns the files written
    (files already up to date are left alone and not listed).
    """
    source, course = Path(source), Path(course)
    notebooks = _notebooks(source, example="mgpu-edu nbgrader lessons course")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", course_id):
        raise ValueError(f"course id {course_id!r} may hold only letters, digits, '_', '.' and '-'; "
                         "try --course-id mgpu_edu")
    if course.exists() and not course.is_dir():
        raise FileExistsError(f"{str(course)!r} exists and is not a folder. Give a folder for the nbgrader course, "
                              "for example: course")
    targets = {course / "nbgrader_config.py": NBGRADER_CONFIG.format(course_id=course_id).encode()}
    for path in notebooks:
        _read_notebook(path)  # a file that isn't a notebook is refused here, before anything is written
        targets[course / "source" / path.stem / path.name] = path.read_bytes()
    existing = [str(t) for t in targets if t.exists() and t.read_bytes() != targets[t]]
    if existing and not force:
        raise FileExistsError(f"{len(existing)} file(s) in the course folder differ from what this would write, "
                              f"e.g. {existing[0]!r}. Pass --force to overwrite them, or choose another folder.")
    written = []
    for target, content in targets.items():
        if target.exists() and target.read_bytes() == content:
            continue  # already up to date
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        written.append(target)
    return written
