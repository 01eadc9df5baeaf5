"""The course website (`make site`, docs/site/build.py), in both editions.

Each builds from the lessons as stored, without executing them, with warnings as errors and (like
every test here) with the network blocked; every internal link and anchor resolves; in headless
Chromium the landing page and every lesson page show their title, the banner naming their edition,
their figures (loaded, non-zero size) and their widgets rendered from saved state, with no console
error, no request leaving the site and no raw widget JSON; the theme's search finds lessons; the
vendored JavaScript is what docs/site/_static/vendor/SOURCES.md says it is. The learner edition
holds no solution line, no check's result and no answer from the guide in any of its files (the
same scan finds them all in the instructor edition), and its buttons open the student versions. A
screenshot of lesson 05 (its explorer) is saved under build/.
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
from mgpu_edu.course.preprocessors import is_grade, is_solution

pytestmark = pytest.mark.slow  # Sphinx builds and Chromium: make test runs them, make check doesn't

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


@pytest.fixture(scope="module", params=["learner", "instructor"])
def edition(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def site(edition) -> Path:
    out = ROOT / "build" / f"site-test-{edition}"
    done = subprocess.run([sys.executable, str(SITE / "build.py"), "--edition", edition, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "html"


def _folder(edition: str) -> str:
    return _builder().EDITIONS[edition]["folder"]


def _page_notebook(lesson: course.Lesson, edition: str):
    """The notebook a lesson's page is built from in this edition."""
    nb = nbformat.read(COURSE.folder / lesson.file, as_version=4)
    if edition == "learner":
        return _builder().learner_notebook(nb, lesson.file, COURSE.repo, COURSE.ref, lesson.tensorflow)
    return nb


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


def test_the_site_has_a_page_per_lesson_guide_and_source_and_the_manifest_is_its_table_of_contents(site, edition):
    build, folder = _builder(), _folder(edition)
    sources = build.tomllib.loads((SITE / "sources.toml").read_text())["source"]
    guides = build.EDITIONS[edition]["guides"]
    expected = ["index.html", *(f"{folder}/{lesson.file[:-6]}.html" for lesson in COURSE.lessons),
                *(f"{page[:-3]}.html" for page in guides), *(f"credits/{s['slug']}.html" for s in sources)]
    assert all((site / page).is_file() for page in expected), [p for p in expected if not (site / p).is_file()]
    assert (site / "docs" / "instructors.html").is_file() == (edition == "instructor")  # the guide holds the answers
    landing = (site / "index.html").read_text(encoding="utf-8")
    order = [landing.index(f'href="{folder}/{lesson.file[:-6]}.html"') for lesson in COURSE.lessons]
    assert order == sorted(order)  # the sidebar lists the lessons in the manifest's order
    lists = build.sources_lists(COURSE)
    for source in sources:  # each credits page lists, and links to, the lessons that cite it
        text = (site / "credits" / f"{source['slug']}.html").read_text(encoding="utf-8")
        cited = build.lessons_citing(lists, source["cite"])
        assert cited and all(f'href="../{folder}/{lesson.file[:-6]}.html"' in text for lesson in cited)


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
    assert build.rewrite("[g](../mgpu_edu/display/check.py)", "docs/instructors.md", staged, "me/course", "main") == \
        "[g](https://github.com/me/course/blob/main/mgpu_edu/display/check.py)"
    assert build.rewrite("![h](https://colab.research.google.com/assets/colab-badge.svg)", "lessons/00_devices.ipynb",
                         staged, "me/course", "main") == "![h](../badges/colab.svg)"


def test_solutions_are_folded_only_in_the_instructor_edition_and_still_widgets_are_labelled(site, edition):
    for lesson in COURSE.lessons:
        text = (site / _folder(edition) / f"{lesson.file[:-6]}.html").read_text(encoding="utf-8")
        nb = nbformat.read(COURSE.folder / lesson.file, as_version=4)
        exercise_cells = sum(is_solution(c) or is_grade(c) for c in nb.cells)  # each answer and its check
        assert exercise_cells >= 4
        assert text.count("tag_hide-cell") == (exercise_cells if edition == "instructor" else 0)
        assert text.count("Show this exercise cell") == (exercise_cells if edition == "instructor" else 0)
        views = sum(VIEW in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert text.count("A still copy: this widget shows the state") == views


class _Text(html.parser.HTMLParser):
    """A page's text as a reader sees it (highlighting splits code into many tags)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _site_text(site: Path) -> dict[str, str]:
    """Every file of a built site as text: an HTML page's text, any other text file as it is."""
    texts = {}
    for path in site.rglob("*"):
        if not path.is_file() or path.suffix in (".png", ".svg", ".woff", ".woff2", ".ico", ".ttf", ".eot"):
            continue
        raw = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".html":
            parser = _Text()
            parser.feed(raw)
            raw = "".join(parser.parts)
        texts[str(path.relative_to(site))] = raw
    return texts


def _answers() -> list[tuple[str, str]]:
    """What only the answers hold, each with the lesson whose pages must not show it ("" for every page):
    each solution's lines that the learner's page doesn't show anyway (its stub keeps a signature; a lesson
    may show the package's code an exercise rewrites), each exercise check's stored output, and each of the
    guide's "Answer: ..." lines. (A plain line such as ``start += size`` may well appear in another
    lesson's code: a lesson's solution lines are looked for in its own page and its source.)"""
    found = []
    for lesson in COURSE.lessons:
        nb = nbformat.read(COURSE.folder / lesson.file, as_version=4)
        page = _page_notebook(lesson, "learner")
        stub = "\n".join([c.source for c in page.cells] + [o.get("text", "") + o.get("data", {}).get("text/plain", "")
                                                            for c in page.cells if c.cell_type == "code"
                                                            for o in c.outputs])
        stem = lesson.file[:-6]
        for cell in nb.cells:
            if is_solution(cell):
                inside = False
                for line in cell.source.splitlines():
                    if "BEGIN SOLUTION" in line or "END SOLUTION" in line:
                        inside = "BEGIN" in line
                    elif inside and len(line.strip()) >= 8 and line.strip() not in stub:
                        found.append((stem, line.strip()))
            if is_grade(cell):
                found += [("", line.strip()) for o in cell.outputs for line in o.get("text", "").splitlines()
                          if len(line.strip()) >= 8]
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    found += [("", answer) for answer in re.findall(r"Answer:[^\n]*", guide)]
    return found


def test_the_learner_edition_holds_no_solution_check_result_or_guide_answer(site, edition):
    answers = _answers()
    assert len(answers) >= 3 * len(COURSE.lessons)
    texts = _site_text(site)

    def showing(stem: str, answer: str) -> list[str]:
        return [name for name, text in texts.items() if stem in name and answer in text]

    leaks = sorted({f"{name}: {answer[:80]!r}" for stem, answer in answers for name in showing(stem, answer)})
    landing = (site / "index.html").read_text(encoding="utf-8")
    links = _parse(site / "index.html").refs + re.findall(r'href="(https://[^"]+)"', landing)
    to_answers = [link for link in links if re.search(r"/lessons/\d\d_|instructors", link)]
    if edition == "learner":
        assert leaks == []
        assert to_answers == []  # the landing page doesn't lead to the solved lessons or the guide either
        assert all(f"student/{lesson.file[:-6]}.html" in links for lesson in COURSE.lessons)
    else:  # the same scan finds every answer in the instructor edition: it is not looking for nothing
        assert to_answers
        missing = [answer for stem, answer in answers if not showing(stem, answer)]
        assert missing == [], missing[:5]


def test_each_lesson_page_says_its_edition_and_its_buttons_open_that_edition(site, edition):
    banner = _builder().EDITIONS[edition]["banner"].split(":")[0]
    folder = _folder(edition)
    for path in [site / "index.html", *(site / folder / f"{lesson.file[:-6]}.html" for lesson in COURSE.lessons)]:
        assert banner in path.read_text(encoding="utf-8"), path
    for lesson in COURSE.lessons:
        text = (site / folder / f"{lesson.file[:-6]}.html").read_text(encoding="utf-8")
        opened = set(re.findall(r'href="https://(?:colab\.research\.google\.com/github/[^"]*?/blob/[^/"]+/|'
                                r'mybinder\.org/v2/gh/[^"]*?lab/tree/)([^"]+\.ipynb)"', text))
        # the theme's launch buttons and the lesson's own badges, all at this edition's folder
        assert opened == {f"{folder}/{lesson.file}"}, opened


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
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """Say nothing when the tab moved on to the next page while a file of the last one was still sent."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


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


class _Tab:
    """One browser tab that opens page after page, blocking every request outside ``base``; for the page it opened
    last it keeps the console errors and the blocked requests. (A new tab for each page made Chromium work about
    three times as hard.)"""

    def __init__(self, browser, base: str):
        self.base = base
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                        else (self.outside.append(route.request.url), route.abort()))

    def open(self, url: str):
        """Go to url, as a new tab would, with nothing stored by the last page, and wait until every image has
        loaded; returns the page."""
        if self.page.url.startswith(self.base):  # the theme keeps its choices (banner, colours) in the page's storage
            self.page.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
        self.errors.clear()
        self.outside.clear()
        self.page.goto(url, wait_until="load")
        self.page.wait_for_function("() => [...document.images].every(img => img.complete)", timeout=30_000)
        return self.page


def test_every_page_shows_its_title_figures_and_widgets_offline_in_chromium(browser, served, edition):
    stored_title = re.compile(r"^# (.+)$", re.M)
    pages = [("index.html", stored_title.search((ROOT / "README.md").read_text()).group(1), 0, 0)]
    banner = _builder().EDITIONS[edition]["banner"].split(":")[0]
    for lesson in COURSE.lessons:
        nb = _page_notebook(lesson, edition)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        pages.append((f"{_folder(edition)}/{lesson.file[:-6]}.html", f"{lesson.number} · {lesson.title}",
                      sum("image/png" in o.get("data", {}) for o in outputs),
                      sum(VIEW in o.get("data", {}) for o in outputs)))
    problems = []
    tab = _Tab(browser, served)
    for path, title, figures, widgets in pages:
        page = tab.open(f"{served}/{path}")
        if widgets:
            page.wait_for_function("n => document.querySelectorAll('.cell_output .jupyter-widgets').length >= n",
                                   arg=widgets, timeout=30_000)
        heading = page.inner_text("main h1").strip().rstrip("#").strip()
        heading = heading.replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')  # Sphinx's smart quotes
        sizes = page.eval_on_selector_all("main img", "images => images.map(i => [i.naturalWidth, i.naturalHeight])")
        text = page.inner_text("body")
        if heading != title:
            problems.append(f"{path}: heading {heading!r}, not {title!r}")
        if not page.locator(".bd-header-announcement", has_text=banner).is_visible():
            problems.append(f"{path}: no visible banner saying {banner!r}")
        if len([s for s in sizes if s[0] > 0 and s[1] > 0]) < figures or any(0 in s for s in sizes):
            problems.append(f"{path}: images {sizes}, {figures} stored figures")
        for raw in ("model_id", VIEW, "Error rendering widget", "Loading widget"):
            if raw in text:
                problems.append(f"{path}: shows {raw!r}")
        if tab.errors or tab.outside:
            problems.append(f"{path}: console errors {tab.errors[:3]}, outside requests {tab.outside[:3]}")
        cut = page.eval_on_selector_all("main pre", "blocks => blocks.filter(b => b.scrollWidth > b.clientWidth + 1)"
                                                    ".length")
        if cut:
            problems.append(f"{path}: {cut} code block(s) cut off at 1280 pixels")
        if path.startswith(f"{_folder(edition)}/05") and edition == "learner":
            page.locator(".cell_output .jupyter-widgets").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ROOT / "build" / "site-lesson-05.png"))
    tab.page.close()
    assert problems == []
    assert (ROOT / "build" / "site-lesson-05.png").stat().st_size > 10_000


def test_search_finds_the_lessons(browser, served, edition):
    tab = _Tab(browser, served)
    page = tab.open(f"{served}/search.html?q=MirroredStrategy")
    page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    found = page.eval_on_selector_all("#search-results ul.search li a",
                                      "links => links.map(a => a.getAttribute('href'))")
    page.close()
    assert sum(link.startswith(f"{_folder(edition)}/") for link in found) >= 3, found
    assert tab.errors == [] and tab.outside == []
