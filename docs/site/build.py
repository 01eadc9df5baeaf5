"""Build the course website into build/site/html: ``make site`` (``python docs/site/build.py``).

The website is the course as it is stored: the README as the landing page, every lesson of
lessons/course.toml (in its order, as the table of contents) with its stored outputs, figures and
widgets, the instructors' guide and the other guides, and a credits page for each source tutorial
(docs/site/sources.toml). Nothing is executed and nothing is downloaded: Sphinx with myst-nb and
sphinx-book-theme, all from PyPI, and the widget manager and MathJax vendored from npm
(docs/site/vendor_js.py).

The pages are staged into build/site-src first, keeping the repository's paths, so a link that
works on GitHub works on the site. Staging changes only what a website needs: links to files that
are not pages point at the file on GitHub (at the course's ref), the Colab and Binder badge images
are local copies, and each exercise's solution cell is folded away (it opens with a click). Then
Sphinx builds with warnings as errors.
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

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from mgpu_edu import course  # noqa: E402 - this checkout's package
from mgpu_edu.preprocessors import is_grade, is_solution  # noqa: E402

# Pages besides the lessons (repository paths), listed in this order under their own caption
GUIDES = ["docs/instructors.md", "docs/gpu-runs.md", "CONTRIBUTING.md", "docs/style.md", "benchmarks/results.md",
          "benchmarks/results-binder.md"]
BADGES = {"https://colab.research.google.com/assets/colab-badge.svg": "badges/colab.svg",
          "https://mybinder.org/badge_logo.svg": "badges/binder.svg"}
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
WIDGET_VIEW, WIDGET_STATE = "application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json"
STILL_WIDGET = """```{note}
A still copy: this widget shows the state the lesson was saved in, and doesn't respond on this page.
Open the lesson in Colab or Binder (the buttons at the top) to use it.
```"""


def rewrite(text: str, page: str, staged: set[str], repo: str, ref: str) -> str:
    """Markdown text of the staged page ``page`` (a repository path) with its links fixed for the site:
    badge images made local, links to repository files that are not pages sent to GitHub."""
    here = posixpath.dirname(page)

    def fix(match: re.Match) -> str:
        opening, target, closing = match.groups()
        if target in BADGES:
            return opening + posixpath.relpath(BADGES[target], here or ".") + closing
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(here, path))
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


def credits_page(source: dict, lists: dict[course.Lesson, list[str]]) -> str:
    lessons = lessons_citing(lists, source["cite"])
    if not lessons:
        raise ValueError(f"no lesson's Sources list cites {source['cite']!r} "
                         f"(docs/site/sources.toml, {source['slug']}): fix the cite or the lessons.")
    listed = "\n".join(f"- [{lesson.number} · {lesson.title}](../lessons/{lesson.file})" for lesson in lessons)
    return (f"# {source['name']}\n\nOne of the five tutorials this course teaches from. What it covers:\n\n"
            f"{source['about'].strip()}\n\n## Where the course teaches it\n\n{listed}\n\n"
            "The course doesn't copy its text or code: each lesson teaches the same ideas in its own words, with "
            "today's TensorFlow and Keras 3 APIs, and says where the tutorial's APIs have moved or its code is "
            "wrong.\n")


def toctree(caption: str, entries: list[str]) -> str:
    return "\n".join(["", "```{toctree}", ":hidden:", f":caption: {caption}", "", *entries, "```", ""])


def stage(target: Path) -> course.Course:
    """Copy and generate every page into ``target``; return the course."""
    known = course.load(ROOT / "lessons")
    sources = tomllib.loads((HERE / "sources.toml").read_text(encoding="utf-8"))["source"]
    shutil.rmtree(target, ignore_errors=True)
    (target / "lessons").mkdir(parents=True)
    shutil.copytree(HERE / "badges", target / "badges")
    lesson_pages = [f"lessons/{lesson.file}" for lesson in known.lessons]
    staged = {"index.md", *lesson_pages, *GUIDES, *BADGES.values(), *(f"credits/{s['slug']}.md" for s in sources)}
    for page in lesson_pages:
        nb = nbformat.read(ROOT / page, as_version=4)
        saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        cells = []
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = rewrite(cell.source, page, staged, known.repo, known.ref)
            elif is_solution(cell) or is_grade(cell):  # folded: the answer and its check open with a click
                cell.metadata.setdefault("tags", []).append("hide-cell")
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
    for page in GUIDES:
        (target / page).parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / page).read_text(encoding="utf-8")
        (target / page).write_text(rewrite(text, page, staged, known.repo, known.ref), encoding="utf-8")
    (target / "credits").mkdir()
    lists = sources_lists(known)
    for source in sources:
        (target / "credits" / f"{source['slug']}.md").write_text(credits_page(source, lists), encoding="utf-8")
    landing = rewrite((ROOT / "README.md").read_text(encoding="utf-8"), "README.md", staged, known.repo, known.ref)
    landing += toctree("Lessons", [page.removesuffix(".ipynb") for page in lesson_pages])
    landing += toctree("For instructors and contributors", [page.removesuffix(".md") for page in GUIDES])
    landing += toctree("Sources", [f"credits/{s['slug']}" for s in sources])
    (target / "index.md").write_text(landing, encoding="utf-8")
    return known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="default build/site")
    args = parser.parse_args()
    start = time.perf_counter()
    source = args.out.parent / f"{args.out.name}-src"
    known = stage(source)
    env = {**os.environ, "MGPU_EDU_SITE_REPO": known.repo, "MGPU_EDU_SITE_REF": known.ref}
    html = args.out / "html"
    shutil.rmtree(html, ignore_errors=True)
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-c", str(HERE),
               "-d", str(args.out / "doctrees"), str(source), str(html)]
    result = subprocess.run(command, env=env, cwd=ROOT)
    if result.returncode:
        return result.returncode
    pages = sorted(html.rglob("*.html"))
    print(f"built {len(pages)} pages into {html.relative_to(ROOT) if html.is_relative_to(ROOT) else html} "
          f"in {time.perf_counter() - start:.1f} s; open {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
