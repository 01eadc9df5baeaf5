"""Student versions of the lessons, and grading of what students hand back.

Solutions in the lessons sit between nbgrader's markers, ``### BEGIN SOLUTION`` and
``### END SOLUTION``. :class:`ClearSolutions` is an nbconvert preprocessor that replaces each
such region with a stub that still runs: the names the solution defined are set to ``...``,
which every check in :mod:`mgpu_edu.check` reports as "not solved yet", so a student version
runs top to bottom. (nbgrader's own stub raises NotImplementedError, which would stop the
notebook at the first exercise.)

Nothing here imports TensorFlow; grading runs notebooks in their own kernels.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from pathlib import Path
from typing import Any

from mgpu_edu.course import MANIFEST

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
#: The line that tells nbval to compare a cell's output; student versions drop it.
CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
STUB_COMMENT = "# YOUR CODE HERE"
MARKDOWN_STUB = "YOUR ANSWER HERE"
#: Notebook metadata flag written into every student version.
STUDENT_FLAG = "mgpu_edu_student"

_CHECK_CALL = re.compile(r"\bcheck\.(\w+)\(")
_STATUS = {"✅ Correct": "correct", "❌ Not yet right": "wrong", "⏳ Not solved yet": "unsolved"}


class SolutionMarkerError(ValueError):
    """A notebook's solution markers don't pair up, or a solution isn't valid Python."""


def _defined_names(tree: ast.Module) -> list[ast.AST | str]:
    """Functions (as nodes) and other names (as strings) a solution defines, in order, once each."""
    found: list[ast.AST | str] = []
    seen: set[str] = set()

    def add(item: ast.AST | str, name: str) -> None:
        if name not in seen:
            seen.add(name)
            found.append(item)

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            add(node.id, node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                targets(element)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                add(node, node.name)
            elif isinstance(node, ast.ClassDef):
                add(node.name, node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    targets(target)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                visit(handler.body)

    visit(tree.body)
    return found


def solution_stub(solution: str) -> str:
    """The runnable stub that replaces one solution region (without indentation).

    Example:
        >>> print(solution_stub("answer = 2 * (8 - 1)"))
        # YOUR CODE HERE: replace ... with your answer.
        answer = ...
        >>> print(solution_stub("def combine(sums, counts):\\n    return sum(sums) / sum(counts)"))
        # YOUR CODE HERE: replace ... with your answer.
        def combine(sums, counts):
            return ...
    """
    tree = ast.parse(textwrap.dedent(solution))
    lines = [f"{STUB_COMMENT}: replace ... with your answer."]
    for item in _defined_names(tree):
        if isinstance(item, str):
            lines.append(f"{item} = ...")
        else:
            keyword = "async def" if isinstance(item, ast.AsyncFunctionDef) else "def"
            lines += [f"{keyword} {item.name}({ast.unparse(item.args)}):", "    return ..."]
    if len(lines) == 1:
        lines[0] = STUB_COMMENT
    return "\n".join(lines)


def strip_solutions(source: str, where: str = "cell", markdown: bool = False) -> str:
    """Replace every ``### BEGIN SOLUTION`` … ``### END SOLUTION`` region of a cell's source.

    Code regions become :func:`solution_stub`; markdown regions become "YOUR ANSWER HERE".
    Raises SolutionMarkerError, naming ``where``, if the markers don't pair up.

    Example:
        >>> print(strip_solutions("x = 1\\n### BEGIN SOLUTION\\nanswer = 42\\n### END SOLUTION\\nprint(answer)"))
        x = 1
        # YOUR CODE HERE: replace ... with your answer.
        answer = ...
        print(answer)
    """
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped == BEGIN:
            if region is not None:
                raise SolutionMarkerError(f"{where}, line {number}: {BEGIN!r} again before {END!r}. "
                                          "Close each solution before opening the next.")
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if region is None:
                raise SolutionMarkerError(f"{where}, line {number}: {END!r} without a {BEGIN!r} before it.")
            if markdown:
                stub = MARKDOWN_STUB
            else:
                try:
                    stub = solution_stub("\n".join(region))
                except SyntaxError as error:
                    raise SolutionMarkerError(f"{where}: the solution ending on line {number} is not valid "
                                              f"Python ({error.msg}). Fix it in the instructor version.") from None
            out += [indent + stub_line if stub_line else "" for stub_line in stub.splitlines()]
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise SolutionMarkerError(f"{where}: {BEGIN!r} is never closed. Add {END!r} after the solution.")
    return "\n".join(out)


def _preprocessors() -> list[Any]:
    """nbconvert preprocessors that turn an instructor notebook into a student one, in order."""
    from nbconvert.preprocessors import ClearOutputPreprocessor, Preprocessor

    class ClearSolutions(Preprocessor):
        """Replace solution regions by stubs and drop nbval's check markers."""

        def preprocess_cell(self, cell, resources, index):
            where = f"{resources.get('name', 'notebook')}, cell {index}"
            if BEGIN in cell.source or END in cell.source:
                cell.source = strip_solutions(cell.source, where, markdown=cell.cell_type == "markdown")
            if cell.cell_type == "code":
                lines = cell.source.splitlines()
                cell.source = "\n".join(line for line in lines if line.strip() != CHECK_MARKER)
            return cell, resources

    return [ClearSolutions(enabled=True), ClearOutputPreprocessor(enabled=True)]


def student_version(nb: Any, name: str = "notebook") -> Any:
    """Return a student copy of an nbformat notebook: solutions stubbed, outputs cleared, checks kept."""
    import copy

    nb = copy.deepcopy(nb)
    resources: dict[str, Any] = {"name": name}
    for preprocessor in _preprocessors():
        nb, resources = preprocessor(nb, resources)
    nb.metadata.pop("widgets", None)  # saved widget state would show the instructor's runs
    nb.metadata[STUDENT_FLAG] = True
    return nb


def _notebooks(source: Path) -> list[Path]:
    if not source.exists():
        raise FileNotFoundError(f"{str(source)!r} does not exist. Give a lesson notebook or a folder of them, "
                                "for example: mgpu-edu student lessons student")
    if source.is_file():
        if source.suffix != ".ipynb":
            raise ValueError(f"{str(source)!r} is not a notebook (.ipynb). Give a lesson notebook or a folder.")
        return [source]
    found = sorted(p for p in source.glob("*.ipynb") if not p.name.startswith("."))
    if not found:
        raise FileNotFoundError(f"{str(source)!r} holds no .ipynb notebooks. Point at the lessons folder, "
                                "for example: mgpu-edu student lessons student")
    return found


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
                              "student versions, for example: student")
    if destination.resolve() == (source if source.is_dir() else source.parent).resolve():
        raise ValueError(f"{str(destination)!r} is the folder the instructor versions are in: writing there "
                         "would replace them. Choose another folder, for example: student")
    targets = [destination / path.name for path in notebooks]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise FileExistsError(f"{len(existing)} student notebook(s) already exist, e.g. {existing[0]!r}. "
                              "Pass --force to overwrite them, or choose an empty folder.")
    converted = []
    for path in notebooks:  # convert all before writing any, so a bad notebook leaves nothing half-done
        nb = nbformat.read(path, as_version=4)
        converted.append(student_version(nb, name=path.name))
    destination.mkdir(parents=True, exist_ok=True)
    for nb, target in zip(converted, targets, strict=True):
        nbformat.write(nb, target)
    manifest = source / MANIFEST if source.is_dir() else None
    if manifest is not None and manifest.is_file():  # the student folder is a course of its own
        (destination / MANIFEST).write_bytes(manifest.read_bytes())
        targets.append(destination / MANIFEST)
    return targets


@dataclasses.dataclass(frozen=True)
class ExerciseResult:
    """One exercise in a handed-in notebook: which check ran, and what it said."""

    notebook: str
    exercise: int
    check: str
    status: str  # "correct", "wrong", "unsolved" or "error" (the cell raised or never ran)
    message: str


def exercise_results(nb: Any, name: str) -> list[ExerciseResult]:
    """Read the exercise checks' feedback from a notebook's outputs."""
    results = []
    cells = [cell for cell in nb.cells if cell.cell_type == "code" and _CHECK_CALL.search(cell.source)]
    for number, cell in enumerate(cells, start=1):
        check = _CHECK_CALL.search(cell.source).group(1)
        status, message = "error", "the cell printed no feedback (it raised an error, or was never run)"
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                status, message = "error", f"{output.get('ename')}: {output.get('evalue')}"
                break
            text = output.get("text", "") if output.get("output_type") == "stream" else ""
            for line in text.splitlines():
                for icon, value in _STATUS.items():
                    if line.startswith(icon):
                        status, message = value, line[len(icon):].lstrip(": ")
        results.append(ExerciseResult(name, number, check, status, message))
    return results


def _read_handed_in(path: Path) -> Any:
    import nbformat

    if not Path(path).is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist. Give the notebooks to grade, "
                                "for example: mgpu-edu grade submissions/*.ipynb")
    return nbformat.read(path, as_version=4)


def run_notebook(path: Path, timeout: int = 600) -> Any:
    """Run a notebook top to bottom in a fresh kernel, in its own folder; return the executed notebook.

    Errors don't stop the run: they are kept as error outputs of the cells that raised.
    """
    from nbclient import NotebookClient

    nb = _read_handed_in(path)
    NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(Path(path).parent)}}).execute()
    return nb


def grade(path: Path, execute: bool = True, timeout: int = 600) -> list[ExerciseResult]:
    """Grade one handed-in notebook: run it in a fresh kernel (unless execute is False), read its checks.

    Errors in the student's cells don't stop the run; the exercise they break is graded "error".
    """
    nb = run_notebook(path, timeout) if execute else _read_handed_in(path)
    return exercise_results(nb, Path(path).name)
