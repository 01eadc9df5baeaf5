"""The course manifest (lessons/course.toml): reading it, pointing the lessons at a fork, adding a lesson."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from conftest import budgets_script
from mgpu_edu import assignments, course

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
COURSE = course.load(LESSONS)


def test_the_manifest_lists_exactly_the_lesson_notebooks():
    assert sorted(p.name for p in LESSONS.glob("*.ipynb")) == [lesson.file for lesson in COURSE.lessons]
    assert course.shipped() == COURSE  # a checkout ships the same course it tests


@pytest.mark.parametrize("lesson", COURSE.lessons, ids=lambda lesson: lesson.file)
def test_every_lesson_follows_the_template_and_the_manifest(lesson):
    assert course.lesson_problems(COURSE, lesson) == []


def test_every_check_the_manifest_names_exists():
    from mgpu_edu import check

    for lesson in COURSE.lessons:
        for name in lesson.checks:
            assert callable(getattr(check, name, None)), f"{lesson.file}: check.{name} doesn't exist"


def test_configure_is_idempotent_and_repoints(tmp_path):
    lessons = tmp_path / "lessons"
    shutil.copytree(LESSONS, lessons, ignore=shutil.ignore_patterns("_scratch", ".ipynb_checkpoints"))
    assert course.configure(lessons) == []  # already pointing at the manifest's repo and ref
    changed = course.configure(lessons, repo="my-school/gpu-course", ref="spring-2027")
    assert len(changed) == len(COURSE.lessons)
    text = "".join(cell.source for cell in nbformat.read(changed[0], as_version=4).cells)
    assert "my-school/gpu-course@spring-2027" in text
    assert "github/my-school/gpu-course/blob/spring-2027/lessons/" in text
    assert course.configure(lessons, repo="my-school/gpu-course", ref="spring-2027") == []


def test_lessons_that_run_tensorflow_ask_colab_for_a_gpu():
    for lesson in COURSE.lessons:
        for folder in (LESSONS, LESSONS.parent / course.STUDENT):
            meta = nbformat.read(folder / lesson.file, as_version=4).metadata
            asks = {key: meta.get(key) for key in course.COLAB_GPU}
            assert asks == (course.COLAB_GPU if lesson.tensorflow else dict.fromkeys(course.COLAB_GPU)), lesson.file


def test_the_student_folder_holds_the_lessons_student_versions(tmp_path):
    """student/ (what the README's buttons open) is generated: it must be what the lessons make now."""
    student = tmp_path / course.STUDENT
    shutil.copytree(LESSONS.parent / course.STUDENT, student)
    stale = assignments.refresh_student_folder(LESSONS, student)
    assert stale == [], f"student/ is out of date ({stale[0].name}): run make lessons (or python -m mgpu_edu.course .)"


def test_refreshing_the_student_folder_writes_only_what_changed(tmp_path):
    student = tmp_path / "student"
    written = assignments.refresh_student_folder(LESSONS, student)
    assert sorted(p.name for p in written) == sorted(lesson.file for lesson in COURSE.lessons)  # notebooks only
    stamp = {p: p.stat().st_mtime_ns for p in student.glob("*.ipynb")}
    (student / "99_gone.ipynb").write_text("{}", encoding="utf-8")  # a lesson that left the manifest
    assert assignments.refresh_student_folder(LESSONS, student) == [student / "99_gone.ipynb"]
    assert not (student / "99_gone.ipynb").exists()
    assert stamp == {p: p.stat().st_mtime_ns for p in student.glob("*.ipynb")}  # the rest untouched
    cells = nbformat.read(student / "03_allreduce.ipynb", as_version=4).cells
    text = "".join(c.source for c in cells)
    assert f"github/{COURSE.repo}/blob/{COURSE.ref}/student/03_allreduce.ipynb" in text
    assert "BEGIN SOLUTION" not in text and all(not c.get("outputs") for c in cells)


def test_set_defaults_rewrites_only_repo_and_ref(tmp_path):
    manifest = tmp_path / course.MANIFEST
    manifest.write_bytes(COURSE.manifest.read_bytes())
    assert course.set_defaults(manifest, "my-school/gpu-course", "fall-2027")
    forked = course.load(tmp_path)
    assert (forked.repo, forked.ref, forked.lessons) == ("my-school/gpu-course", "fall-2027", COURSE.lessons)
    assert not course.set_defaults(manifest, "my-school/gpu-course", "fall-2027")  # twice: no change
    lines = manifest.read_text().splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        line for line in COURSE.manifest.read_text().splitlines() if line.startswith("#")]  # comments kept


@pytest.mark.parametrize(("text", "message"), [
    ("", "needs a [course] table"),
    ('[course]\nrepo = "a/b"\nref = "v1"\n', "lists no lessons"),
    ('[course]\nrepo = "not a slug"\nref = "v1"\n[[lesson]]\n', "not a GitHub repository slug"),
    ('[course]\nrepo = "a/b"\nref = "v1"\n[[lesson]]\nfile = "x.ipynb"\ntitle = "X"\nminutes = 5\nchecks = []\n',
     "file='x.ipynb' must name a notebook like"),
    ('[course]\nrepo = "a/b"\nref = "v1"\n[[lesson]]\nfile = "00_a.ipynb"\ntitle = "A"\nminutes = 5\n',
     "missing checks"),
    ('[course]\nrepo = "a/b"\nref = "v1"\n[[lesson]]\nfile = "00_a.ipynb"\ntitle = "A"\nminutes = 0\nchecks = []\n',
     "minutes=0"),
    ('[course]\nrepo = "a/b"\nref = "v1"\n[[lesson]]\nfile = "00_a.ipynb"\ntitle = "A"\nminutes = 5\nchecks = []\n'
     '[[lesson]]\nfile = "02_b.ipynb"\ntitle = "B"\nminutes = 5\nchecks = []\n', "no gaps"),
    ('[course]\nrepo = "a/b"\nref = "v1"\n[[lesson]]\nfile = "00_a.ipynb"\ntitle = "A"\nminutes = 5\nchecks = []\n'
     'colour = "red"\n', "unknown key(s) colour"),
    ("[course\n", "is not valid TOML"),
])
def test_a_bad_manifest_is_explained(tmp_path, text, message):
    (tmp_path / course.MANIFEST).write_text(text)
    with pytest.raises(course.ManifestError, match=re.escape(message)):
        course.load(tmp_path)


def test_a_folder_without_a_manifest_is_explained(tmp_path):
    with pytest.raises(course.ManifestError, match="has no course.toml"):
        course.load(tmp_path)


@pytest.mark.parametrize("slug", ["", "noslash", "a/b/c", "-bad/name", "owner/", "owner name/x", None])
def test_bad_slug_is_explained(slug):
    with pytest.raises(ValueError, match="OWNER/NAME"):
        course.check_slug(slug)


def test_good_slug_passes():
    assert course.check_slug("my-school/mgpu_edu.v2") == "my-school/mgpu_edu.v2"


def test_adding_a_lesson_is_one_notebook_and_one_manifest_entry(tmp_path):
    """A tenth lesson in a copy of the course: the course checks, badges, student versions and the
    budget listing all take it in, with no code edited."""
    root = tmp_path / "course"
    lessons = root / "lessons"
    shutil.copytree(LESSONS, lessons, ignore=shutil.ignore_patterns("_scratch", ".ipynb_checkpoints"))
    shutil.copy(ROOT / "README.md", root / "README.md")
    last = COURSE.lessons[-1]
    number = f"{int(last.number) + 1:02d}"
    new_file, title = f"{number}_extra_practice.ipynb", "Extra practice with devices"
    # 1. the notebook: here a copy of lesson 00, retitled
    nb = nbformat.read(LESSONS / COURSE.lessons[0].file, as_version=4)
    nb.cells[0].source = nb.cells[0].source.replace(f"# 00 · {COURSE.lessons[0].title}", f"# {number} · {title}")
    nbformat.write(nb, lessons / new_file)
    # 2. one manifest entry
    with open(lessons / course.MANIFEST, "a", encoding="utf-8") as manifest:
        manifest.write(f'\n[[lesson]]\nfile = "{new_file}"\ntitle = "{title}"\nminutes = 20\n'
                       'checks = ["placed_on", "memory_split"]\n')
    extended = course.load(lessons)
    assert len(extended.lessons) == len(COURSE.lessons) + 1 and extended.span.endswith(number)
    # the badges and README table (make lessons / mgpu-edu badges) cover it
    changed = course.configure(lessons, readme=root / "README.md")
    assert lessons / new_file in changed and root / "README.md" in changed
    assert f"[{title}](lessons/{new_file})" in (root / "README.md").read_text()
    # the course checks pass for it, as for every other lesson
    assert course.lesson_problems(extended, extended.lesson(new_file)) == []
    # student versions include it, with the manifest
    written = assignments.write_student_versions(lessons, tmp_path / "student")
    assert tmp_path / "student" / new_file in written and (tmp_path / "student" / course.MANIFEST).exists()
    # the budget script lists it
    budgets = budgets_script()
    assert budgets.lesson_paths(root)[-1] == lessons / new_file
    # the guide's table lists it
    table = budgets.guide_table(extended, [{"lesson": new_file, "seconds": 1.0}], "today")
    assert f"| {number} | {title} | 20 min | 1.0 s |" in table


@pytest.mark.light  # git
def test_the_ref_the_badges_open_exists_in_the_repository():
    """Colab installs, and the badges open, the manifest's ref: a branch or tag of this repository, or every
    lesson's first cell fails once the course is published."""
    import subprocess

    ref = course.load(ROOT / "lessons").ref
    found = [kind for kind in ("heads", "tags", "remotes/origin") if subprocess.run(
        ["git", "rev-parse", "-q", "--verify", f"refs/{kind}/{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
        check=False).returncode == 0]
    assert found, f"lessons/course.toml's ref {ref!r} is neither a branch nor a tag here: `mgpu-edu badges --ref`"
