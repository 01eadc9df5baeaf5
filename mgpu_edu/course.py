"""The course's one configuration: which repository and release the lessons point at.

Every lesson's badge row (Open in Colab, Launch Binder) and its Colab install cell are
built here from ``REPO`` and ``REF``. ``python -m mgpu_edu.course`` rewrites them in
``lessons/`` (and the README's lesson table); a test checks they agree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: GitHub "owner/name" of the course repository. Change it here only.
REPO = "mgpu-edu/mgpu_edu"
#: Git tag or commit that Colab installs and the badges open. Tag each release vX.Y.Z.
REF = "v0.1.0"

#: (file, title) for every lesson, in order.
LESSONS: tuple[tuple[str, str], ...] = (
    ("00_devices.ipynb", "Devices: physical, logical, and how to split one"),
    ("01_placement.ipynb", "Placing work on devices"),
    ("02_data_parallel.ipynb", "Data parallelism by hand"),
    ("03_allreduce.ipynb", "AllReduce, step by step"),
    ("04_mirrored_fit.ipynb", "MirroredStrategy with Keras, and the replicas × batch explorer"),
    ("05_custom_loops.ipynb", "Custom training loops with a strategy"),
    ("06_model_parallel.ipynb", "Model, pipeline and tensor parallelism"),
    ("07_performance.ipynb", "Making it fast, and a model of scaling"),
    ("08_multi_worker.ipynb", "Beyond one machine: multi-worker and parameter servers"),
)

#: Cell metadata key that marks the cells this module writes.
CELL_ROLE = "mgpu_edu_role"

_SLUG = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


def check_slug(repo: str) -> str:
    """Return repo if it looks like GitHub's "owner/name", else raise ValueError saying why."""
    if not isinstance(repo, str) or not _SLUG.match(repo):
        raise ValueError(
            f"{repo!r} is not a GitHub repository slug. Write it as OWNER/NAME, for example "
            "'my-school/mgpu_edu' (letters, digits, '-', '.', '_')."
        )
    return repo


_REF = re.compile(r"^(?!.*\.\.)(?!/)(?!.*/$)[A-Za-z0-9._/+-]{1,200}$")


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


def colab_url(lesson: str, repo: str = REPO, ref: str = REF, folder: str = "lessons") -> str:
    """The address that opens a lesson in Colab."""
    return f"https://colab.research.google.com/github/{repo}/blob/{ref}/{folder}/{lesson}"


def binder_url(lesson: str, repo: str = REPO, ref: str = REF, folder: str = "lessons") -> str:
    """The address that opens a lesson in JupyterLab on mybinder.org."""
    return f"https://mybinder.org/v2/gh/{repo}/{ref}?urlpath=lab/tree/{folder}/{lesson}"


def badge_row(lesson: str, repo: str = REPO, ref: str = REF, folder: str = "lessons") -> str:
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


def install_cell(repo: str = REPO, ref: str = REF) -> str:
    """Source of the first code cell: installs mgpu_edu on Colab only, pinned to ref."""
    return (
        "# On Colab, install the course's helper package (pinned to one release).\n"
        "# Everywhere else this cell does nothing: your environment already has it.\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        f'    %pip install --quiet "mgpu-edu @ git+https://github.com/{repo}@{ref}"'
    )


def configure_notebook(nb, lesson: str, repo: str = REPO, ref: str = REF,  # noqa: ANN001
                       folder: str = "lessons") -> bool:
    """Rewrite a notebook's badge and install cells; return True if anything changed."""
    wanted = {"badges": badge_row(lesson, repo, ref, folder), "colab-install": install_cell(repo, ref)}
    changed = False
    for cell in nb.cells:
        role = cell.get("metadata", {}).get(CELL_ROLE)
        if role in wanted and cell.source != wanted[role]:
            cell.source = wanted[role]
            changed = True
    return changed


def lesson_table(repo: str = REPO, ref: str = REF) -> str:
    """The README's lesson table, with badges."""
    lines = ["| # | lesson | open |", "|---|---|---|"]
    for file, title in LESSONS:
        lines.append(f"| {file[:2]} | [{title}](lessons/{file}) | {badge_row(file, repo, ref)} |")
    return "\n".join(lines)


def configure(lessons_dir: Path, repo: str = REPO, ref: str = REF, readme: Path | None = None,
              folder: str = "lessons") -> list[Path]:
    """Point every lesson in lessons_dir (and the README's table) at repo@ref; return changed files.

    folder is where lessons_dir sits inside the repository, as the badges' links need it.
    Lessons missing from lessons_dir are skipped, so a folder of a few student copies works too.
    """
    import nbformat

    check_slug(repo)
    check_ref(ref)
    check_folder(folder)
    changed = []
    for file, _ in LESSONS:
        path = lessons_dir / file
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        if configure_notebook(nb, file, repo, ref, folder):
            nbformat.write(nb, path)
            changed.append(path)
    if readme is not None and readme.exists():
        text = readme.read_text(encoding="utf-8")
        new = re.sub(r"(<!-- lessons:start -->\n).*?(\n<!-- lessons:end -->)",
                     lambda m: m.group(1) + lesson_table(repo, ref) + m.group(2), text, flags=re.S)
        if new != text:
            readme.write_text(new, encoding="utf-8")
            changed.append(readme)
    return changed


def set_defaults(course_file: Path, repo: str, ref: str) -> bool:
    """Rewrite ``REPO`` and ``REF`` in a fork's copy of this file; return True if it changed.

    ``mgpu-edu badges`` calls it so that a fork's tests and ``make lessons`` agree with its badges.
    """
    check_slug(repo)
    check_ref(ref)
    text = course_file.read_text(encoding="utf-8")
    new = re.sub(r'^REPO = ".*"$', f'REPO = "{repo}"', text, count=1, flags=re.M)
    new = re.sub(r'^REF = ".*"$', f'REF = "{ref}"', new, count=1, flags=re.M)
    if new == text:
        return False
    course_file.write_text(new, encoding="utf-8")
    return True


def shipped_folder(name: str) -> Path:
    """The course folder ("lessons" or "examples") that ships with this installation of mgpu_edu.

    A wheel carries it inside the package; a source checkout (or an editable install) keeps it
    beside the package. Raises FileNotFoundError, saying how to get it, when neither exists.
    """
    package = Path(__file__).resolve().parent
    for candidate in (package / name, package.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"this installation of mgpu_edu ({package}) has no {name!r} folder. Reinstall it from the "
        "course repository: pip install 'mgpu-edu[cpu] @ git+https://github.com/"
        f"{REPO}@{REF}'"
    )


if __name__ == "__main__":  # python -m mgpu_edu.course: refresh badges from REPO and REF
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for path in configure(root / "lessons", readme=root / "README.md"):
        print(f"updated {path}")
