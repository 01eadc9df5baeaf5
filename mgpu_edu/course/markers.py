"""The markers of an nbgrader lesson, as text: solution and hidden-test regions, and the stubs a student
version gets in place of a solution.

Markers are matched the way nbgrader matches them: any line that contains "BEGIN SOLUTION" starts a
region, so keep those words out of prose in the lessons. Used by the nbconvert preprocessors
(:mod:`mgpu_edu.course.preprocessors`) and by the student versions and grading built on them
(:mod:`mgpu_edu.course.assignments`).
"""

from __future__ import annotations

import ast
import re
import textwrap

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
#: What nbgrader looks for in a line (ClearSolutions' and ClearHiddenTests' default delimiters).
_DELIMITERS = {"solution": ("BEGIN SOLUTION", "END SOLUTION"),
               "hidden tests": ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")}
#: An exercise check's call in a cell's source: ``check.<name>(``.
CHECK_CALL = re.compile(r"\bcheck\.(\w+)\(")
#: The line that tells nbval to compare a cell's output; student versions drop it.
CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
STUB_COMMENT = "# YOUR CODE HERE"
MARKDOWN_STUB = "YOUR ANSWER HERE"
#: Notebook metadata flag written into every student version.
STUDENT_FLAG = "mgpu_edu_student"



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


def _regions(source: str, kind: str, where: str) -> list[tuple[str, list[str] | None]]:
    """Split a cell's source into lines outside regions, (line, None), and regions, (indent, lines).

    A region starts at a line containing nbgrader's "BEGIN SOLUTION" (or "BEGIN HIDDEN TESTS") and
    ends at one containing "END …"; both marker lines go. Raises SolutionMarkerError, naming
    ``where`` and the line, when the markers don't pair up.
    """
    begin, end = _DELIMITERS[kind]
    parts: list[tuple[str, list[str] | None]] = []
    region: list[str] | None = None
    for number, line in enumerate(source.split("\n"), start=1):
        if begin in line:
            if region is not None:
                raise SolutionMarkerError(f"{where}, line {number}: {begin!r} again before {end!r}. "
                                          f"Close each {kind} region before opening the next.")
            region = []
            parts.append((line[: len(line) - len(line.lstrip())], region))
        elif end in line:
            if region is None:
                raise SolutionMarkerError(f"{where}, line {number}: {end!r} without a {begin!r} before it.")
            region = None
        elif region is not None:
            region.append(line)
        else:
            parts.append((line, None))
    if region is not None:
        raise SolutionMarkerError(f"{where}: {begin!r} is never closed. Add '### {end}' after the {kind}.")
    return parts


def has_region(source: str, kind: str = "solution") -> bool:
    """Does source contain nbgrader's begin or end marker for kind ("solution" or "hidden tests")?

    (A lone end marker counts, so that it is reported, where nbgrader would silently drop its line.)
    """
    return any(marker in source for marker in _DELIMITERS[kind])


def strip_solutions(source: str, where: str = "cell", markdown: bool = False) -> str:
    """Replace every ``### BEGIN SOLUTION`` … ``### END SOLUTION`` region of a cell's source.

    Code regions become :func:`solution_stub`, indented like the BEGIN line; markdown regions
    become "YOUR ANSWER HERE". Raises SolutionMarkerError, naming ``where``, if the markers
    don't pair up or a code solution isn't valid Python.

    Example:
        >>> print(strip_solutions("x = 1\\n### BEGIN SOLUTION\\nanswer = 42\\n### END SOLUTION\\nprint(answer)"))
        x = 1
        # YOUR CODE HERE: replace ... with your answer.
        answer = ...
        print(answer)
    """
    out: list[str] = []
    for text, region in _regions(source, "solution", where):
        if region is None:
            out.append(text)
            continue
        if markdown:
            stub = MARKDOWN_STUB
        else:
            try:
                stub = solution_stub("\n".join(region))
            except SyntaxError as error:
                raise SolutionMarkerError(f"{where}: a solution is not valid Python ({error.msg}). "
                                          "Fix it in the instructor version.") from None
        out += [text + stub_line if stub_line else "" for stub_line in stub.splitlines()]
    return "\n".join(out)


def strip_hidden_tests(source: str, where: str = "cell") -> str:
    """Drop every ``### BEGIN HIDDEN TESTS`` … ``### END HIDDEN TESTS`` region, as nbgrader does.

    Example:
        >>> print(strip_hidden_tests("f = check.x(a)\\n### BEGIN HIDDEN TESTS\\nassert f\\n### END HIDDEN TESTS"))
        f = check.x(a)
    """
    return "\n".join(text for text, region in _regions(source, "hidden tests", where) if region is None)
