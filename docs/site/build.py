"""Build the course website into build/site/html: ``make site`` (``python docs/site/build.py``).

The website is the course as it is stored: the README as the landing page, every lesson of
lessons/course.toml (in its order, as the table of contents) with its stored outputs, figures and
widgets, the guides, and a credits page for each source tutorial (docs/site/sources.toml). Nothing
is executed and nothing is downloaded: Sphinx with myst-nb and sphinx-book-theme, all from PyPI,
and the widget manager and MathJax vendored from npm (docs/site/vendor_js.py).

It comes in two editions, and every page says which one it is:

- the **learner edition** (the default, what GitHub Pages publishes): each lesson page is the
  student version, at ``student/`` as in the repository (exercises stubbed, checks without their
  hidden asserts, no output under an exercise or its check), with the stored outputs of every
  other cell; its Colab and Binder buttons open the student version. The instructors' guide,
  which holds every answer, is left out.
- the **instructor edition** (``--edition instructor``, into build/site-instructor): the lessons
  as stored at ``lessons/``, each exercise's solution and check folded away (they open with a
  click), and the instructors' guide. For the teaching team, not for students.

The pages are staged into build/site-src (build/site-instructor-src) first, keeping the
repository's paths, so a link that works on GitHub works on the site. Staging changes only what
a website needs: links to files that are not pages point at the file on GitHub (at the course's
ref), and the Colab and Binder badge images are local copies. Then Sphinx builds with warnings as
errors.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from mgpu_edu import course  # noqa: E402 - this checkout's package
from mgpu_edu.course.assignments import student_version  # noqa: E402
from mgpu_edu.course.preprocessors import is_grade, is_solution  # noqa: E402

# Pages besides the lessons: the guide (every exercise's answer) and the maintainers' pages, in the instructor
# edition only; the learner edition is the lessons, the README's learner part and the sources' credits.
GUIDES = ["docs/instructors.md", "CONTRIBUTING.md", "docs/style.md", "docs/gpu-runs.md", "benchmarks/results.md"]
SKIP = ("<!-- learner-site:skip:start -->", "<!-- learner-site:skip:end -->")  # README parts not for learners
EDITIONS = {
    "learner": {"folder": course.STUDENT, "guides": [], "caption": "",
                "banner": "Learner edition: the exercises are yours to solve; no solutions here. "
                          "The buttons open them in Colab or on Binder."},
    "instructor": {"folder": "lessons", "guides": GUIDES, "caption": "For instructors and contributors",
                   "banner": "Instructor edition: every solution (folded) and the instructors' guide with its "
                             "answers. For the teaching team: publish the learner edition to students."},
}
BADGES = {"https://colab.research.google.com/assets/colab-badge.svg": "badges/colab.svg",
          "https://mybinder.org/badge_logo.svg": "badges/binder.svg"}
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
WIDGET_VIEW, WIDGET_STATE = "application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json"
STILL_WIDGET = """```{note}
A still copy: this widget shows the state the lesson was saved in, and doesn't respond on this page.
Open the lesson in Colab or Binder (the buttons at the top) to use it.
```"""


def rewrite(text: str, page: str, staged: set[str], repo: str, ref: str, aliases: dict[str, str] | None = None) -> str:
    """Markdown text of the staged page ``page`` (a repository path) with its links fixed for the site:
    badge images made local, links to a file that ``aliases`` maps to a page sent to that page, links to
    repository files that are not pages sent to GitHub."""
    here = posixpath.dirname(page)
    aliases = aliases or {}

    def fix(match: re.Match) -> str:
        opening, target, closing = match.groups()
        if target in BADGES:
            return opening + posixpath.relpath(BADGES[target], here or ".") + closing
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(here, path))
        if resolved in aliases:
            moved = posixpath.relpath(aliases[resolved], here or ".")
            return f"{opening}{moved}{'#' + anchor if anchor else ''}{closing}"
        if resolved in staged or not (ROOT / resolved).exists():
            return match.group(0)  # a page (Sphinx resolves it), or missing (Sphinx fails the build)
        kind = "tree" if (ROOT / resolved).is_dir() else "blob"
        return f"{opening}https://github.com/{repo}/{kind}/{ref}/{resolved}{'#' + anchor if anchor else ''}{closing}"

    return LINK.sub(fix, text)


def sources_lists(known: course.Course) -> dict[course.Lesson, list[str]]:
    """Each lesson's "Sources" list: the items of the markdown cell that holds its "## Sources" heading."""
    lists = {}
    for lesson in known.lessons:
        nb = nbformat.read(known.folder / lesson.file, as_version=4)
        cell = next((c.source for c in nb.cells if c.cell_type == "markdown" and "## Sources" in c.source), "")
        lists[lesson] = [line[2:].strip() for line in cell.split("## Sources", 1)[-1].splitlines()
                         if line.startswith("- ")]
    return lists


def lessons_citing(lists: dict[course.Lesson, list[str]], cite: str) -> list[course.Lesson]:
    """The lessons whose "Sources" list (from sources_lists) has an item that begins with ``cite``."""
    return [lesson for lesson, items in lists.items() if any(item.lower().startswith(cite.lower()) for item in items)]


def credits_page(source: dict, lists: dict[course.Lesson, list[str]], folder: str = "lessons") -> str:
    lessons = lessons_citing(lists, source["cite"])
    if not lessons:
        raise ValueError(f"no lesson's Sources list cites {source['cite']!r} "
                         f"(docs/site/sources.toml, {source['slug']}): fix the cite or the lessons.")
    listed = "\n".join(f"- [{lesson.number} · {lesson.title}](../{folder}/{lesson.file})" for lesson in lessons)
    return (f"# {source['name']}\n\nOne of the five tutorials this course teaches from. What it covers:\n\n"
            f"{source['about'].strip()}\n\n## Where the course teaches it\n\n{listed}\n\n"
            "The course doesn't copy its text or code: each lesson teaches the same ideas in its own words, with "
            "today's TensorFlow and Keras 3 APIs, and says where the tutorial's APIs have moved or its code is "
            "wrong.\n")


def toctree(caption: str, entries: list[str]) -> str:
    return "\n".join(["", "```{toctree}", ":hidden:", f":caption: {caption}", "", *entries, "```", ""])


def learner_notebook(nb, file: str, repo: str, ref: str, gpu: bool = True):
    """A lesson's page in the learner edition: its student version (solutions stubbed, checks without their
    hidden asserts, badges and Colab cell opening ``student/``), with the lesson's stored outputs and saved
    widget state, except under an exercise's answer cell and its check, which show none."""
    student = student_version(nb, name=file)
    course.configure_notebook(student, file, repo, ref, course.STUDENT, gpu=gpu)
    if [c.get("id") for c in student.cells] != [c.get("id") for c in nb.cells]:
        raise ValueError(f"{file}: its student version's cells don't match the lesson's one for one")
    for page_cell, stored in zip(student.cells, nb.cells, strict=True):
        if stored.cell_type == "code" and not (is_solution(stored) or is_grade(stored)):
            page_cell.outputs, page_cell.execution_count = stored.outputs, stored.execution_count
    if "widgets" in nb.metadata:
        student.metadata["widgets"] = nb.metadata["widgets"]
    return student


def stage(target: Path, edition: str = "learner") -> course.Course:
    """Copy and generate every page of an edition ("learner" or "instructor") into ``target``; return the course."""
    known = course.load(ROOT / "lessons")
    sources = tomllib.loads((HERE / "sources.toml").read_text(encoding="utf-8"))["source"]
    folder, guides = EDITIONS[edition]["folder"], EDITIONS[edition]["guides"]
    shutil.rmtree(target, ignore_errors=True)
    (target / folder).mkdir(parents=True)
    shutil.copytree(HERE / "badges", target / "badges")
    lesson_pages = [f"{folder}/{lesson.file}" for lesson in known.lessons]
    staged = {"index.md", *lesson_pages, *guides, *BADGES.values(), *(f"credits/{s['slug']}.md" for s in sources)}
    for lesson, page in zip(known.lessons, lesson_pages, strict=True):
        nb = nbformat.read(known.folder / lesson.file, as_version=4)
        if edition == "learner":
            nb = learner_notebook(nb, lesson.file, known.repo, known.ref, gpu=lesson.tensorflow)
        saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        cells = []
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = rewrite(cell.source, page, staged, known.repo, known.ref)
            elif edition == "instructor" and (is_solution(cell) or is_grade(cell)):
                cell.metadata.setdefault("tags", []).append("hide-cell")  # folded: opens with a click
            views = [o["data"][WIDGET_VIEW]["model_id"] for o in cell.get("outputs", [])
                     if WIDGET_VIEW in o.get("data", {})]
            if views:
                missing = [model for model in views if model not in saved]
                if missing:  # the page would show the widget's raw JSON
                    raise ValueError(f"{page}: a widget output has no saved state (model {missing[0]}); run the "
                                     "lesson again with `make lessons`, which saves it.")
                cells.append(nbformat.v4.new_markdown_cell(STILL_WIDGET))
            cells.append(cell)
        nb.cells = cells
        nbformat.write(nb, target / page)
    for page in guides:
        (target / page).parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / page).read_text(encoding="utf-8")
        (target / page).write_text(rewrite(text, page, staged, known.repo, known.ref), encoding="utf-8")
    (target / "credits").mkdir()
    lists = sources_lists(known)
    for source in sources:
        (target / "credits" / f"{source['slug']}.md").write_text(credits_page(source, lists, folder),
                                                                  encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    aliases = {}
    if edition == "learner":  # no way to the answers: the README's solved-lesson links and instructors' part go
        readme = re.sub(rf"{re.escape(SKIP[0])}.*?{re.escape(SKIP[1])}\n?", "", readme, flags=re.S)
        aliases = {f"lessons/{lesson.file}": page for lesson, page in zip(known.lessons, lesson_pages, strict=True)}
    landing = rewrite(readme, "README.md", staged, known.repo, known.ref, aliases)
    landing += toctree("Lessons", [page.removesuffix(".ipynb") for page in lesson_pages])
    if guides:
        landing += toctree(EDITIONS[edition]["caption"], [page.removesuffix(".md") for page in guides])
    landing += toctree("Sources", [f"credits/{s['slug']}" for s in sources])
    (target / "index.md").write_text(landing, encoding="utf-8")
    return known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edition", choices=list(EDITIONS), default="learner",
                        help="learner (default): exercises without solutions, what students get; instructor: "
                        "solutions folded and the instructors' guide")
    parser.add_argument("--out", type=Path, default=None,
                        help="default build/site (learner edition) or build/site-instructor")
    args = parser.parse_args()
    out = args.out or ROOT / "build" / ("site" if args.edition == "learner" else f"site-{args.edition}")
    start = time.perf_counter()
    source = out.parent / f"{out.name}-src"
    if args.edition == "learner":  # its buttons open student/: it must be what the lessons make now
        import tempfile

        from mgpu_edu.course.assignments import refresh_student_folder

        with tempfile.TemporaryDirectory() as scratch:
            shutil.copytree(ROOT / course.STUDENT, Path(scratch) / course.STUDENT)
            stale = refresh_student_folder(ROOT / "lessons", Path(scratch) / course.STUDENT)
        if stale:
            print(f"{course.STUDENT}/ is out of date with lessons/ ({stale[0].name}, ...), and the learner "
                  "edition's buttons open it: run `python -m mgpu_edu.course .` (make lessons runs it), commit, "
                  "then build again.", file=sys.stderr)
            return 1
    known = stage(source, args.edition)
    env = {**os.environ, "MGPU_EDU_SITE_REPO": known.repo, "MGPU_EDU_SITE_REF": known.ref,
           "MGPU_EDU_SITE_EDITION": args.edition, "MGPU_EDU_SITE_BANNER": EDITIONS[args.edition]["banner"]}
    html = out / "html"
    shutil.rmtree(html, ignore_errors=True)
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-c", str(HERE),
               "-d", str(out / "doctrees"), str(source), str(html)]
    result = subprocess.run(command, env=env, cwd=ROOT)
    if result.returncode:
        return result.returncode
    pages = sorted(html.rglob("*.html"))
    shown = html.relative_to(ROOT) if html.is_relative_to(ROOT) else html
    print(f"built the {args.edition} edition, {len(pages)} pages, into {shown} in {time.perf_counter() - start:.1f} s; "
          f"open {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
