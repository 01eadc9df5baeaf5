"""The course website (`make site`, docs/site/build.py).

It builds from the lessons as stored, without executing them, with warnings as errors and (like
every test here) with the network blocked; every internal link and anchor resolves; in headless
Chromium the landing page and every lesson page show their title, their figures (loaded, non-zero
size) and their widgets rendered from saved state, with no console error, no request leaving the
site and no raw widget JSON; the theme's search finds lessons; the vendored JavaScript is what
docs/site/_static/vendor/SOURCES.md says it is. A screenshot of lesson 05 (its explorer) is saved under build/.
"""

from __future__ import annotations

import functools
import hashlib
import html.parser
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import nbformat
import pytest

from mgpu_edu import course
from mgpu_edu.preprocessors import is_grade, is_solution

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "docs" / "site"
COURSE = course.load(ROOT / "lessons")
CHROMIUM = os.environ.get("MGPU_EDU_CHROMIUM", "/usr/bin/chromium")
VIEW = "application/vnd.jupyter.widget-view+json"


@functools.cache
def _builder():
    spec = importlib.util.spec_from_file_location("site_build", SITE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site() -> Path:
    out = ROOT / "build" / "site-test"
    done = subprocess.run([sys.executable, str(SITE / "build.py"), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "html"


class _Page(html.parser.HTMLParser):
    """The ids a page defines and the local URLs it refers to."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"])
        for name in ("href", "src"):
            value = found.get(name)
            if value and not re.match(r"[a-z][a-z0-9+.-]*:|//", value):
                self.refs.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_the_site_has_a_page_per_lesson_guide_and_source_and_the_manifest_is_its_table_of_contents(site):
    sources = _builder().tomllib.loads((SITE / "sources.toml").read_text())["source"]
    expected = ["index.html", *(f"lessons/{lesson.file[:-6]}.html" for lesson in COURSE.lessons),
                *(f"{page[:-3]}.html" for page in _builder().GUIDES), *(f"credits/{s['slug']}.html" for s in sources)]
    assert all((site / page).is_file() for page in expected), [p for p in expected if not (site / p).is_file()]
    landing = (site / "index.html").read_text(encoding="utf-8")
    order = [landing.index(f'href="lessons/{lesson.file[:-6]}.html"') for lesson in COURSE.lessons]
    assert order == sorted(order)  # the sidebar lists the lessons in the manifest's order
    lists = _builder().sources_lists(COURSE)
    for source in sources:  # each credits page lists, and links to, the lessons that cite it
        text = (site / "credits" / f"{source['slug']}.html").read_text(encoding="utf-8")
        cited = _builder().lessons_citing(lists, source["cite"])
        assert cited and all(f'href="../lessons/{lesson.file[:-6]}.html"' in text for lesson in cited)


def test_every_internal_link_and_anchor_resolves(site):
    pages = {path: _parse(path) for path in site.rglob("*.html") if "_static" not in path.relative_to(site).parts}
    broken = []
    for path, page in pages.items():
        for ref in page.refs:
            target, _, anchor = urllib.parse.unquote(ref).partition("#")
            resolved = (path.parent / target.split("?")[0]).resolve() if target else path
            if not resolved.exists():
                broken.append(f"{path.relative_to(site)}: {ref} (no such file)")
            elif anchor and resolved in pages and anchor not in pages[resolved].ids:
                broken.append(f"{path.relative_to(site)}: {ref} (no such anchor)")
    assert broken == []


def test_links_to_files_that_are_not_pages_go_to_github_and_badges_are_local():
    build = _builder()
    staged = {"lessons/00_devices.ipynb", "docs/instructors.md", "index.md"}
    text = ("[a](lessons/00_devices.ipynb) [b](lessons/course.toml#L3) [c](https://example.org/x) "
            "[d](#setup) ![e](https://mybinder.org/badge_logo.svg) [f](examples)")
    fixed = build.rewrite(text, "README.md", staged, "me/course", "v1.2.3")
    assert fixed == ("[a](lessons/00_devices.ipynb) "
                     "[b](https://github.com/me/course/blob/v1.2.3/lessons/course.toml#L3) "
                     "[c](https://example.org/x) [d](#setup) ![e](badges/binder.svg) "
                     "[f](https://github.com/me/course/tree/v1.2.3/examples)")
    assert build.rewrite("[g](../mgpu_edu/check.py)", "docs/instructors.md", staged, "me/course", "main") == \
        "[g](https://github.com/me/course/blob/main/mgpu_edu/check.py)"
    assert build.rewrite("![h](https://colab.research.google.com/assets/colab-badge.svg)", "lessons/00_devices.ipynb",
                         staged, "me/course", "main") == "![h](../badges/colab.svg)"


def test_solutions_are_folded_and_still_widgets_are_labelled(site):
    for lesson in COURSE.lessons:
        text = (site / "lessons" / f"{lesson.file[:-6]}.html").read_text(encoding="utf-8")
        nb = nbformat.read(COURSE.folder / lesson.file, as_version=4)
        exercise_cells = sum(is_solution(c) or is_grade(c) for c in nb.cells)  # each answer and its check
        assert text.count("tag_hide-cell") == exercise_cells >= 4
        views = sum(VIEW in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert text.count("A still copy: this widget shows the state") == views


def test_the_vendored_javascript_is_what_its_sources_file_lists():
    listed = re.findall(r"\| `([^`]+)` \| [\d,]+ \| `([0-9a-f]{64})` \|",
                        (SITE / "_static" / "vendor" / "SOURCES.md").read_text(encoding="utf-8"))
    vendor = SITE / "_static" / "vendor"
    present = sorted(str(p.relative_to(vendor)) for p in vendor.rglob("*") if p.is_file()
                     and p.name not in ("SOURCES.md", "LICENSE"))
    assert sorted(name for name, _ in listed if not name.endswith("LICENSE")) == present
    assert all(hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest for name, digest in listed)
    assert (vendor / "html-manager" / "LICENSE").is_file() and (vendor / "mathjax" / "LICENSE").is_file()


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: sudo apt-get install chromium (`make test` installs it).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


def _open(browser, url: str, base: str):
    """A new page at url; returns it and the console errors and outside requests it made."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
               else (outside.append(route.request.url), route.abort()))
    page.goto(url, wait_until="load")
    page.wait_for_function("() => [...document.images].every(img => img.complete)", timeout=30_000)
    return page, errors, outside


def test_every_page_shows_its_title_figures_and_widgets_offline_in_chromium(browser, served):
    stored_title = re.compile(r"^# (.+)$", re.M)
    pages = [("index.html", stored_title.search((ROOT / "README.md").read_text()).group(1), 0, 0)]
    for lesson in COURSE.lessons:
        nb = nbformat.read(COURSE.folder / lesson.file, as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        pages.append((f"lessons/{lesson.file[:-6]}.html", f"{lesson.number} · {lesson.title}",
                      sum("image/png" in o.get("data", {}) for o in outputs),
                      sum(VIEW in o.get("data", {}) for o in outputs)))
    problems = []
    for path, title, figures, widgets in pages:
        page, errors, outside = _open(browser, f"{served}/{path}", served)
        if widgets:
            page.wait_for_function("n => document.querySelectorAll('.cell_output .jupyter-widgets').length >= n",
                                   arg=widgets, timeout=30_000)
        heading = page.inner_text("main h1").strip().rstrip("#").strip()
        heading = heading.replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')  # Sphinx's smart quotes
        sizes = page.eval_on_selector_all("main img", "images => images.map(i => [i.naturalWidth, i.naturalHeight])")
        text = page.inner_text("body")
        if heading != title:
            problems.append(f"{path}: heading {heading!r}, not {title!r}")
        if len([s for s in sizes if s[0] > 0 and s[1] > 0]) < figures or any(0 in s for s in sizes):
            problems.append(f"{path}: images {sizes}, {figures} stored figures")
        for raw in ("model_id", VIEW, "Error rendering widget", "Loading widget"):
            if raw in text:
                problems.append(f"{path}: shows {raw!r}")
        if errors or outside:
            problems.append(f"{path}: console errors {errors[:3]}, outside requests {outside[:3]}")
        cut = page.eval_on_selector_all("main pre", "blocks => blocks.filter(b => b.scrollWidth > b.clientWidth + 1)"
                                                    ".length")
        if cut:
            problems.append(f"{path}: {cut} code block(s) cut off at 1280 pixels")
        if path.startswith("lessons/05"):
            page.locator(".cell_output .jupyter-widgets").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ROOT / "build" / "site-lesson-05.png"))
        page.close()
    assert problems == []
    assert (ROOT / "build" / "site-lesson-05.png").stat().st_size > 10_000


def test_search_finds_the_lessons(browser, served):
    page, errors, outside = _open(browser, f"{served}/search.html?q=MirroredStrategy", served)
    page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    found = page.eval_on_selector_all("#search-results ul.search li a",
                                      "links => links.map(a => a.getAttribute('href'))")
    page.close()
    assert sum(link.startswith("lessons/") for link in found) >= 3, found
    assert errors == [] and outside == []
