"""``mgpu-edu grade`` against a class of honest students and forgers (tests/grading_course.py).

The claim under test: every honest notebook gets its true grade, no forgery gets a point, and the batch
always completes with a row and a reason per file, whatever a notebook does (print verdicts, patch the
checks or the libraries they use, edit, move or delete check cells, edit stored outputs, forge the answer
it hands over, loop, hoard memory, kill its kernel, touch files outside its folder, leave processes
behind, call out over the network). The unit tests read answers and check cells without running a
kernel; the batch runs once, with two notebooks at a time, and the tests below read what it wrote.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grading_course as mini
import nbformat
import pytest

from mgpu_edu import assignments, course
from mgpu_edu.analysis import planner
from mgpu_edu.course import answers, grading, sandbox
from mgpu_edu.display import check

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"


def entry_point() -> str:
    return str(Path(sys.executable).parent / "mgpu-edu")


# --- answers as data --------------------------------------------------------------------------------------------

def test_answers_cross_as_data_and_keep_what_a_check_reads():
    import numpy as np

    layout = planner.Layout(data=4, tensor=2, pipeline=2, zero=3, micro_batch=1, micro_batches=16)
    for value in (7, -2.5, "x", None, True, ..., (1, [2, (3,)]), {"wq": (None, "model")}, 10**30, float("inf"),
                  layout):
        assert answers.decode(json.loads(json.dumps(answers.encode(value)))) == value
    single = answers.decode(answers.encode(np.float32(1) / 3))
    assert single.dtype == np.float32 and check._as_number(single).precision > 1e-8  # judged to float32's precision
    array = answers.decode(answers.encode(np.arange(6, dtype=np.int32).reshape(2, 3)))
    assert array.dtype == np.int32 and array.shape == (2, 3)
    # what a forger's objects become: their value, or an object with a name and nothing else
    class Anything(float):
        def __eq__(self, other):
            return True
        __hash__ = float.__hash__

    assert type(answers.decode(answers.encode(Anything(0.0)))) is float
    other = answers.decode(answers.encode(object()))
    assert isinstance(other, answers.Unknown) and other != 0
    assert answers.decode(answers.encode(x for x in range(3))) == [0, 1, 2]
    # a dtype is believed only for values it can hold: a "bfloat16" 10,300,000 is judged as the float64 it is
    claimed = answers.decode({"tensor": {"value": 10_300_000, "device": "/device:CPU:0", "dtype": "bfloat16"}})
    assert claimed.dtype.name == "float64" and check.ring_bytes(claimed, n=6, nbytes=6_000_000).status == "wrong"
    real = answers.decode({"tensor": {"value": 10_027_008, "device": "/device:CPU:0", "dtype": "bfloat16"}})
    assert real.dtype.name == "bfloat16"  # 153 · 2**16: a bfloat16 value, judged to bfloat16's precision


def test_reading_an_answer_runs_no_code_and_refuses_what_is_too_big():
    for payload in ({"other": {"type": "os.system", "repr": "rm -rf /"}}, {"layout": {"__class__": 1}}):
        assert isinstance(answers.decode(payload), answers.Unknown)
    for payload in ({"pickle": "gASV"}, {"tuple": 5}, {"a": 1, "b": 2}):
        with pytest.raises(answers.AnswerError):
            answers.decode(payload)
    with pytest.raises(answers.AnswerError, match="more than"):
        answers.encode(list(range(answers.MAX_ITEMS + 1)))
    deep: list = []
    for _ in range(answers.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(answers.AnswerError, match="levels deep"):
        answers.encode(deep)


def test_a_recorded_function_replays_to_the_same_verdict():
    def mean_of_means(sums, counts):
        return sum(s / c for s, c in zip(sums, counts, strict=True)) / len(sums)  # divides by an empty tower's 0

    for fn in (mean_of_means, lambda sums, counts: sum(sums) / sum(counts), lambda s, c: "a string"):
        recorder = answers.Recorder(fn)
        in_kernel = check.combine_function(recorder)
        replayed = check.combine_function(answers.Replay(json.loads(json.dumps(recorder.calls))))
        assert (replayed.status, replayed.message) == (in_kernel.status, in_kernel.message)
        assert in_kernel == check.combine_function(fn)  # the recorder changes nothing the check sees
    error = answers.recorded_error("InvalidArgumentError", "should evenly divide")
    assert type(error).__name__ == "InvalidArgumentError" and isinstance(answers.recorded_error("KeyError", "k"),
                                                                          KeyError)


# --- the course's check cells --------------------------------------------------------------------------------------

def test_every_lesson_is_told_apart_by_its_check_cells():
    lessons = grading.course_lessons(LESSONS)
    assert list(lessons) == [lesson.file for lesson in course.load(LESSONS).lessons if lesson.checks]
    for file, lesson in lessons.items():
        assert [e.check for e in lesson.exercises] == list(course.load(LESSONS).lesson(file).checks)
        handed = assignments.student_version(nbformat.read(LESSONS / file, as_version=4), file)
        assert grading.identify(handed, Path("submission.ipynb"), lessons) is lesson  # by its cells, not its name
        for exercise in lesson.exercises:  # the grader's own code for the kernel is Python, for every exercise
            compile(grading.capture_source(exercise, "t", {} if lesson.needs_reference else None), file, "eval")
    # only the devices a lesson set up are read from the course's run; every other argument is spelled out
    assert {f: [e.expressions for e in lesson.exercises] for f, lesson in lessons.items() if lesson.needs_reference} \
        == {"00_devices.ipynb": [{"device": "layout[-1]"}, {}], "01_placement.ipynb": [{"devices": "layout"}, {}],
            "12_collectives.ipynb": [{}, {"devices": "layout"}]}


def test_a_notebook_of_another_lesson_is_the_wrong_lesson(tmp_path):
    lessons = grading.course_lessons(LESSONS)
    other = tmp_path / "03_allreduce.ipynb"  # named as the assignment, but lesson 02's cells
    nbformat.write(nbformat.read(ROOT / "student" / "02_data_parallel.ipynb", as_version=4), other)
    graded = grading.prepare(other, "bob", lessons, "03_allreduce.ipynb")
    assert isinstance(graded, grading.Graded) and graded.results[0].status == "wrong lesson"
    assert "this is lesson 02_data_parallel; the assignment is 03_allreduce" in graded.results[0].message
    bare = nbformat.read(ROOT / "student" / "03_allreduce.ipynb", as_version=4)
    bare.cells = [c for c in bare.cells if "nbgrader" not in c.metadata]  # every exercise cell gone: by its name
    assert grading.identify(bare, Path("alice-03_allreduce.ipynb"), lessons) is lessons["03_allreduce.ipynb"]


def test_check_cells_come_back_from_the_course_after_their_answers(tmp_path):
    lesson = grading.read_lesson(mini.write_course(tmp_path / "course") / "01_mini.ipynb")
    handed = mini.solved(tmp_path / "course")
    first = next(c for c in handed.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_check")
    first.source = "feedback = check.ring_bytes(answer, n=1, nbytes=0)"
    handed.cells.remove(first)
    handed.cells.insert(0, first)  # edited and moved
    handed.cells = [c for c in handed.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "ex2_check"]
    run, positions, notes = grading.restore(handed, lesson)
    assert notes == ["exercise 1's check cell was edited: the course's was restored",
                     "exercise 1's check cell was moved: the course's is back after the answer cell",
                     "exercise 2's check cell was missing: the course's was put back"]
    for index, number in positions.items():
        assert run.cells[index].source == lesson.exercises[number - 1].source
        assert run.cells[index - 1].metadata["nbgrader"]["grade_id"] == f"ex{number}_answer"
    assert sorted(positions.values()) == [1, 2] and len(run.cells) == len(handed.cells) + 1


def test_the_verdict_takes_the_courses_arguments_not_the_kernels():
    lesson = grading.read_lesson(LESSONS / "03_allreduce.ipynb")
    ring = lesson.exercises[0]
    forged = {"token": "t", "arguments": answers.encode({"n": 1, "nbytes": 0}), "answer": 0, "status": "correct"}
    verdict = grading.judge(ring, forged, ring.literals, "x")
    assert (verdict.status, verdict.points) == ("wrong", 0.0)
    right = grading.judge(ring, {"token": "t", "answer": 10_000_000}, ring.literals, "x")
    assert (right.status, right.points, right.max_points) == ("correct", 1.0, 1.0)
    for report in (None, {"raised": ["NameError", "name 'answer' is not defined"]}, {"unreadable": "too big"},
                   {"function": "not a list"}, {"answer": {"pickle": "x"}}):
        assert grading.judge(ring, report, ring.literals, "x").points == 0.0


def test_a_kernels_command_line_names_no_folder(tmp_path):
    """Any process can read another's command line: the kernel's names its folder (where its sockets are)
    only relative to its working directory, so no other notebook learns where to connect."""
    lesson = grading.read_lesson(LESSONS / "03_allreduce.ipynb")
    client = grading._make_client(nbformat.v4.new_notebook(), tmp_path, grading.Limits())
    client.km.kernel_spec  # noqa: B018 (loads the spec the command is made from)
    command = client.km.format_kernel_cmd()
    assert not any(str(tmp_path) in part for part in command), command
    assert command[command.index("--") - 3:command.index("--")] == [".", "--memory-mb", "3000"]
    assert "kernel.json" in command and lesson.exercises


@pytest.mark.light  # a Python that imports nothing but the standard library, under the sandbox
@pytest.mark.skipif(not sandbox.landlock_abi(), reason="Landlock is what restricts files; this kernel has none")
def test_a_sandboxed_process_reaches_no_terminal_and_no_shared_memory(tmp_path):
    probe = ("import os\nfor attempt in (lambda: os.listdir('/dev/pts'), lambda: open('/dev/tty'),\n"
             "                lambda: open('/dev/shm/mgpu-edu-probe', 'w'), lambda: open('/dev/ptmx', 'rb'),\n"
             "                lambda: os.listdir(os.path.expanduser('~')), lambda: os.listdir('/tmp')):\n"
             "    try:\n        attempt()\n        print('reached')\n    except OSError:\n        print('refused')\n"
             "open('mine.txt', 'w').write('ok')\nprint(open('/dev/null', 'w').write('x'))")
    done = subprocess.run([sys.executable, "-m", "mgpu_edu.course.sandbox", ".", "--", sys.executable, "-c", probe],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["refused"] * 6 + ["1"], done.stdout + done.stderr
    assert (tmp_path / "mine.txt").read_text() == "ok" and not Path("/dev/shm/mgpu-edu-probe").exists()


@pytest.mark.light
def test_the_sandbox_says_what_it_takes_away_here():
    line = sandbox.describe()
    if sys.platform.startswith("linux"):
        assert ("Landlock" in line) == (sandbox.landlock_abi() > 0)
    assert "network" in line or "not restricted" in line


# --- a class, graded once -----------------------------------------------------------------------------------------

class Listener:
    """A server on the grader's loopback that counts who reached it."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.socket.settimeout(0.5)
        self.port, self.hits, self.running = self.socket.getsockname()[1], 0, True
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while self.running:
            try:
                self.socket.accept()[0].close()
                self.hits += 1
            except OSError:
                pass


def _marked(marker: str) -> list:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    course_dir = mini.write_course(folder / "course")
    listener = Listener()
    marker = f"mgpu-edu-lingerer-{os.getpid()}-{time.time_ns()}"
    expected = mini.class_of(course_dir, folder / "handed-in", listener.port, marker)
    honest_bytes = (folder / "handed-in" / "honest.ipynb").read_bytes()
    files = sorted(str(p.relative_to(folder)) for p in (folder / "handed-in").iterdir())
    done = subprocess.run([entry_point(), "grade", *files, "--course", "course", "--lesson", "01", "--csv",
                           "grades.csv", "--feedback", "feedback", "--jobs", "2", "--timeout", "10",
                           "--notebook-timeout", "120", "--memory-mb", "1000"],
                          cwd=folder, capture_output=True, text=True, timeout=900, check=False)
    listener.running = False
    time.sleep(0.5)
    rows = list(csv.DictReader((folder / "grades.csv").read_text(encoding="utf-8").splitlines()))
    yield {"done": done, "rows": rows, "expected": expected, "folder": folder, "hits": listener.hits,
           "marker": marker, "honest": honest_bytes}


def _totals(batch) -> dict[str, dict]:
    return {row["student"].removeprefix("'"): row for row in batch["rows"] if row["exercise"] == "total"}


@pytest.mark.processes
@pytest.mark.slow
def test_every_honest_notebook_gets_its_true_grade_and_no_forgery_a_point(batch):
    assert batch["done"].returncode == 1, batch["done"].stderr  # three files can't be graded: exit status 1
    totals = _totals(batch)
    assert sorted(totals) == sorted(batch["expected"])  # one total per file, whatever it held or did
    for name, (points, status) in batch["expected"].items():
        row = totals[name]
        assert row["status"] == status, (name, row)
        if points is not None:
            assert float(row["points"]) == points, (name, row)
            assert float(row["max_points"]) == 2
    exercises = [row for row in batch["rows"] if row["exercise"] != "total"]
    assert len(exercises) == 2 * sum(points is not None for points, _ in batch["expected"].values())


@pytest.mark.processes
@pytest.mark.slow
def test_the_gradebook_holds_text_not_formulas(batch):
    rows = [row for row in batch["rows"] if row["notebook"].endswith("=2+3.ipynb")]
    assert {row["student"] for row in rows} == {"'=2+3"}
    assert rows[0]["status"] == "error" and rows[0]["feedback"].startswith("'=HYPERLINK(")


@pytest.mark.processes
@pytest.mark.slow
def test_every_file_that_cant_be_graded_says_why(batch):
    totals = _totals(batch)
    assert "is an empty file: ask for the .ipynb again" in totals["empty"]["feedback"]
    assert "is not a notebook file" in totals["essay"]["feedback"]
    assert "this is lesson 02_placed; the assignment is 01_mini" in totals["other-lesson"]["feedback"]
    unreadable = sum(status != "graded" for _, status in batch["expected"].values())
    assert f"{unreadable} of {len(batch['expected'])} notebook(s) could not be graded" in batch["done"].stderr


@pytest.mark.processes
@pytest.mark.slow
def test_limits_hold_for_cells_that_print_nothing(batch):
    totals = _totals(batch)
    statuses = {(row["student"], row["exercise"]): row["status"] for row in batch["rows"]}
    assert "1 cell(s) ran over 10 s and were interrupted" in totals["endless-loop"]["feedback"]
    assert statuses["endless-loop", "2"] == "unsolved"  # the rest of the notebook ran on after the interrupt
    assert statuses["deaf-loop", "1"] == "correct" and statuses["deaf-loop", "2"] == "timed out"
    assert "didn't stop when interrupted" in totals["deaf-loop"]["feedback"]
    assert statuses["memory-bomb", "1"] == "out of memory" and "over 1,000 MB" in totals["memory-bomb"]["feedback"]
    assert statuses["kills-its-launcher", "1"] == "killed"


@pytest.mark.processes
@pytest.mark.slow
def test_the_grader_notes_what_it_restored(batch):
    totals = _totals(batch)
    assert "exercise 1's check cell was edited: the course's was restored" in totals["checks-edited"]["feedback"]
    assert "exercise 2's check cell was missing: the course's was put back" in totals["checks-deleted"]["feedback"]
    assert "exercise 1's check cell was moved" in totals["check-moved"]["feedback"]
    assert totals["honest"]["feedback"] == ""


@pytest.mark.processes
@pytest.mark.slow
def test_nothing_outside_a_notebooks_folder_is_touched_or_left_running(batch):
    folder = batch["folder"]
    assert not _marked(batch["marker"])  # the lingerer's three processes, detached or not, are gone
    assert _totals(batch)["vandal"]["points"] == "0"  # it read nothing it could answer from
    if sandbox.landlock_abi():
        assert (folder / "handed-in" / "honest.ipynb").read_bytes() == batch["honest"]
    network = "network off" in sandbox.describe()
    assert (batch["hits"] == 0) == network  # where the platform allows it, nothing reached the grader's machine
    assert sorted(p.name for p in folder.iterdir()) == ["course", "feedback", "grades.csv", "handed-in"]


@pytest.mark.processes
@pytest.mark.slow
def test_each_student_gets_a_feedback_file(batch):
    feedback = batch["folder"] / "feedback"
    assert sorted(p.stem for p in feedback.glob("*.md")) == sorted(batch["expected"])
    text = (feedback / "deaf-loop.md").read_text()
    assert text.startswith("# deaf-loop: lesson 01_mini, 1 of 2 points")
    assert "- Exercise 1 (ring_bytes): correct. 10,000,000 bytes" in text
    assert "- Exercise 2 (combine_function): timed out." in text
    assert (feedback / "empty.md").read_text().startswith("# empty\n\nNot graded: ")


@pytest.mark.processes
@pytest.mark.slow
def test_a_function_answer_is_judged_on_the_devices_the_course_set_up(tmp_path):
    """Lesson 02 of the mini course places tensors: its check reads the devices of the course's own run, so a
    notebook that shrinks its layout to one device can't make every tensor "well placed"."""
    course_dir = mini.write_course(tmp_path / "course")
    handed = mini.student(course_dir, "02_placed.ipynb")
    nbformat.write(mini._answer(mini._answer(handed, 1, mini.SPREAD), 2, "answer = 14"), tmp_path / "honest.ipynb")
    nbformat.write(mini._answer(handed, 1, "layout = [layout[0]]\ndef spread(values):\n"
                                "    return [tf.constant(v) for v in values]"), tmp_path / "one-device.ipynb")
    done = subprocess.run([entry_point(), "grade", "honest.ipynb", "one-device.ipynb", "--course", "course",
                           "--jobs", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert "honest: 2/2 correct" in done.stdout and "one-device: 0/2 correct" in done.stdout
    assert "item 1 lives on /device:CPU:0, not /device:CPU:1" in done.stdout


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_batch_keeps_what_it_graded_and_stops_every_kernel(tmp_path, signum):
    course_dir = mini.write_course(tmp_path / "course")
    nbformat.write(mini.solved(course_dir), tmp_path / "a-quick.ipynb")
    sleeper = mini._answer(mini.student(course_dir), 1, "import time\ntime.sleep(600)")
    nbformat.write(sleeper, tmp_path / "b-sleeper.ipynb")
    workspace = Path(tempfile.mkdtemp(dir="/tmp", prefix="g"))  # short: the kernels' sockets live below it
    # started with SIGINT ignored, as a test runner's worker (or a shell's background job) may start it
    grader = subprocess.Popen([entry_point(), "grade", "a-quick.ipynb", "b-sleeper.ipynb", "--course", "course",
                               "--csv", "grades.csv"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "TMPDIR": str(workspace)},
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until the quick one is graded and the sleeper's kernel runs
        if (tmp_path / "grades.csv").exists() and "a-quick" in (tmp_path / "grades.csv").read_text() \
                and _in(workspace):
            break
        time.sleep(0.5)
    try:
        rows_before = (tmp_path / "grades.csv").read_text()
        assert "a-quick" in rows_before and _in(workspace), "the quick notebook was graded and the sleeper is running"
        grader.send_signal(signum)
        out, err = grader.communicate(timeout=120)
    finally:
        if grader.poll() is None:  # it didn't stop: end it and its kernels, then fail
            for process in [*_in(workspace)]:
                process.kill()
            grader.kill()
            grader.communicate()
    assert grader.returncode == 130, err
    assert "interrupted: 1 of 2 notebook(s) graded; grades.csv holds them" in err
    rows = list(csv.DictReader((tmp_path / "grades.csv").read_text().splitlines()))
    assert [(r["student"], r["exercise"], r["points"]) for r in rows] == [
        ("a-quick", "1", "1"), ("a-quick", "2", "1"), ("a-quick", "total", "2")]
    time.sleep(1)
    assert not _in(workspace)  # no kernel outlives the grader
    assert not list(workspace.iterdir())  # nor its folder
    workspace.rmdir()


@pytest.mark.processes
@pytest.mark.slow
def test_a_notebook_over_its_time_in_all_is_timed_out(tmp_path):
    course_dir = mini.write_course(tmp_path / "course")
    slow = mini.solved(course_dir)
    for _ in range(4):
        slow.cells.insert(2, nbformat.v4.new_code_cell("import time\ntime.sleep(3)"))
    nbformat.write(slow, tmp_path / "slow.ipynb")
    done = subprocess.run([entry_point(), "grade", "slow.ipynb", "--course", "course", "--timeout", "5",
                           "--notebook-timeout", "8", "--csv", "g.csv"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    rows = list(csv.DictReader((tmp_path / "g.csv").read_text().splitlines()))
    assert [r["status"] for r in rows] == ["timed out", "timed out", "graded"], done.stdout + done.stderr
    assert "the notebook ran over 8 s and was stopped" in rows[-1]["feedback"]


def _in(workspace: Path) -> list:
    """The processes running in a folder under workspace: a batch's kernels and their launchers."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if str(workspace) in process.cwd():
                found.append(process)
        except psutil.Error:
            pass
    return found


@pytest.mark.light
def test_grading_needs_no_tensorflow():
    done = subprocess.run([sys.executable, "-c", "import sys; from mgpu_edu.course import grading, answers, sandbox; "
                           "grading.course_lessons(); print('tensorflow' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
