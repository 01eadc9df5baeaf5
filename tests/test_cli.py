"""The ``mgpu-edu`` command on temporary folders: through its real console-script entry point where that is
what is tested (help, usage, working without TensorFlow or the notebook tools), otherwise by calling the
function the entry point calls, ``cli.main(argv)``, in this process (a new process per call would add a
second or two of imports each: nbformat's JSON-schema checker builds its grammars when imported)."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import nbformat
import pytest

from mgpu_edu import assignments, course, markers
from mgpu_edu import env as env_module

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
COURSE = course.load(LESSONS)


def entry_point() -> str:
    """The installed console script, next to this interpreter (where pip puts it)."""
    found = shutil.which("mgpu-edu", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("the mgpu-edu console script is not installed next to this Python: run pip install -e .")
    return found


def mgpu_edu(*args: str, cwd: Path, env: dict[str, str] | None = None,
             process: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `mgpu-edu ARGS` in cwd, with env's variables added, and return what a finished process would (never
    raises on failure): in a new process through the console script with ``process``, else ``cli.main`` here."""
    if process:
        return subprocess.run([entry_point(), *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **(env or {})}, check=False)
    from mgpu_edu.course import cli

    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    env_module.detect_environment.cache_clear()  # it reads MGPU_EDU_PLATFORM once
    os.chdir(cwd)
    try:
        with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(list(args))
            except SystemExit as exit_:  # argparse's usage errors and --help
                status = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
                if not isinstance(exit_.code, (int, type(None))):
                    print(exit_.code, file=sys.stderr)  # as the interpreter prints it
    finally:
        os.chdir(before)
        env_module.detect_environment.cache_clear()
    return subprocess.CompletedProcess(["mgpu-edu", *args], status, out.getvalue(), err.getvalue())


def write_notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(s)) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def code_of(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


# --- help and the command without TensorFlow -------------------------------------------------------

@pytest.mark.light  # starts processes, none of which imports TensorFlow
@pytest.mark.parametrize("command", [[], ["lessons"], ["student"], ["badges"], ["grade"], ["doctor"]])
def test_every_command_has_help(tmp_path, command):
    done = mgpu_edu(*command, "--help", cwd=tmp_path, process=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: mgpu-edu")
    if command:
        assert f"mgpu-edu {command[0]}" in done.stdout


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_no_command_is_a_usage_error(tmp_path):
    done = mgpu_edu(cwd=tmp_path, process=True)
    assert done.returncode == 2 and "required: COMMAND" in done.stderr


BLOCK_TENSORFLOW = '''
import importlib.abc, importlib.metadata, sys

class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")

sys.meta_path.insert(0, NoTensorFlow())
_version = importlib.metadata.version

def version(name):
    if name.startswith(("tensorflow", "tf-", "keras")):
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)

importlib.metadata.version = version
'''


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_everything_but_doctors_tensorflow_line_works_without_tensorflow(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_TENSORFLOW)
    env = {"PYTHONPATH": str(tmp_path / "site")}
    assert mgpu_edu("lessons", "L", cwd=tmp_path, process=True, env=env).returncode == 0
    assert mgpu_edu("student", "L", "S", cwd=tmp_path, process=True, env=env).returncode == 0
    assert mgpu_edu("badges", "--repo", "me/fork", "--ref", "x1", "--lessons", "S", cwd=tmp_path,
                    env=env, process=True).returncode == 0
    graded = mgpu_edu("grade", "--no-execute", str(LESSONS / "03_allreduce.ipynb"), cwd=tmp_path, process=True, env=env)
    assert graded.returncode == 0 and "03_allreduce: 2/2 correct" in graded.stdout
    doctor = mgpu_edu("doctor", cwd=tmp_path, process=True, env=env)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr  # the lessons need TensorFlow
    assert "✗ TensorFlow" in doctor.stdout and "not installed" in doctor.stdout
    assert 'pip install "mgpu-edu[' in doctor.stdout
    assert "ModuleNotFoundError" not in doctor.stderr


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_missing_notebook_tools_name_the_extra(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_TENSORFLOW.replace(
        '("tensorflow", "keras", "tf_keras")', '("tensorflow", "keras", "tf_keras", "nbconvert", "nbclient")'))
    env = {"PYTHONPATH": str(tmp_path / "site")}
    for args in (["student", str(LESSONS), "out"], ["grade", "x.ipynb"]):
        done = mgpu_edu(*args, cwd=tmp_path, process=True, env=env)
        assert done.returncode == 2, done.stderr
        assert 'pip install "mgpu-edu[instructor]"' in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


# --- lessons ---------------------------------------------------------------------------------------

def test_lessons_copies_then_protects_changes(tmp_path):
    done = mgpu_edu("lessons", "my lessons", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    target = tmp_path / "my lessons"
    assert sorted(p.name for p in target.iterdir()) == sorted([lesson.file for lesson in COURSE.lessons]
                                                              + [course.MANIFEST])
    assert (target / "03_allreduce.ipynb").read_bytes() == (LESSONS / "03_allreduce.ipynb").read_bytes()
    assert course.load(target).lessons == COURSE.lessons  # the copy is a course of its own
    again = mgpu_edu("lessons", "my lessons", cwd=tmp_path)
    assert again.returncode == 0 and "0 file(s) copied" in again.stdout

    edited = target / "06_custom_loops.ipynb"
    edited.write_text(edited.read_text() + " ")
    refused = mgpu_edu("lessons", "my lessons", cwd=tmp_path)
    assert refused.returncode == 2
    assert "06_custom_loops.ipynb" in refused.stderr and "--force" in refused.stderr
    assert edited.read_text().endswith(" ")  # the learner's work is untouched
    forced = mgpu_edu("lessons", "my lessons", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and "1 file(s) copied" in forced.stdout
    assert edited.read_bytes() == (LESSONS / edited.name).read_bytes()


def test_lessons_into_a_file_is_refused(tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    done = mgpu_edu("lessons", "taken", cwd=tmp_path)
    assert done.returncode == 2 and "'taken' exists and is not a folder" in done.stderr


# --- student ---------------------------------------------------------------------------------------

def test_student_versions_strip_solutions_clear_outputs_and_keep_checks(tmp_path):
    done = mgpu_edu("student", str(LESSONS), "student", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert course.load(tmp_path / "student").lessons == COURSE.lessons  # the manifest goes with them
    for lesson in COURSE.lessons:
        student = tmp_path / "student" / lesson.file
        nb = nbformat.read(student, as_version=4)
        code = code_of(student)
        assert markers.BEGIN not in code and markers.END not in code
        assert markers.CHECK_MARKER not in code
        assert code.count("# YOUR CODE HERE") == len(lesson.checks)
        assert tuple(markers.CHECK_CALL.findall(code)) == lesson.checks
        assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code")
        assert nb.metadata[markers.STUDENT_FLAG] is True and "widgets" not in nb.metadata
        badges = next(c.source for c in nb.cells if c.metadata.get(course.CELL_ROLE) == "badges")
        assert badges.count(f"/{course.STUDENT}/{lesson.file}") == 2 and "/lessons/" not in badges  # no way to answers
        nbformat.validate(nb)
    shards = code_of(tmp_path / "student" / "02_data_parallel.ipynb")
    assert "def my_shard_bounds(batch, n):\n    return ..." in shards and "bounds.append" not in shards


def test_student_refuses_existing_destination_unless_forced(tmp_path):
    lesson = LESSONS / "03_allreduce.ipynb"
    assert mgpu_edu("student", str(lesson), "out", cwd=tmp_path).returncode == 0
    again = mgpu_edu("student", str(lesson), "out", cwd=tmp_path)
    assert again.returncode == 2 and "already exist" in again.stderr and "--force" in again.stderr
    assert mgpu_edu("student", str(lesson), "out", "--force", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(("args", "message"), [
    (["missing", "out"], "'missing' does not exist"),
    (["empty", "out"], "holds no .ipynb notebooks"),
    (["notes.txt", "out"], "is not a notebook"),
    (["src", "src"], "would replace them"),
    (["src", "notes.txt"], "exists and is not a folder"),
    (["broken.ipynb", "out"], "is never closed"),
    (["notjson.ipynb", "out"], "'notjson.ipynb' is not a notebook file"),
])
def test_student_bad_inputs(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "src").mkdir()
    write_notebook(tmp_path / "src" / "a.ipynb", "x = 1")
    write_notebook(tmp_path / "broken.ipynb", "### BEGIN SOLUTION\nanswer = 1\n")
    (tmp_path / "notjson.ipynb").write_text("this is not json {")
    done = mgpu_edu("student", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


# --- nbgrader --------------------------------------------------------------------------------------

def test_nbgrader_sets_up_a_course_folder_one_assignment_per_lesson(tmp_path):
    done = mgpu_edu("nbgrader", str(LESSONS), "course", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "nbgrader generate_assignment 00_devices" in done.stdout
    manifest = course.load(LESSONS)  # the install line names the fork and release the lessons point at
    assert f'"mgpu-edu[cpu,nbgrader] @ git+https://github.com/{manifest.repo}@{manifest.ref}"' in done.stdout
    for lesson in COURSE.lessons:
        copied = tmp_path / "course" / "source" / lesson.file.removesuffix(".ipynb") / lesson.file
        assert copied.read_bytes() == (LESSONS / lesson.file).read_bytes()
    config = (tmp_path / "course" / "nbgrader_config.py").read_text()
    assert "c.CourseDirectory.course_id = 'mgpu_edu'" in config and "generate_assignment_preprocessors()" in config
    assert mgpu_edu("nbgrader", str(LESSONS), "course", cwd=tmp_path).returncode == 0  # same files: nothing to refuse
    (tmp_path / "course" / "nbgrader_config.py").write_text(config + "c.Execute.timeout = 60\n")
    again = mgpu_edu("nbgrader", str(LESSONS), "course", cwd=tmp_path)
    assert again.returncode == 2 and "nbgrader_config.py" in again.stderr and "--force" in again.stderr
    assert mgpu_edu("nbgrader", str(LESSONS), "course", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "course" / "nbgrader_config.py").read_text() == config


@pytest.mark.parametrize(("args", "message"), [
    (["missing", "course"], "'missing' does not exist. Give a lesson notebook or a folder of them, for example: "
                            "mgpu-edu nbgrader lessons course"),
    (["LESSONS", "notes.txt"], "exists and is not a folder"),
    (["LESSONS", "course", "--course-id", "my course"], "course id 'my course' may hold only"),
    (["notjson.ipynb", "course"], "'notjson.ipynb' is not a notebook file"),
])
def test_nbgrader_bad_inputs(tmp_path, args, message):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "notjson.ipynb").write_text("this is not json {")
    done = mgpu_edu("nbgrader", *[str(LESSONS) if a == "LESSONS" else a for a in args], cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr
    assert not (tmp_path / "course").exists()


# --- badges ----------------------------------------------------------------------------------------

def make_fork(tmp_path: Path) -> Path:
    fork = tmp_path / "fork"
    shutil.copytree(LESSONS, fork / "lessons", ignore=shutil.ignore_patterns("_scratch", ".ipynb_checkpoints"))
    shutil.copytree(ROOT / course.STUDENT, fork / course.STUDENT)
    shutil.copy(ROOT / "README.md", fork / "README.md")
    (fork / ".git").mkdir()  # enough for the command to find the repository root
    return fork


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_badges_repoint_the_fork_and_twice_changes_nothing(tmp_path):
    fork = make_fork(tmp_path)
    done = mgpu_edu("badges", "--repo", "my-school/gpu-course", "--ref", "fall-2027", cwd=fork)
    assert done.returncode == 0, done.stderr
    # every lesson, README, the manifest; every student version (student/ holds notebooks only)
    assert f"{2 * len(COURSE.lessons) + 2} file(s) changed" in done.stdout
    forked = course.load(fork / "lessons")
    assert (forked.repo, forked.ref) == ("my-school/gpu-course", "fall-2027")
    assert sorted(p.suffix for p in (fork / "student").iterdir()) == [".ipynb"] * len(COURSE.lessons)
    handout = "".join(c.source for c in nbformat.read(fork / "student" / "04_mirrored_fit.ipynb", 4).cells)
    assert "github/my-school/gpu-course/blob/fall-2027/student/04_mirrored_fit.ipynb" in handout
    assert "git+https://github.com/my-school/gpu-course@fall-2027" in handout and "BEGIN SOLUTION" not in handout
    snapshot = {p: p.read_bytes() for p in fork.rglob("*") if p.is_file()}
    text = code_of(fork / "lessons" / "04_mirrored_fit.ipynb")
    assert 'mgpu-edu @ git+https://github.com/my-school/gpu-course@fall-2027' in text
    badges = "".join(c.source for c in nbformat.read(fork / "lessons" / "04_mirrored_fit.ipynb", 4).cells)
    assert "github/my-school/gpu-course/blob/fall-2027/lessons/04_mirrored_fit.ipynb" in badges
    assert "v2/gh/my-school/gpu-course/fall-2027?urlpath=lab/tree/lessons/04_mirrored_fit.ipynb" in badges
    readme = (fork / "README.md").read_text()
    for block in course.readme_blocks(forked).values():  # the start links, lesson table and pip lines too
        assert block in readme
    assert "mgpu-edu/mgpu_edu" not in readme
    assert readme.count("git+https://github.com/my-school/gpu-course@fall-2027") == 5
    again = mgpu_edu("badges", "--repo", "my-school/gpu-course", "--ref", "fall-2027", cwd=fork)
    assert again.returncode == 0 and "Nothing to change" in again.stdout
    assert snapshot == {p: p.read_bytes() for p in fork.rglob("*") if p.is_file()}


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_badges_says_how_to_publish_and_that_an_existing_tag_wont_move(tmp_path):
    fork = make_fork(tmp_path)
    (fork / ".git").rmdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "I", "GIT_AUTHOR_EMAIL": "i@example.org", "GIT_COMMITTER_NAME": "I",
           "GIT_COMMITTER_EMAIL": "i@example.org"}
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fork"], ["tag", "fall-2027"]):
        subprocess.run(["git", *command], cwd=fork, env=env, check=True, capture_output=True)
    done = mgpu_edu("badges", "--repo", "me/fork", "--ref", "fall-2027", cwd=fork)
    assert done.returncode == 0, done.stderr
    assert "'fall-2027' is already a tag, and a tag doesn't move" in done.stdout
    assert "git tag fall-2027" not in done.stdout
    done = mgpu_edu("badges", "--repo", "me/fork", "--ref", "fall-2027b", cwd=fork)
    assert "git tag fall-2027b && git push origin HEAD fall-2027b" in done.stdout


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_badges_for_another_folder_of_student_versions_open_that_folder(tmp_path):
    fork = make_fork(tmp_path)
    assert mgpu_edu("student", "lessons", "handout", cwd=fork).returncode == 0
    readme = (fork / "README.md").read_bytes()
    done = mgpu_edu("badges", "--repo", "me/fork", "--ref", "main", "--lessons", "handout", cwd=fork / "lessons")
    assert done.returncode == 2  # run from inside lessons/, ./handout does not exist
    done = mgpu_edu("badges", "--repo", "me/fork", "--ref", "main", "--lessons", "handout", cwd=fork)
    assert done.returncode == 0, done.stderr
    cells = nbformat.read(fork / "handout" / "00_devices.ipynb", 4).cells
    assert "github/me/fork/blob/main/handout/00_devices.ipynb" in "".join(c.source for c in cells)
    assert (fork / "README.md").read_bytes() == readme  # the README's buttons are the course's student/
    assert course.load(fork / "handout").repo == "me/fork"  # the folder's own manifest
    assert course.load(fork / "lessons").repo == COURSE.repo  # the instructor lessons' untouched
    student = "".join(c.source for c in nbformat.read(fork / "student" / "00_devices.ipynb", 4).cells)
    assert f"github/{COURSE.repo}/blob/{COURSE.ref}/student/00_devices.ipynb" in student  # and the course's student/


@pytest.mark.parametrize(("args", "message"), [
    (["--repo", "not a slug"], "is not a GitHub repository slug"),
    (["--repo", "a/b/c"], "OWNER/NAME"),
    (["--repo", "my-school/gpu-course.git"], "write it without, as 'my-school/gpu-course'"),
    (["--repo", "me/fork", "--ref", "two words"], "is not a git tag, branch or commit"),
    (["--repo", "me/fork", "--ref", "../x"], "is not a git tag, branch or commit"),
    (["--repo", "me/fork", "--lessons", "nowhere"], "holds none of the course's lessons"),
])
def test_badges_bad_inputs(tmp_path, args, message):
    fork = make_fork(tmp_path)
    before = {p: p.read_bytes() for p in fork.rglob("*") if p.is_file()}
    done = mgpu_edu("badges", *args, cwd=fork)
    assert done.returncode == 2 and message in done.stderr
    assert before == {p: p.read_bytes() for p in fork.rglob("*") if p.is_file()}


def test_badges_needs_a_repo(tmp_path):
    done = mgpu_edu("badges", cwd=tmp_path)
    assert done.returncode == 2 and "--repo" in done.stderr


# --- grade -----------------------------------------------------------------------------------------

def test_a_folder_that_cant_be_made_is_one_line(tmp_path):
    done = mgpu_edu("lessons", "/dev/null/x", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("mgpu-edu lessons: error: '/dev/null/x': can't make that folder (Not a directory)")


def test_grade_tells_same_named_notebooks_apart_by_their_path(tmp_path):
    # GitHub Classroom: one clone per student, the same file name in each
    for student in ("alice-repo", "bob-repo"):
        (tmp_path / student).mkdir()
        shutil.copy(LESSONS / "07_model_parallel.ipynb", tmp_path / student)
    done = mgpu_edu("grade", "--no-execute", "alice-repo/07_model_parallel.ipynb", "bob-repo/07_model_parallel.ipynb",
                    "--csv", "grades.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "alice-repo/07_model_parallel: 2/2 correct, 2/2 points (lesson 07_model_parallel)" in done.stdout
    assert "bob-repo/07_model_parallel: 2/2 correct" in done.stdout
    assert "not verified" in done.stderr  # --no-execute says that it trusts the stored outputs
    rows = list(csv.DictReader((tmp_path / "grades.csv").read_text().splitlines()))
    assert [(r["student"], r["exercise"]) for r in rows] == [("alice-repo/07_model_parallel", e) for e in "12"] + [
        ("alice-repo/07_model_parallel", "total")] + [("bob-repo/07_model_parallel", e) for e in ("1", "2", "total")]
    assert "stored outputs" in rows[2]["feedback"]


def test_grade_takes_a_folder_of_notebooks(tmp_path):
    for student in ("alice", "bob"):
        (tmp_path / "in" / student / ".ipynb_checkpoints").mkdir(parents=True)
        shutil.copy(LESSONS / "03_allreduce.ipynb", tmp_path / "in" / student)
        shutil.copy(LESSONS / "03_allreduce.ipynb", tmp_path / "in" / student / ".ipynb_checkpoints")
    done = mgpu_edu("grade", "--no-execute", "in", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "alice/03_allreduce: 2/2 correct" in done.stdout and "bob/03_allreduce: 2/2 correct" in done.stdout
    assert "checkpoints" not in done.stdout
    (tmp_path / "empty").mkdir()
    empty = mgpu_edu("grade", "empty", cwd=tmp_path)
    assert empty.returncode == 2 and "'empty' is a folder with no notebooks (.ipynb) in it" in empty.stderr


@pytest.mark.light  # grading a file that doesn't exist still says what the sandbox holds (a Python, no TensorFlow)
def test_grade_reads_saved_outputs_and_explains_bad_inputs(tmp_path):
    done = mgpu_edu("grade", "--no-execute", str(LESSONS / "07_model_parallel.ipynb"), cwd=tmp_path)
    assert done.returncode == 0 and "07_model_parallel: 2/2 correct" in done.stdout
    missing = mgpu_edu("grade", "nope.ipynb", cwd=tmp_path)
    assert missing.returncode == 1 and "'nope.ipynb' does not exist" in missing.stdout
    bad = mgpu_edu("grade", "--timeout", "soon", "x.ipynb", cwd=tmp_path)
    assert bad.returncode == 2 and "'soon' is not a whole number of seconds" in bad.stderr
    jobs = mgpu_edu("grade", "--jobs", "0", "x.ipynb", cwd=tmp_path)
    assert jobs.returncode == 2 and "'0' is not a whole number above 0" in jobs.stderr
    lesson = mgpu_edu("grade", "--lesson", "99", "x.ipynb", cwd=tmp_path)
    assert lesson.returncode == 2 and "--lesson 99: no lesson with exercises matches; give one of 00_devices" in \
        lesson.stderr
    glob = mgpu_edu("grade", "handed-in/*.ipynb", cwd=tmp_path)  # the shell passes a pattern that matched nothing
    assert glob.returncode == 1 and "does not exist (a pattern that matched no file?)" in glob.stdout
    student = tmp_path / "never-run.ipynb"
    nbformat.write(assignments.student_version(nbformat.read(LESSONS / "07_model_parallel.ipynb", 4)), student)
    unrun = mgpu_edu("grade", "--no-execute", student.name, cwd=tmp_path)
    assert unrun.returncode == 1 and "has no saved outputs: it was handed in without being run" in unrun.stdout
    assert "Grade it without --no-execute" in unrun.stdout
    (tmp_path / "feedback").write_text("")
    taken = mgpu_edu("grade", "--feedback", "feedback", "x.ipynb", cwd=tmp_path)
    assert taken.returncode == 2 and "--feedback feedback: that is a file" in taken.stderr


def test_grade_grades_every_notebook_of_a_batch_and_always_writes_the_csv(tmp_path):
    """An unreadable, a missing and an exercise-less notebook among good ones: each is a 'failed' row with its
    reason, the good ones are graded all the same, the CSV has every row, and the exit status says it."""
    shutil.copy(LESSONS / "03_allreduce.ipynb", tmp_path / "alice.ipynb")
    (tmp_path / "broken.ipynb").write_text("this is not a notebook")
    write_notebook(tmp_path / "plain.ipynb", "print('no exercises here')")
    shutil.copy(LESSONS / "07_model_parallel.ipynb", tmp_path / "zoe.ipynb")
    done = mgpu_edu("grade", "--no-execute", "alice.ipynb", "broken.ipynb", "missing.ipynb", "plain.ipynb",
                    "zoe.ipynb", "--csv", "g.csv", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "alice: 2/2 correct" in done.stdout and "zoe: 2/2 correct" in done.stdout
    assert "broken: not graded (failed: 'broken.ipynb' is not a notebook file" in done.stdout
    assert "ask for the .ipynb again" in done.stdout
    assert "missing: not graded (failed: 'missing.ipynb' does not exist" in done.stdout
    assert "plain: not graded (failed: no exercises" in done.stdout
    assert "3 of 5 notebook(s) could not be graded: broken.ipynb, missing.ipynb, plain.ipynb" in done.stderr
    rows = list(csv.DictReader((tmp_path / "g.csv").read_text().splitlines()))
    assert [(r["student"], r["exercise"], r["status"]) for r in rows] == [
        ("alice", "1", "correct"), ("alice", "2", "correct"), ("alice", "total", "graded"),
        ("broken", "total", "failed"), ("missing", "total", "failed"), ("plain", "total", "failed"),
        ("zoe", "1", "correct"), ("zoe", "2", "correct"), ("zoe", "total", "graded")]


def test_grade_checks_the_gradebook_folder_before_grading(tmp_path):
    done = mgpu_edu("grade", "--no-execute", str(LESSONS / "03_allreduce.ipynb"), "--csv", "no/such/g.csv",
                    cwd=tmp_path)
    assert done.returncode == 2 and "'no/such' doesn't exist" in done.stderr and "grading" not in done.stderr
    (tmp_path / "grades").mkdir()
    folder = mgpu_edu("grade", "--no-execute", str(LESSONS / "03_allreduce.ipynb"), "--csv", "grades", cwd=tmp_path)
    assert folder.returncode == 2 and "that is a folder" in folder.stderr


def test_grade_names_the_students_error_not_the_checks_name_error(tmp_path):
    """The answer cell raised, so `answer` was never set and the check cell raised NameError: the grade
    reports the student's own error, the one to fix."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("answer = 2 * (8 - 1) / zero"),
        nbformat.v4.new_code_cell("feedback = check.ring_steps(answer, n=8)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="name 'zero' is not defined")]
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="name 'answer' is not defined")]
    nbformat.write(nb, tmp_path / "bob.ipynb")
    done = mgpu_edu("grade", "--no-execute", "bob.ipynb", cwd=tmp_path)
    assert done.returncode == 0
    assert "your cell above raised NameError: name 'zero' is not defined" in done.stdout
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="SyntaxError",
                                                  evalue="expected ':' (565971781.py, line 1)")]
    nbformat.write(nb, tmp_path / "bob.ipynb")
    done = mgpu_edu("grade", "--no-execute", "bob.ipynb", cwd=tmp_path)
    assert "your cell above raised SyntaxError: expected ':' (line 1 of that cell)" in done.stdout


# --- doctor ----------------------------------------------------------------------------------------

@pytest.mark.processes
def test_doctor_reports_this_machine(tmp_path):
    done = mgpu_edu("doctor", cwd=tmp_path, env={"MGPU_EDU_PLATFORM": "binder"})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for name in ("Platform", "Python", "TensorFlow", "TensorFlow GPUs", "Keras", "ipywidgets", "GPUs (nvidia-smi)"):
        assert f" {name} " in out, name
    assert "Binder" in out and "What will work here:" in out
    import tensorflow as tf

    assert tf.__version__ in out
    if not tf.config.list_physical_devices("GPU"):
        assert "logical CPUs" in out and "NcclAllReduce (lesson 03) needs real GPUs" in out


def test_student_and_nbgrader_say_when_a_notebook_has_no_exercises(tmp_path):
    (tmp_path / "src").mkdir()
    write_notebook(tmp_path / "src" / "plain.ipynb", "print('no exercises here')")
    shutil.copy(LESSONS / "03_allreduce.ipynb", tmp_path / "src")
    for args in (["student", "src", "out"], ["nbgrader", "src", "course"]):
        done = mgpu_edu(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "plain.ipynb has no exercises" in done.stderr and "03_allreduce.ipynb has no" not in done.stderr

