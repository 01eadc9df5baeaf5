"""Grading handed-in lessons so that a student's code can't decide its own grade (``mgpu-edu grade``).

For each handed-in notebook the grader

1. **finds the lesson** it is, by its check cells (nbgrader ``grade_id`` and ``check.<name>(`` call), else
   its file name or its Colab badge; ``--lesson`` says which lesson the assignment is, and a notebook of
   another lesson is graded "wrong lesson";
2. **restores the check cells from the course**: every grade cell is the course's, whatever the
   submission did to it (edited, moved, deleted), placed right after the exercise's answer cell, and
   each restoration is noted;
3. **runs the notebook apart**: in a throwaway folder holding only a copy of it, in a kernel started by
   :mod:`mgpu_edu.course.sandbox`, with a time limit per cell and per notebook, a memory limit on the
   kernel and everything it starts, and every process it started killed at the end;
4. **asks the kernel for each answer, as data**, right after the exercise's check cell ran
   (:mod:`mgpu_edu.course.answers`), and **judges it in the grader's own process** with its own copy of
   :mod:`mgpu_edu.check`. What the notebook printed, and what its own copy of the checks said, count for
   nothing.

The check's other arguments come from the course's check cell (``n=8``); the few that name a value of
the lesson's own (``layout``, the devices it set up) come from a run of the course's lesson on the same
machine, which must itself grade correct.

Nothing here imports TensorFlow: the grader judges recorded values (tensors as value, dtype and device).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import dataclasses
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mgpu_edu.course import answers
from mgpu_edu.course.markers import CHECK_CALL, CHECK_MARKER, strip_hidden_tests
from mgpu_edu.course.sandbox import kill_tree, process_tree

#: Largest handed-in file the grader reads.
MAX_NOTEBOOK_BYTES = 50 * 2**20
#: Most processes a notebook may run at once.
MAX_PROCESSES = 64



@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise of a course lesson: its check cell, as the course has it, and what that cell calls."""

    number: int
    grade_id: str
    answer_id: str | None  # the solution cell's grade_id (the cell the check follows)
    source: str  # the check cell as students get it: no hidden tests, no nbval marker
    check: str  # the name of the function in mgpu_edu.check
    answer: str  # the source of the answer expression (the check's first argument)
    literals: dict[str, Any]  # the check's other arguments whose values the cell spells out
    expressions: dict[str, str]  # the others: names of the lesson's own values (layout)
    points: float


@dataclasses.dataclass(frozen=True)
class CourseLesson:
    file: str
    path: Path
    exercises: tuple[Exercise, ...]

    @property
    def stem(self) -> str:
        return Path(self.file).stem

    @property
    def needs_reference(self) -> bool:
        """Do its checks take values of the lesson's own, read from a run of the course's notebook?"""
        return any(e.expressions for e in self.exercises)


@dataclasses.dataclass(frozen=True)
class ExerciseResult:
    """One exercise of a handed-in notebook: the check, the grader's verdict and its feedback."""

    notebook: str
    exercise: int
    check: str
    status: str  # correct, wrong, unsolved, error, timed out, out of memory, killed, failed
    message: str
    points: float = 0.0
    max_points: float = 0.0


@dataclasses.dataclass
class Graded:
    """One handed-in notebook, graded: its rows, and notes on what the grader did (restored cells, limits hit)."""

    path: Path
    name: str
    lesson: str
    results: list[ExerciseResult]
    notes: list[str]
    seconds: float = 0.0
    failed: bool = False

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)


class GradingError(ValueError):
    """A handed-in file that can't be graded at all (not a notebook, not a course lesson, wrong lesson)."""


# --- the course's lessons -----------------------------------------------------------------------------------------

def _constant(node: ast.AST) -> Any:
    """The value of a literal, or of arithmetic on literals (``6 * 3600``); ValueError for anything else."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    operators = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                 ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b,
                 ast.Mod: lambda a, b: a % b}
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        return operators[type(node.op)](_constant(node.left), _constant(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_constant(node.operand)
    raise ValueError("not a constant")


def _exercise(cell: Any, number: int, answer_id: str | None, where: str) -> Exercise:
    """An Exercise from a course check cell (with its hidden tests; they are dropped here)."""
    import inspect

    from mgpu_edu.display import check as checks

    source = "\n".join(line for line in strip_hidden_tests(cell.source, where).split("\n")
                       if line.strip() != CHECK_MARKER).strip()
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
             and node.func.value.id == "check"]
    if len(calls) != 1:
        raise ValueError(f"{where}: a check cell must call one check.<name>(answer, …); this one calls {len(calls)}")
    call = calls[0]
    function = getattr(checks, call.func.attr, None)
    if function is None:
        raise ValueError(f"{where}: mgpu_edu.check has no {call.func.attr!r}")
    names = list(inspect.signature(function).parameters)
    arguments = dict(zip(names, call.args, strict=False)) | {k.arg: k.value for k in call.keywords if k.arg}
    answer = arguments.pop(names[0])
    literals, expressions = {}, {}
    for name, node in arguments.items():
        try:
            literals[name] = _constant(node)
        except (ValueError, TypeError, ZeroDivisionError, SyntaxError):
            expressions[name] = ast.unparse(node)
    metadata = cell.metadata.get("nbgrader", {})
    return Exercise(number, str(metadata.get("grade_id", f"ex{number}_check")), answer_id, source, call.func.attr,
                    ast.unparse(answer), literals, expressions, float(metadata.get("points", 1) or 0))


def read_lesson(path: Path) -> CourseLesson:
    """A course lesson's exercises, read from its notebook (instructor or student version)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    exercises, answer_id = [], None
    for index, cell in enumerate(nb.cells):
        metadata = cell.get("metadata", {}).get("nbgrader", {})
        if metadata.get("solution"):
            answer_id = metadata.get("grade_id")
        if metadata.get("grade") and cell.cell_type == "code" and CHECK_CALL.search(cell.source):
            exercises.append(_exercise(cell, len(exercises) + 1, answer_id, f"{path.name}, cell {index}"))
            answer_id = None
    return CourseLesson(path.name, Path(path), tuple(exercises))


def course_lessons(folder: Path | None = None) -> dict[str, CourseLesson]:
    """The course's lessons that have exercises, by file name: those of folder's course.toml (default: shipped)."""
    from mgpu_edu.course import manifest

    course = manifest.load(folder)
    found = {}
    for lesson in course.lessons:
        read = read_lesson(course.folder / lesson.file)
        if read.exercises:
            found[lesson.file] = read
    return found


def _nbgrader(cell: Any) -> dict[str, Any]:
    """A cell's nbgrader metadata, or {} where a handed-in file holds something else there."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    found = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else {}


def _grade_id(cell: Any) -> str | None:
    grade_id = _nbgrader(cell).get("grade_id")
    return grade_id if isinstance(grade_id, str) else None


def _source(cell: Any) -> str:
    source = cell.get("source", "") if isinstance(cell, dict) else ""
    return source if isinstance(source, str) else ""


def _signature(nb: Any) -> list[tuple[str, str]]:
    """The (grade_id, check name) of a notebook's grade cells, in order."""
    found = []
    for cell in nb.cells:
        match = CHECK_CALL.search(_source(cell)) if cell.get("cell_type") == "code" else None
        if _nbgrader(cell).get("grade") and match:
            found.append((str(_grade_id(cell)), match.group(1)))
    return found


def identify(nb: Any, path: Path, lessons: dict[str, CourseLesson]) -> CourseLesson | None:
    """Which course lesson a notebook is: by its check cells, else its file name, else its Colab badge."""
    mine = _signature(nb)
    if mine:
        scores = {file: sum(pair in mine for pair in [(e.grade_id, e.check) for e in lesson.exercises])
                  for file, lesson in lessons.items()}
        best = max(scores.values())
        winners = [file for file, score in scores.items() if score == best]
        if best and len(winners) == 1:
            return lessons[winners[0]]
    named = [lesson for lesson in lessons.values() if lesson.stem in path.name]
    if len(named) == 1:
        return named[0]
    text = "\n".join(_source(cell) for cell in nb.cells[:3] if cell.get("cell_type") == "markdown")
    badged = [lesson for lesson in lessons.values() if f"/{lesson.file}" in text]
    return badged[0] if len(badged) == 1 else None


# --- restoring the check cells ------------------------------------------------------------------------------------

def _normal(source: str) -> str:
    kept = [line.rstrip() for line in strip_hidden_tests(source).split("\n") if line.strip() != CHECK_MARKER]
    return "\n".join(kept).strip()


def restore(nb: Any, lesson: CourseLesson) -> tuple[Any, dict[int, int], list[str]]:
    """The notebook to run: the submission with every check cell the course's, where it belongs.

    A check cell goes back where the student's copy of it is, if that is after the exercise's answer
    cell and before the next exercise (a student may split an answer over cells); else right after the
    answer cell (the last copy of it, where a cell was pasted twice). A check cell found by neither its
    nbgrader id nor its ``check.<name>(`` call, with no answer cell either, runs at the end. Returns the
    notebook (outputs cleared, the grader's own metadata removed from handed-in cells), a map from the
    index of each check cell in it to its exercise's number, and notes on what was restored.
    """
    import nbformat

    handed = []
    for cell in nb.cells:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            continue  # not a cell Jupyter knows: nothing a notebook can run
        cell = nbformat.from_dict(copy.deepcopy(dict(cell)))
        metadata = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        cell["metadata"] = nbformat.from_dict({k: v for k, v in metadata.items() if not str(k).startswith("mgpu_edu")})
        if not isinstance(cell.get("source"), str):
            cell["source"] = ""
        handed.append(cell)
    exercise_ids = {e.number: {f"ex{e.number}_prompt", e.answer_id, e.grade_id} - {None} for e in lesson.exercises}
    used: set[int] = set()

    def theirs(exercise: Exercise) -> int | None:
        """The index of the student's copy of the exercise's check cell: by its id, else by its check call."""
        by_id = [i for i, c in enumerate(handed) if _grade_id(c) == exercise.grade_id and i not in used]
        if by_id:
            return by_id[0]
        calls = [i for i, c in enumerate(handed) if c.get("cell_type") == "code" and i not in used
                 and not _nbgrader(c).get("solution") and f"check.{exercise.check}(" in _source(c)]
        return calls[0] if calls else None

    plan: list[tuple[Exercise, int | None, int | None]] = []  # (exercise, their check cell, the answer cell)
    for exercise in lesson.exercises:
        mine = theirs(exercise)
        if mine is not None:
            used.add(mine)
        answers_at = [i for i, c in enumerate(handed) if exercise.answer_id and _grade_id(c) == exercise.answer_id]
        before = [i for i in answers_at if mine is None or i < mine]
        plan.append((exercise, mine, (before or answers_at or [None])[-1]))
    notes = []
    after: dict[int, list[Any]] = {}  # handed-in index -> the course's check cells to put after that cell
    at_end: list[Any] = []
    for exercise, mine, answer in plan:
        label = f"exercise {exercise.number}'s check cell"
        restored = nbformat.v4.new_code_cell(exercise.source, metadata={"mgpu_edu_check": exercise.number, "nbgrader": {
            "grade": True, "grade_id": exercise.grade_id, "locked": True, "points": exercise.points,
            "schema_version": 3, "solution": False, "task": False}})
        if mine is None:
            notes.append(f"{label} was missing: the course's was put back")
        elif handed[mine].get("cell_type") != "code" or _normal(_source(handed[mine])) != exercise.source:
            notes.append(f"{label} was edited: the course's was restored")
        if answer is not None:
            following = [i for i, c in enumerate(handed) if i > answer and _grade_id(c) in set().union(
                *(ids for number, ids in exercise_ids.items() if number > exercise.number))]
            limit = following[0] if following else len(handed)
            if mine is not None and answer < mine < limit:
                after.setdefault(mine, []).append(restored)  # in place: the cells between are the answer's too
            else:
                if mine is not None:
                    notes.append(f"{label} was moved: the course's is back after the answer cell")
                after.setdefault(answer, []).append(restored)
        elif mine is not None:
            notes.append(f"exercise {exercise.number}'s answer cell ({exercise.answer_id}) was not found: its "
                         "check runs where it was")
            after.setdefault(mine, []).append(restored)
        else:
            notes.append(f"exercise {exercise.number}'s answer cell ({exercise.answer_id}) was not found: its "
                         "check runs at the end")
            at_end.append(restored)
    replaced = {mine for _, mine, _ in plan if mine is not None}
    run = nbformat.v4.new_notebook(metadata=nb.get("metadata", {}) if isinstance(nb.get("metadata"), dict) else {})
    for index, cell in enumerate(handed):
        if index not in replaced:
            if cell.get("cell_type") == "code":
                cell.outputs, cell.execution_count = [], None
            run.cells.append(cell)
        run.cells.extend(after.get(index, []))
    run.cells.extend(at_end)
    positions = {i: cell.metadata["mgpu_edu_check"] for i, cell in enumerate(run.cells)
                 if "mgpu_edu_check" in cell.get("metadata", {})}
    return run, positions, notes


# --- capturing answers in the kernel --------------------------------------------------------------------------------

def capture_source(exercise: Exercise, token: str, reference: dict[str, Any] | None) -> str:
    """The code the grader runs in the kernel after an exercise's check cell: hand over the answer as data.

    With reference (the lesson's own values, from the course's run) the arguments are those values; without,
    the kernel evaluates the check's argument expressions (the course's run itself).
    """
    module = "__import__('mgpu_edu.course.answers', fromlist=['capture'])"
    if reference is None:
        pairs = [f"{name!r}: ({expression})" for name, expression in exercise.expressions.items()]
        pairs += [f"{name!r}: {value!r}" for name, value in exercise.literals.items()]
        arguments = "{" + ", ".join(pairs) + "}"
    else:
        data = json.dumps(answers.encode({**exercise.literals, **reference}))
        arguments = f"{module}.decode(__import__('json').loads({data!r}))"
    return (f"{module}.capture({token!r}, {exercise.check!r}, lambda: ({exercise.answer}), lambda: {arguments})")


def _error_text(output: dict[str, Any]) -> str:
    evalue = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1 of that cell)", str(output.get("evalue", "")))
    return f"{output.get('ename')}: {evalue}"


def judge(exercise: Exercise, report: dict[str, Any] | None, arguments: dict[str, Any], name: str,
          before: str | None = None) -> ExerciseResult:
    """The grader's verdict on one exercise, from the kernel's report (see :func:`answers.capture`)."""

    def result(status: str, message: str) -> ExerciseResult:
        points = exercise.points if status == "correct" else 0.0
        return ExerciseResult(name, exercise.number, exercise.check, status, message, points, exercise.points)

    try:
        return _judge(exercise, report, arguments, before, result)
    except Exception as error:  # a report is data of the kernel's choosing: a malformed one grades nothing
        return result("error", f"the kernel's report could not be read ({type(error).__name__})")


def _judge(exercise: Exercise, report: Any, arguments: dict[str, Any], before: str | None,
           result: Callable[[str, str], ExerciseResult]) -> ExerciseResult:
    from mgpu_edu.display import check as checks

    if not isinstance(report, dict):
        return result("error", "the answer could not be read from the kernel")
    if "raised" in report:
        error, message = (str(part)[:1000] for part in (list(report["raised"]) + ["", ""])[:2])
        text = f"{error}: {message}"
        if error == "NameError" and before:
            text = f"your cell above raised {before}; so there was no answer to check ({text})"
        return result("error", text)
    if "unreadable" in report:
        return result("error", f"the answer could not be graded: {str(report['unreadable'])[:300]}")
    try:
        answer = answers.Replay(report["function"]) if "function" in report else answers.decode(report.get("answer"))
        with contextlib.redirect_stdout(io.StringIO()):
            feedback = getattr(checks, exercise.check)(answer, **arguments)
    except Exception as error:  # the recorded answer is data of the student's choosing: never let it stop a batch
        return result("wrong", f"the answer could not be judged ({type(error).__name__}: {str(error)[:200]})")
    if getattr(answer, "ran_out", False):
        return result("error", f"the kernel's record of your function's calls ended before the check was done: "
                               f"did the notebook change mgpu_edu.check? (`{exercise.answer}` was not graded)")
    return result(feedback.status, feedback.message)


# --- running a notebook apart -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Limits:
    """What one notebook may use: seconds per cell and in all, and memory (MB) for its kernel and children."""

    cell_seconds: float = 300
    notebook_seconds: float = 1200
    memory_mb: int = 3000
    disk_mb: int = 2000
    network: bool = False


def _kernel_env(root: Path) -> dict[str, str]:
    """The kernel's environment: the instructor's, without secrets, and with home and caches in root."""
    keep = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH", "KERAS_BACKEND", "SYSTEMROOT",
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
    env = {k: v for k, v in os.environ.items()
           if k in keep or k.startswith(("LC_", "TF_", "XLA_", "CUDA", "NVIDIA", "MGPU_EDU_"))}
    env.pop("MGPU_EDU_UV", None)
    places = {"HOME": "home", "TMPDIR": "tmp", "TEMP": "tmp", "TMP": "tmp", "IPYTHONDIR": "ipython",
              "MPLCONFIGDIR": "matplotlib", "XDG_CACHE_HOME": "cache", "XDG_CONFIG_HOME": "config",
              "XDG_DATA_HOME": "data", "JUPYTER_CONFIG_DIR": "jupyter", "JUPYTER_DATA_DIR": "jupyter",
              "JUPYTER_RUNTIME_DIR": "jupyter", "KERAS_HOME": "keras"}
    for variable, folder in places.items():
        (root / folder).mkdir(exist_ok=True)
        env[variable] = str(root / folder)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["MPLBACKEND"] = "agg"
    return env


def _make_client(nb: Any, root: Path, limits: Limits) -> Any:
    """An nbclient NotebookClient for nb, whose kernel starts in the sandbox and whose outputs are bounded."""
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbformat.v4 import new_output

    class SandboxedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            # Paths relative to the kernel's folder (its working directory): command lines are public (any
            # process reads /proc/PID/cmdline), and the folder's random name keeps its sockets out of reach.
            connection = os.path.realpath(self.connection_file)
            command = ["kernel.json" if part == connection else part for part in super().format_kernel_cmd(
                extra_arguments)]
            network = ["--network"] if limits.network else []
            return [sys.executable, "-m", "mgpu_edu.course.sandbox", ".", "--memory-mb", str(limits.memory_mb),
                    *network, "--", *command]

    class BoundedClient(NotebookClient):
        """Keeps only errors (shortened) and captured answers: a notebook that prints gigabytes costs nothing."""

        reports: dict[str, list[str]]
        timed_out: list[int]

        def output(self, outs: list[Any], msg: dict[str, Any], display_id: Any, cell_index: int) -> Any:
            content = msg.get("content", {})
            if msg["msg_type"] == "error" and len(outs) < 3:
                out = new_output("error", ename=str(content.get("ename", ""))[:200],
                                 evalue=str(content.get("evalue", ""))[:2000], traceback=[])
                outs.append(out)
                return out
            if msg["msg_type"] == "display_data":
                text = content.get("data", {}).get(answers.MIME)
                if isinstance(text, str) and len(text) <= answers.MAX_BYTES + 1000:
                    self.reports.setdefault(str(msg.get("parent_header", {}).get("msg_id")), []).append(text)
            return None

        def handle_comm_msg(self, outs: Any, msg: Any, cell_index: int) -> None:
            return None  # widgets: nothing to keep

        async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
            self.timed_out.append(cell.metadata.get("mgpu_edu_index", -1) if cell is not None else -1)
            return await super()._async_handle_timeout(timeout, cell)

    import zmq

    manager = SandboxedKernelManager(kernel_name="python3",
                                     transport="tcp" if sys.platform == "win32" else "ipc")
    # What a kernel can make the grader hold: no message over 16 MB, at most 256 queued per channel.
    manager.context.setsockopt(zmq.MAXMSGSIZE, 16 * 2**20)
    manager.context.setsockopt(zmq.RCVHWM, 256)
    manager.connection_file = str(root / "kernel.json")
    if manager.transport == "ipc":  # sockets in root (the only folder the kernel may write to): a short name
        manager.ip = str(root / "k")
    client = BoundedClient(nb, km=manager, timeout=int(limits.cell_seconds), allow_errors=True,
                           interrupt_on_timeout=True, kernel_name="python3", startup_timeout=120,
                           error_on_timeout={"ename": "TimeoutError", "evalue": f"the cell ran over "
                                             f"{limits.cell_seconds:g} s and was stopped", "traceback": []},
                           timeout_func=lambda cell: cell.metadata.get("mgpu_edu_timeout", int(limits.cell_seconds)),
                           iopub_timeout=10, record_timing=False)
    client.reports, client.timed_out = {}, []
    return client


def _folder_bytes(root: Path) -> int:
    """What the files under root hold (a notebook's sandbox folder), in bytes."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


@dataclasses.dataclass
class Run:
    """What running one notebook gave: each exercise's report, the cells' errors, and how it ended."""

    reports: dict[int, dict[str, Any] | None]
    errors: dict[int, str]
    ending: str | None = None
    why: str = ""
    timed_out_cells: list[int] = dataclasses.field(default_factory=list)


async def run_notebook(nb: Any, lesson: CourseLesson, positions: dict[int, int], root: Path, limits: Limits,
                       reference: dict[int, dict[str, Any]] | None) -> Run:
    """Run nb (a restored submission) in a sandboxed kernel in root; capture each exercise's answer after its check."""
    import nbformat

    env = _kernel_env(root)
    client = _make_client(nb, root, limits)
    run = Run({}, {})
    done = asyncio.Event()
    deadline = time.monotonic() + limits.notebook_seconds

    def launcher() -> int | None:
        """The pid of the sandbox launcher, parent of the kernel and of everything it starts."""
        return getattr(getattr(client.km, "provisioner", None), "pid", None)

    async def watch() -> None:
        """Kill the notebook's processes when they hold too much memory or disk, or are too many."""
        ticks = 0
        while not done.is_set():
            await asyncio.sleep(0.2)
            ticks += 1
            if ticks % 5 == 0 and _folder_bytes(root) > limits.disk_mb * 2**20:
                run.ending, run.why = "killed", f"it wrote over {limits.disk_mb:,} MB of files and was stopped"
                kill_tree(launcher())
                return
            processes = process_tree(launcher())
            total = 0
            for process in processes:
                with contextlib.suppress(Exception):
                    total += process.memory_info().rss
            if total > limits.memory_mb * 2**20:
                run.ending, run.why = "out of memory", f"it held over {limits.memory_mb:,} MB and was stopped"
            elif len(processes) > MAX_PROCESSES:
                run.ending, run.why = "killed", f"it started over {MAX_PROCESSES} processes and was stopped"
            else:
                continue
            kill_tree(launcher())
            return

    async def execute() -> None:
        await client.async_start_new_kernel(cwd=str(root), env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await client.async_start_new_kernel_client()
        numbers = {e.number: e for e in lesson.exercises}
        last_error: str | None = None
        for index, cell in enumerate(nb.cells):
            if cell.get("cell_type") != "code":
                continue
            cell.metadata["mgpu_edu_index"] = index
            await client.async_execute_cell(cell, index)
            if index in client.timed_out:  # interrupted: is the kernel back?
                probe = nbformat.v4.new_code_cell("pass", metadata={"mgpu_edu_timeout": 20, "mgpu_edu_index": -2})
                await client.async_execute_cell(probe, index, store_history=False)
                if -2 in client.timed_out:
                    run.ending, run.why = "timed out", (f"a cell ran over {limits.cell_seconds:g} s and didn't "
                                                        "stop when interrupted")
                    return
            error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
            if error is not None:
                run.errors[index] = _error_text(error)
            if index in client.timed_out:
                run.errors[index] = f"TimeoutError: it ran over {limits.cell_seconds:g} s and was interrupted"
            if index not in positions:
                last_error = run.errors.get(index, last_error)
                continue
            exercise = numbers[positions[index]]
            token = secrets.token_hex(8)
            values = None if reference is None else reference.get(exercise.number, {})
            capture = nbformat.v4.new_code_cell(capture_source(exercise, token, values),
                                                metadata={"mgpu_edu_timeout": int(limits.cell_seconds)})
            client.reports.clear()
            await client.async_execute_cell(capture, index, store_history=False)
            sent = []
            for text in [t for texts in client.reports.values() for t in texts]:
                with contextlib.suppress(Exception):  # not JSON, or nested past what json reads (RecursionError)
                    sent.append(json.loads(text))
            mine = [data for data in sent if isinstance(data, dict) and data.get("token") == token]
            report = mine[0] if len(mine) == 1 else None  # none, or two: nothing to trust
            if report is not None:
                report["before"] = last_error  # the grader's own record, whatever the kernel sent
            run.reports[exercise.number] = report
            last_error = None

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait_for(execute(), timeout=limits.notebook_seconds)
    except TimeoutError:
        run.ending = run.ending or "timed out"
        run.why = run.why or f"the notebook ran over {limits.notebook_seconds:g} s and was stopped"
    except Exception as error:  # the kernel died (killed by the watchdog, or by the notebook itself)
        if run.ending is None and time.monotonic() >= deadline - 1:  # nbclient reports the cut as a dead kernel
            run.ending, run.why = "timed out", f"the notebook ran over {limits.notebook_seconds:g} s and was stopped"
        if run.ending is None:
            run.ending, run.why = "killed", f"its kernel died ({type(error).__name__}); a notebook must not end " \
                                            "its own kernel"
    finally:
        done.set()
        run.timed_out_cells = [i for i in client.timed_out if i >= 0]
        watcher.cancel()
        kill_tree(launcher())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client._async_cleanup_kernel(), timeout=10)
    return run


# --- a whole batch ------------------------------------------------------------------------------------------------

def _read_submission(path: Path) -> Any:
    import nbformat

    if not path.is_file():
        pattern = " (a pattern that matched no file?)" if any(c in str(path) for c in "*?[") else ""
        raise GradingError(f"{str(path)!r} does not exist{pattern}. Give the notebooks to grade, for example: "
                           "mgpu-edu grade submissions/*.ipynb")
    size = path.stat().st_size
    if size == 0:
        raise GradingError(f"{str(path)!r} is an empty file: ask for the .ipynb again (in Jupyter or Colab: "
                           "File → Download → .ipynb)")
    if size > MAX_NOTEBOOK_BYTES:
        raise GradingError(f"{str(path)!r} is {size / 2**20:,.0f} MB, over the {MAX_NOTEBOOK_BYTES // 2**20} MB a "
                           "lesson notebook can be: ask for it again with its outputs cleared")
    try:
        return nbformat.reads(path.read_text(encoding="utf-8-sig", errors="replace"), as_version=4)
    except Exception as error:  # not JSON, or JSON that isn't a notebook (nbformat's ValidationError among them)
        raise GradingError(f"{str(path)!r} is not a notebook file ({' '.join(str(error).split())[:120]}): ask for "
                           "the .ipynb again (in Jupyter or Colab: File → Download → .ipynb)") from None


def names_for(paths: Sequence[Path]) -> list[str]:
    """A name per handed-in file: its path from the folder all of them share, without .ipynb.

    Example:
        >>> names_for([Path("in/alice/07.ipynb"), Path("in/bob/07.ipynb")])
        ['alice/07', 'bob/07']
    """
    absolute = [Path(os.path.abspath(p)) for p in paths]
    if len(absolute) == 1:
        return [absolute[0].stem]
    common = Path(os.path.commonpath([str(p.parent) for p in absolute]))
    return [str(p.relative_to(common).with_suffix("")).replace(os.sep, "/") for p in absolute]


def _failed(path: Path, name: str, lesson: str, status: str, message: str, notes: list[str] | None = None) -> Graded:
    return Graded(path, name, lesson, [ExerciseResult(str(path), 0, "-", status, message)], notes or [], failed=True)


@dataclasses.dataclass
class _Job:
    path: Path
    name: str
    lesson: CourseLesson
    nb: Any
    positions: dict[int, int]
    notes: list[str]


async def _grade_job(job: _Job, workspace: Path, limits: Limits, references: dict[str, Any]) -> Graded:
    lesson = job.lesson
    started = time.monotonic()
    reference = references.get(lesson.file, {})
    if isinstance(reference, str):  # the course's own run failed: nothing to compare with
        return _failed(job.path, job.name, lesson.stem, "failed", reference, job.notes)
    root = Path(tempfile.mkdtemp(prefix="", dir=workspace))
    try:
        run = await run_notebook(job.nb, lesson, job.positions, root, limits, reference)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = []
    for exercise in lesson.exercises:
        arguments = {**exercise.literals, **reference.get(exercise.number, {})}
        if exercise.number not in run.reports:
            status = run.ending or "error"
            why = run.why if run.ending else "the check never ran"
            results.append(ExerciseResult(str(job.path), exercise.number, exercise.check, status, why, 0.0,
                                          exercise.points))
            continue
        report = run.reports[exercise.number]
        results.append(judge(exercise, report, arguments, str(job.path), (report or {}).get("before")))
    notes = list(job.notes)
    if run.timed_out_cells:
        notes.append(f"{len(run.timed_out_cells)} cell(s) ran over {limits.cell_seconds:g} s and were interrupted")
    if run.ending:
        notes.append(f"{run.ending}: {run.why}")
    return Graded(job.path, job.name, lesson.stem, results, notes, time.monotonic() - started)


async def _reference(lesson: CourseLesson, workspace: Path, limits: Limits) -> dict[int, dict[str, Any]] | str:
    """The lesson's own values for its checks, from a run of the course's notebook, which must grade correct."""
    import nbformat

    nb = nbformat.read(lesson.path, as_version=4)
    run_nb, positions, _ = restore(nb, lesson)
    root = Path(tempfile.mkdtemp(prefix="course-", dir=workspace))
    try:
        run = await run_notebook(run_nb, lesson, positions, root, limits, None)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    values: dict[int, dict[str, Any]] = {}
    for exercise in lesson.exercises:
        report = run.reports.get(exercise.number)
        if not report or "arguments" not in report:
            why = run.why or (report or {}).get("raised") or "its check never ran"
            return (f"the course's own {lesson.file} could not be run here to read the values its checks take "
                    f"({why}); run `mgpu-edu doctor`")
        arguments = answers.decode(report["arguments"])
        values[exercise.number] = {k: v for k, v in arguments.items() if k in exercise.expressions}
        verdict = judge(exercise, report, arguments, lesson.file)
        if verdict.status != "correct":
            return (f"the course's own solution to {lesson.stem}'s exercise {exercise.number} grades "
                    f"{verdict.status!r} here ({verdict.message}); is --course the instructor version?")
    return values


def prepare(path: Path, name: str, lessons: dict[str, CourseLesson], expected: str | None) -> _Job | Graded:
    """Read, identify and restore one handed-in notebook: a job to run, or a Graded saying why it can't be."""
    try:
        nb = _read_submission(path)
    except GradingError as error:
        return _failed(path, name, "-", "failed", str(error))
    lesson = identify(nb, path, lessons)
    if expected is not None:
        wanted = lessons[expected]
        if lesson is not None and lesson.file != wanted.file:
            return _failed(path, name, lesson.stem, "wrong lesson", f"this is lesson {lesson.stem}; the assignment "
                           f"is {wanted.stem}: ask for the right notebook")
        lesson = wanted
    if lesson is None:
        return _failed(path, name, "-", "failed", "not a lesson of this course: none of its check cells, file name "
                       "or badge matches one (give --lesson to grade it as a given lesson)")
    run_nb, positions, notes = restore(nb, lesson)
    return _Job(path, name, lesson, run_nb, positions, notes)


def _become_subreaper() -> None:
    """Orphans of the graded notebooks' processes come to the grader, which kills them all at the end."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def grade_batch(paths: Sequence[Path], lessons: dict[str, CourseLesson], limits: Limits, jobs: int = 1,
                expected: str | None = None, on_graded: Callable[[Graded], None] | None = None,
                stopped: Callable[[], bool] | None = None) -> list[Graded]:
    """Grade every handed-in notebook (up to ``jobs`` at once); call on_graded as each one finishes.

    Every file gets a Graded, whatever it holds or does. Returns them in the order given. KeyboardInterrupt
    (Ctrl-C, or SIGTERM turned into one by the command line) stops the batch, kills every kernel, and
    propagates; what on_graded was given is kept. Once ``stopped()`` is true no further notebook starts (the
    command line's signal handler says so, in case the KeyboardInterrupt it raised was swallowed).
    """
    paths = [Path(p) for p in paths]
    names = names_for(paths)
    prepared: list[_Job | Graded] = []
    for path, name in zip(paths, names, strict=True):  # every file read before any runs
        try:
            prepared.append(prepare(path, name, lessons, expected))
        except Exception as error:  # a file can hold anything: it fails alone
            prepared.append(_failed(path, name, "-", "failed", f"could not be read as a lesson: "
                                    f"{type(error).__name__}: {str(error)[:300]}"))
    graded: dict[int, Graded] = {}

    def finish(index: int, result: Graded) -> None:
        graded[index] = result
        if on_graded is not None:
            on_graded(result)

    async def main(workspace: Path) -> None:
        semaphore = asyncio.Semaphore(max(1, jobs))
        references: dict[str, Any] = {}
        needed = {item.lesson.file: item.lesson for item in prepared
                  if isinstance(item, _Job) and item.lesson.needs_reference}
        for index, item in enumerate(prepared):
            if isinstance(item, Graded):
                finish(index, item)

        async def reference(lesson: CourseLesson) -> None:
            async with semaphore:
                references[lesson.file] = await _reference(lesson, workspace, limits)

        await asyncio.gather(*(reference(lesson) for lesson in needed.values()))

        async def one(index: int, job: _Job) -> None:
            async with semaphore:
                if stopped is not None and stopped():
                    return
                try:
                    result = await _grade_job(job, workspace, limits, references)
                except Exception as error:  # a bug or an OS failure: this notebook fails, the batch goes on
                    result = _failed(job.path, job.name, job.lesson.stem, "failed",
                                     f"could not be graded: {type(error).__name__}: {str(error)[:300]}", job.notes)
            try:
                finish(index, result)
            except Exception as error:  # writing its row failed (a full disk): say so, grade the others
                print(f"could not record {job.name}: {type(error).__name__}: {error}", file=sys.stderr)

        await asyncio.gather(*(one(i, item) for i, item in enumerate(prepared) if isinstance(item, _Job)))

    _become_subreaper()
    workspace = _workspace()
    try:
        asyncio.run(main(workspace))
    finally:
        kill_tree(os.getpid(), spare_root=True)
        shutil.rmtree(workspace, ignore_errors=True)
    return [graded[i] for i in sorted(graded)]


def _workspace() -> Path:
    """A folder for the batch's sandboxes, short enough that a kernel's sockets in it have legal names (Unix caps
    a socket's path near 104 characters): in the temporary folder, or in /tmp where that one's path is long."""
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 60 and os.path.isdir("/tmp") and os.access("/tmp", os.W_OK):
        base = Path("/tmp")
    return Path(tempfile.mkdtemp(prefix="mgpu-edu-", dir=base))


# --- stored outputs (--no-execute) -------------------------------------------------------------------------------

_STATUS = {"✅ Correct": "correct", "❌ Not yet right": "wrong", "⏳ Not solved yet": "unsolved"}
#: Said of every notebook graded from its stored outputs.
TRUSTED = "graded from its stored outputs, which the student can edit: not verified"


def stored_results(nb: Any, name: str) -> list[ExerciseResult]:
    """Read the exercise checks' feedback from a notebook's stored outputs (what ``--no-execute`` grades).

    This trusts the outputs as handed in. A check that raised NameError because the student's own cell
    above it failed (so `answer` was never set) is reported with the student's error, the one to fix.
    """
    results = []
    before = None  # the last error of a non-check cell since the previous check
    for cell in [cell for cell in nb.cells if cell.cell_type == "code"]:
        error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        match = CHECK_CALL.search(cell.source)
        if not match:
            before = error or before
            continue
        status, message = "error", "the cell printed no feedback (it raised an error, or was never run)"
        if error is not None:
            message = _error_text(error)
            if error.get("ename") == "NameError" and before is not None:
                message = (f"your cell above raised {_error_text(before)}; so the check found nothing to check "
                           f"({message})")
        else:
            for output in cell.get("outputs", []):
                text = output.get("text", "") if output.get("output_type") == "stream" else ""
                for line in text.splitlines():
                    for icon, value in _STATUS.items():
                        if line.startswith(icon):
                            status, message = value, line[len(icon):].lstrip(": ")
        points = float(cell.get("metadata", {}).get("nbgrader", {}).get("points", 1) or 0)
        results.append(ExerciseResult(name, len(results) + 1, match.group(1), status, message,
                                      points if status == "correct" else 0.0, points))
        before = None
    return results


def grade_stored(path: Path, name: str, lessons: dict[str, CourseLesson]) -> Graded:
    """Grade one notebook from its stored outputs, without running it (trusting them: see :data:`TRUSTED`)."""
    try:
        nb = _read_submission(path)
    except GradingError as error:
        return _failed(path, name, "-", "failed", str(error))
    lesson = identify(nb, path, lessons)
    results = stored_results(nb, str(path))
    if not results:
        return _failed(path, name, "-", "failed", "no exercises: this notebook calls no mgpu_edu check, so there "
                       "is nothing to grade (is it a course lesson?)")
    if not any(cell.get("outputs") or cell.get("execution_count") for cell in nb.cells if cell.cell_type == "code"):
        return _failed(path, name, "-", "failed", f"{str(path)!r} has no saved outputs: it was handed in without "
                       "being run, so there is no feedback to read. Grade it without --no-execute, which runs it.")
    return Graded(path, name, lesson.stem if lesson else "-", results, [TRUSTED])
