"""The course as data: ``lessons/course.toml`` read into a :class:`Course`, and what derives from it.

The manifest names the repository and release the lessons point at and, per lesson, its
notebook, title, learner time, exercise checks and widgets. From it come each lesson's badge
row (Open in Colab, Launch Binder) and Colab install cell, the README's lesson table, and the
checks in :func:`lesson_problems` that every lesson notebook passes. ``python -m mgpu_edu.course``
rewrites the badges and install cells in ``lessons/`` and the README's table, and strips run
metadata from the notebooks. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mgpu_edu.course.markers import CHECK_CALL

#: The manifest's file name, in the lessons folder.
MANIFEST = "course.toml"
#: Cell metadata key that marks the cells this module writes.
CELL_ROLE = "mgpu_edu_role"
#: Section headings every lesson has, in this order; the numbered ones between read "## N · Title".
REQUIRED_HEADINGS = ("## Overview", "## Setup", "## Exercises", "## Summary", "## What's next")
#: Headings a lesson may have besides the numbered sections.
UNNUMBERED_HEADINGS = (*REQUIRED_HEADINGS, "## Sources")

_SLUG = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_REF = re.compile(r"^(?!.*\.\.)(?!/)(?!.*/$)[A-Za-z0-9._/+-]{1,200}$")
_LESSON_FILE = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


class ManifestError(ValueError):
    """The course manifest is missing, unreadable, or describes the lessons wrongly."""


@dataclasses.dataclass(frozen=True)
class Lesson:
    """One lesson, as the manifest describes it."""

    file: str
    title: str
    minutes: int
    checks: tuple[str, ...]
    widgets: tuple[str, ...] = ()
    tensorflow: bool = True

    @property
    def number(self) -> str:
        """The lesson's two-digit number, "00" for ``00_devices.ipynb``."""
        return self.file[:2]


@dataclasses.dataclass(frozen=True)
class Course:
    """The repository and release the lessons point at, the lessons, and the folder that holds them."""

    repo: str
    ref: str
    lessons: tuple[Lesson, ...]
    folder: Path

    @property
    def manifest(self) -> Path:
        return self.folder / MANIFEST

    @property
    def span(self) -> str:
        """The lessons' numbers as a range, e.g. "00–08"."""
        return f"{self.lessons[0].number}–{self.lessons[-1].number}"

    def lesson(self, file: str) -> Lesson:
        """The lesson whose notebook is ``file``; KeyError naming the known ones otherwise."""
        for lesson in self.lessons:
            if lesson.file == file:
                return lesson
        raise KeyError(f"{file!r} is not a lesson of this course ({', '.join(ls.file for ls in self.lessons)}).")


def check_slug(repo: str) -> str:
    """Return repo if it looks like GitHub's "owner/name", else raise ValueError saying why.

    Example:
        >>> check_slug("my-school/mgpu_edu")
        'my-school/mgpu_edu'
    """
    if not isinstance(repo, str) or not _SLUG.match(repo):
        raise ValueError(
            f"{repo!r} is not a GitHub repository slug. Write it as OWNER/NAME, for example "
            "'my-school/mgpu_edu' (letters, digits, '-', '.', '_')."
        )
    if repo.lower().endswith(".git"):  # a clone URL's tail: Colab's and Binder's links would not open
        raise ValueError(f"{repo!r} ends in .git, which Colab's and Binder's links don't take: "
                         f"write it without, as {repo[:-4]!r}.")
    return repo


def check_ref(ref: str) -> str:
    """Return ref if it can name a git tag, branch or commit, else raise ValueError saying why.

    Example:
        >>> check_ref("fall-2027")
        'fall-2027'
    """
    if not isinstance(ref, str) or not _REF.match(ref) or ref.endswith(".lock"):
        raise ValueError(
            f"{ref!r} is not a git tag, branch or commit. Use letters, digits and . _ - / +, "
            "for example 'v0.1.0' or 'main'."
        )
    return ref


def check_folder(folder: str) -> str:
    """Return a repository-relative folder like "lessons" or "course/student", else raise ValueError.

    Example:
        >>> check_folder("course/student")
        'course/student'
    """
    parts = folder.split("/") if isinstance(folder, str) else [""]
    if not all(part and part not in (".", "..") and re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in parts):
        raise ValueError(
            f"{folder!r} is not a folder inside the repository. Give a relative path such as 'lessons' "
            "or 'student' (letters, digits, '.', '_', '-', separated by '/')."
        )
    return folder


def _lesson_entry(entry: Any, where: str) -> Lesson:
    if not isinstance(entry, dict):
        raise ManifestError(f"{where}: each [[lesson]] must be a table with file, title, minutes and checks.")
    unknown = set(entry) - {"file", "title", "minutes", "checks", "widgets", "tensorflow"}
    missing = {"file", "title", "minutes", "checks"} - set(entry)
    if unknown or missing:
        raise ManifestError(f"{where}: " + "; ".join(
            ([f"unknown key(s) {', '.join(sorted(unknown))}"] if unknown else [])
            + ([f"missing {', '.join(sorted(missing))}"] if missing else []))
            + ". A lesson has file, title, minutes, checks, and optionally widgets and tensorflow.")
    file = entry["file"]
    if not isinstance(file, str) or not _LESSON_FILE.match(file):
        raise ManifestError(f"{where}: file={file!r} must name a notebook like '09_memory.ipynb' "
                            "(two digits, an underscore, lower-case words).")
    minutes = entry["minutes"]
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
        raise ManifestError(f"{where}: minutes={minutes!r} must be the learner time in whole minutes, e.g. 30.")
    for key in ("checks", "widgets"):
        value = entry.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.isidentifier() for v in value):
            raise ManifestError(f"{where}: {key}={value!r} must be a list of names, e.g. [\"ring_bytes\"].")
    if not isinstance(entry.get("tensorflow", True), bool):
        raise ManifestError(f"{where}: tensorflow={entry['tensorflow']!r} must be true or false.")
    if not isinstance(entry["title"], str) or not entry["title"].strip():
        raise ManifestError(f"{where}: title={entry['title']!r} must be the lesson's title, as text.")
    return Lesson(file, entry["title"], minutes, tuple(entry["checks"]), tuple(entry.get("widgets", [])),
                  entry.get("tensorflow", True))


def load(folder: str | Path | None = None) -> Course:
    """Read the course manifest in ``folder`` (default: the lessons shipped with this installation).

    Raises ManifestError, saying what is wrong and where, for a missing or malformed manifest.

    Example:
        >>> load().lessons[0].file
        '00_devices.ipynb'
    """
    folder = shipped_folder("lessons") if folder is None else Path(folder)
    path = folder / MANIFEST
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{str(folder)!r} has no {MANIFEST}: a course folder lists its lessons there "
                            "(see CONTRIBUTING.md). Point at the lessons folder of a course.") from None
    except tomllib.TOMLDecodeError as error:
        raise ManifestError(f"{path} is not valid TOML ({error}). Fix that line.") from None
    header = data.get("course")
    if not isinstance(header, dict) or not {"repo", "ref"} <= set(header):
        raise ManifestError(f"{path} needs a [course] table with repo and ref, e.g. repo = \"owner/name\".")
    try:
        repo, ref = check_slug(header["repo"]), check_ref(header["ref"])
    except ValueError as error:
        raise ManifestError(f"{path}, [course]: {error}") from None
    entries = data.get("lesson")
    if not isinstance(entries, list) or not entries:
        raise ManifestError(f"{path} lists no lessons: add a [[lesson]] table for each notebook.")
    lessons = tuple(_lesson_entry(entry, f"{path}, lesson {i + 1}") for i, entry in enumerate(entries))
    numbers = [int(lesson.number) for lesson in lessons]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ManifestError(f"{path}: the lessons are numbered {[ls.number for ls in lessons]}; list them in "
                            "order, each number once, with no gaps.")
    return Course(repo, ref, lessons, folder)


@functools.cache
def shipped() -> Course:
    """The course that ships with this installation of mgpu_edu (read once)."""
    return load()


def colab_url(lesson: str, repo: str, ref: str, folder: str = "lessons") -> str:
    """The address that opens a lesson in Colab."""
    return f"https://colab.research.google.com/github/{repo}/blob/{ref}/{folder}/{lesson}"


def binder_url(lesson: str, repo: str, ref: str, folder: str = "lessons") -> str:
    """The address that opens a lesson in JupyterLab on mybinder.org."""
    return f"https://mybinder.org/v2/gh/{repo}/{ref}?urlpath=lab/tree/{folder}/{lesson}"


def badge_row(lesson: str, repo: str, ref: str, folder: str = "lessons") -> str:
    """Markdown for a lesson's badges; folder is where the notebook sits in the repository.

    Example:
        >>> badge_row("00_devices.ipynb", "me/course", "v1").count("](https://")
        4
    """
    return (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({colab_url(lesson, repo, ref, folder)}) "
        f"[![Launch Binder](https://mybinder.org/badge_logo.svg)]({binder_url(lesson, repo, ref, folder)})"
    )


def student_badges(source: str) -> str:
    """A badge row's links moved from ``lessons/`` to the student versions' folder: a student version's
    buttons must open a student version, never the lesson with its solutions.

    Example:
        >>> student_badges(badge_row("00_devices.ipynb", "me/lessons", "fall/2027")).count("/student/00_devices.ipynb")
        2
    """
    return re.sub(r"/lessons/(?=[^/)\s]+\.ipynb)", f"/{STUDENT}/", source)  # refs may hold "/" (fall/2027)


def requirement(repo: str, ref: str, extras: str = "") -> str:
    """The pip requirement that installs mgpu_edu from a fork at a ref (what Colab's cell installs).

    Example:
        >>> requirement("my-school/mgpu_edu", "fall-2027", extras="cpu,nbgrader")
        'mgpu-edu[cpu,nbgrader] @ git+https://github.com/my-school/mgpu_edu@fall-2027'
    """
    return f"mgpu-edu{f'[{extras}]' if extras else ''} @ git+https://github.com/{repo}@{ref}"


def install_cell(repo: str, ref: str) -> str:
    """Source of the first code cell: installs mgpu_edu on Colab only, pinned to ref."""
    return (
        "# On Colab, install the course's helper package (pinned to one release).\n"
        "# Everywhere else this cell does nothing: your environment already has it.\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        f'    %pip install --quiet "{requirement(repo, ref)}"'
    )


#: Where the student versions sit in the repository: the README's buttons open them.
STUDENT = "student"


def lesson_table(course: Course, repo: str | None = None, ref: str | None = None) -> str:
    """The README's lesson table (pointing at repo@ref, default the course's own): each title links to
    the lesson as stored, with outputs and solutions; its buttons open the student version."""
    repo, ref = repo or course.repo, ref or course.ref
    lines = ["| # | lesson | open, to solve its exercises |", "|---|---|---|"]
    for lesson in course.lessons:
        lines.append(f"| {lesson.number} | [{lesson.title}](lessons/{lesson.file}) | "
                     f"{badge_row(lesson.file, repo, ref, STUDENT)} |")
    return "\n".join(lines)


#: The README's install table: each extra, and what it adds.
INSTALLS = [("", "the helpers only; uses the TensorFlow you have (Colab)"),
            ("cpu", "plus `tensorflow-cpu` (plain `tensorflow` on macOS and on Linux on ARM, such as Docker on "
                    "Apple Silicon, where it is the CPU build)"),
            ("gpu", "plus `tensorflow[and-cuda]` for NVIDIA GPUs on Linux"),
            ("cpu,instructor", "plus nbformat, nbconvert, nbclient, ipykernel, psutil and tqdm, for `mgpu-edu "
                               "badges`, `student` and `grade`"),
            ("cpu,nbgrader", "plus nbgrader 0.9 (with JupyterLab 4 and Notebook 7) and the `instructor` extra, for "
                             "grading in the course folder `mgpu-edu nbgrader` makes; not for Colab")]


def start_links(course: Course, repo: str | None = None, ref: str | None = None) -> str:
    """The README's first step for learners: the first lesson in Colab and on Binder, at repo@ref."""
    repo, ref = repo or course.repo, ref or course.ref
    first = course.lessons[0]
    return (f"Open [lesson {first.number} in Colab]({colab_url(first.file, repo, ref, STUDENT)})\n"
            "(it asks Colab for a free T4 GPU; if it opens without one, choose Runtime → Change runtime type →\n"
            "T4 GPU. Nothing to install: the lesson's first cell installs the course's package), or\n"
            f"[on Binder]({binder_url(first.file, repo, ref, STUDENT)})\n"
            "(CPUs only, up to 2 GB of memory), and go on in order.")


def install_table(repo: str, ref: str) -> str:
    """The README's install table: one pip command per extra, each installing from repo at ref."""
    lines = ["| command | gives |", "|---|---|"]
    lines += [f'| `pip install "{requirement(repo, ref, extras)}"` | {gives} |' for extras, gives in INSTALLS]
    return "\n".join(lines)


def readme_blocks(course: Course, repo: str | None = None, ref: str | None = None) -> dict[str, str]:
    """What the README's generated blocks hold, by marker name: the start links, the lesson table and the
    install table, all pointing at repo@ref (default the course's own)."""
    repo, ref = repo or course.repo, ref or course.ref
    return {"start": start_links(course, repo, ref), "lessons": lesson_table(course, repo, ref),
            "install": install_table(repo, ref)}


def tidy_notebook(nb: Any) -> bool:
    """Strip what a run leaves in a notebook and doesn't teach; return True if anything changed.

    Per-cell execution timestamps go, and so does the Python version in ``language_info``.
    Outputs (nbval compares the checked ones), execution counts and the saved widget state
    (static viewers draw widgets from it) stay.
    """
    changed = False
    for cell in nb.cells:
        if "execution" in cell.get("metadata", {}):
            del cell.metadata["execution"]
            changed = True
    info = nb.metadata.get("language_info", {})
    if "version" in info:
        del info["version"]
        changed = True
    return changed


#: What a notebook's metadata holds to ask Colab for a GPU runtime (a T4 on the free tier) when it opens.
COLAB_GPU = {"accelerator": "GPU", "colab": {"gpuType": "T4"}}


def configure_notebook(nb: Any, lesson: str, repo: str, ref: str, folder: str = "lessons", gpu: bool = True) -> bool:
    """Rewrite a notebook's badge and install cells, ask Colab for a GPU runtime if ``gpu`` (a lesson
    that runs TensorFlow in its kernel), and tidy it; return True if anything changed."""
    wanted = {"badges": badge_row(lesson, repo, ref, folder), "colab-install": install_cell(repo, ref)}
    changed = tidy_notebook(nb)
    for key, value in COLAB_GPU.items():
        if gpu and nb.metadata.get(key) != value:
            nb.metadata[key] = value
            changed = True
        elif not gpu and key in nb.metadata:
            del nb.metadata[key]
            changed = True
    for cell in nb.cells:
        role = cell.get("metadata", {}).get(CELL_ROLE)
        if role in wanted and cell.source != wanted[role]:
            cell.source = wanted[role]
            changed = True
    return changed


def configure(lessons_dir: Path, repo: str | None = None, ref: str | None = None, readme: Path | None = None,
              folder: str = "lessons") -> list[Path]:
    """Point every lesson in lessons_dir (and the README's links) at repo@ref; return the changed files.

    The lessons are those of the manifest in lessons_dir, or of the shipped course where the
    folder has none (a folder of student copies, say); lessons missing from the folder are
    skipped. repo and ref default to the manifest's. folder is where lessons_dir sits inside
    the repository, as the badges' links need it.
    """
    import nbformat

    lessons_dir = Path(lessons_dir)
    course = load(lessons_dir) if (lessons_dir / MANIFEST).exists() else shipped()
    repo, ref = check_slug(repo or course.repo), check_ref(ref or course.ref)
    check_folder(folder)
    changed = []
    for lesson in course.lessons:
        path = lessons_dir / lesson.file
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        if configure_notebook(nb, lesson.file, repo, ref, folder, gpu=lesson.tensorflow):
            nbformat.write(nb, path)
            changed.append(path)
    if readme is not None and readme.exists():
        text = new = readme.read_text(encoding="utf-8")
        for name, block in readme_blocks(course, repo, ref).items():
            new = re.sub(rf"(<!-- {name}:start -->\n).*?(\n<!-- {name}:end -->)",
                         lambda m, block=block: m.group(1) + block + m.group(2), new, flags=re.S)
        if new != text:
            readme.write_text(new, encoding="utf-8")
            changed.append(readme)
    return changed


def set_defaults(manifest: Path, repo: str, ref: str) -> bool:
    """Write ``repo`` and ``ref`` into a course manifest's [course] table; return True if it changed.

    ``mgpu-edu badges`` calls it so that a fork's tests and ``make lessons`` agree with its badges.
    Only those two lines change; comments and the lessons stay as they are.
    """
    check_slug(repo)
    check_ref(ref)
    manifest = Path(manifest)
    text = manifest.read_text(encoding="utf-8")
    new = re.sub(r'^repo = ".*"$', f'repo = "{repo}"', text, count=1, flags=re.M)
    new = re.sub(r'^ref = ".*"$', f'ref = "{ref}"', new, count=1, flags=re.M)
    if new == text:
        return False
    manifest.write_text(new, encoding="utf-8")
    written = load(manifest.parent)
    if (written.repo, written.ref) != (repo, ref):  # a manifest laid out unlike ours: say so, don't guess
        manifest.write_text(text, encoding="utf-8")
        raise ManifestError(f"{manifest}: could not set repo and ref; write them in its [course] table by hand.")
    return True


#: A path that only exists on the machine that ran a lesson: a home or work folder, a temporary one,
#: an installed package's file (a warning quotes one), a Windows drive.
_MACHINE_PATH = re.compile(r"(?:/home/|/root/|/work/|/Users/|/tmp/|/private/var/|site-packages|\b[A-Z]:\\)\S*")


def lesson_problems(course: Course, lesson: Lesson) -> list[str]:
    """Everything in a lesson notebook that disagrees with the lesson template or the manifest.

    An empty list means the notebook has: the title "# NN · Title" from the manifest, then the
    badge row and the guarded Colab install cell (the first code cell) built from the course's
    repo and ref; the template's sections in order, numbered ones as "## N · Title"; the learner
    time the manifest gives; ``setup_devices`` with its banner checked (or, for a lesson whose
    kernel doesn't import TensorFlow, neither); exactly the manifest's exercise checks; stored
    outputs that quote no path of the machine that ran them; and fresh, tidy execution
    (counts 1, 2, 3 … and no run metadata).
    """
    import nbformat

    path = course.folder / lesson.file
    if not path.exists():
        return [f"{lesson.file}: the manifest lists it, but {path} doesn't exist"]
    nb = nbformat.read(path, as_version=4)
    problems: list[str] = []

    def problem(text: str) -> None:
        problems.append(f"{lesson.file}: {text}")

    title = f"# {lesson.number} · {lesson.title}"
    if not nb.cells or nb.cells[0].cell_type != "markdown" or nb.cells[0].source.splitlines()[0] != title:
        problem(f"the first cell must start with the title {title!r} (the manifest's title)")
    roles = {cell.metadata.get(CELL_ROLE): cell for cell in nb.cells}
    if roles.get("badges") is None or roles["badges"].source != badge_row(lesson.file, course.repo, course.ref):
        problem("the badge row doesn't point at the manifest's repo and ref; run make lessons")
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    install = roles.get("colab-install")
    if install is None or install.source != install_cell(course.repo, course.ref) or not code or code[0] is not install:
        problem("the first code cell must be the Colab install cell for the manifest's repo and ref")
    headings = [line.strip() for cell in nb.cells if cell.cell_type == "markdown"
                for line in cell.source.splitlines() if line.startswith("## ")]
    order = [h for h in headings if h in REQUIRED_HEADINGS]
    if order != list(REQUIRED_HEADINGS):
        problem(f"its sections are {order}; the template needs {list(REQUIRED_HEADINGS)}, in that order")
    for heading in headings:
        if heading not in UNNUMBERED_HEADINGS and not re.fullmatch(r"## \d+ · \S.*", heading):
            problem(f"heading {heading!r}: number sections as '## 1 · Title'")
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    stated = re.search(r"\*\*Time to learn:\*\*\s*(?:about\s+)?(\d+)\s*minutes", text)
    if not stated or int(stated.group(1)) != lesson.minutes:
        problem(f"its Overview must say '**Time to learn:** {lesson.minutes} minutes' (the manifest's minutes)")
    tensorflow = any(re.search(r"^\s*(import tensorflow|from tensorflow)", c.source, re.M) for c in code)
    setup = [c for c in code if "setup_devices(" in c.source]
    if lesson.tensorflow and not (setup and "NBVAL_CHECK_OUTPUT" in setup[0].source):
        problem("its first TensorFlow call must be setup_devices(...), in a cell whose banner is checked")
    if not lesson.tensorflow and (tensorflow or setup):
        problem("the manifest says its kernel doesn't import TensorFlow, but a cell does")
    calls = [m.group(1) for c in code for m in CHECK_CALL.finditer(c.source)]
    if tuple(calls) != lesson.checks:
        problem(f"its exercises call check.{', check.'.join(calls) or '(nothing)'}; the manifest lists "
                f"{list(lesson.checks)}")
    for number, cell in enumerate(code, start=1):
        for output in cell.get("outputs", []):
            shown = output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
            found = _MACHINE_PATH.search(shown)
            if found:
                problem(f"code cell {number}'s stored output quotes a path of the machine that ran it "
                        f"({found.group(0)!r}): print what learners need without it (a warning's message, "
                        "a file's name)")
    counts = [cell.execution_count for cell in code]
    if counts != list(range(1, len(counts) + 1)):
        problem("it is not freshly executed top to bottom; run make lessons")
    if any("execution" in cell.metadata for cell in nb.cells) or "version" in nb.metadata.get("language_info", {}):
        problem("it carries run metadata (timestamps, Python version); run make lessons")
    return problems


def lesson_files(course: Course) -> Sequence[Path]:
    """The course's notebooks, in order."""
    return [course.folder / lesson.file for lesson in course.lessons]


def shipped_folder(name: str) -> Path:
    """The course folder ("lessons" or "examples") that ships with this installation of mgpu_edu.

    A wheel carries it inside the package; a source checkout (or an editable install) keeps it
    beside the package. Raises FileNotFoundError, saying how to get it, when neither exists.
    """
    package = Path(__file__).resolve().parents[1]  # mgpu_edu/, above this subpackage
    for candidate in (package / name, package.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"this installation of mgpu_edu ({package}) has no {name!r} folder. Reinstall it from the "
        "course repository, as its README says: pip install 'mgpu-edu[cpu] @ git+https://github.com/OWNER/NAME'"
    )
