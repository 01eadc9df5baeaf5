"""The course configuration, the lessons and the README agree with each other."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from mgpu_edu import course

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
KERNEL_WITHOUT_TENSORFLOW = {"08_multi_worker.ipynb"}


def test_every_lesson_file_is_listed_and_named_nn_topic():
    on_disk = sorted(p.name for p in LESSONS.glob("*.ipynb"))
    assert on_disk == [file for file, _ in course.LESSONS]
    for file in on_disk:
        assert re.fullmatch(r"0[0-8]_[a-z0-9_]+\.ipynb", file), file


@pytest.mark.parametrize(("file", "title"), course.LESSONS)
def test_lesson_spine(file, title):
    nb = nbformat.read(LESSONS / file, as_version=4)
    roles = {cell.metadata.get(course.CELL_ROLE): cell for cell in nb.cells}
    # title first, then badges from the one configured slug, then the guarded install cell
    assert nb.cells[0].source.startswith(f"# {file[:2]} · ")
    assert roles["badges"].source == course.badge_row(file)
    install = roles["colab-install"]
    assert install.source == course.install_cell()
    first_code = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert first_code is install
    headings = [line for cell in nb.cells if cell.cell_type == "markdown"
                for line in cell.source.splitlines() if line.startswith("## ")]
    for needed in ("## Overview", "## Setup", "## Exercises", "## Summary", "## What's next"):
        assert any(h.startswith(needed) for h in headings), (file, needed)
    # the first TF-touching call is setup_devices, and its banner output is checked; a lesson
    # whose kernel never runs TensorFlow (08 only starts worker processes) says so instead
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    if file in KERNEL_WITHOUT_TENSORFLOW:
        assert not any(re.search(r"^\s*(import tensorflow|from tensorflow)", c.source, re.M) for c in code_cells)
        assert "setup_devices(" not in "".join(c.source for c in code_cells)
    else:
        setup = next(cell for cell in code_cells if "setup_devices(" in cell.source)
        assert "NBVAL_CHECK_OUTPUT" in setup.source
    counts = [cell.execution_count for cell in nb.cells if cell.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{file} is not freshly executed; run make lessons"


def test_readme_table_matches_configuration():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert course.lesson_table() in readme


def test_configure_is_idempotent_and_repoints(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    for file, _ in course.LESSONS:
        (lessons / file).write_bytes((LESSONS / file).read_bytes())
    assert course.configure(lessons) == []  # already pointing at REPO@REF
    changed = course.configure(lessons, repo="my-school/gpu-course", ref="spring-2027")
    assert len(changed) == len(course.LESSONS)
    nb = nbformat.read(changed[0], as_version=4)
    text = "".join(cell.source for cell in nb.cells)
    assert "my-school/gpu-course@spring-2027" in text
    assert "github/my-school/gpu-course/blob/spring-2027/lessons/" in text
    assert course.configure(lessons, repo="my-school/gpu-course", ref="spring-2027") == []


@pytest.mark.parametrize("slug", ["", "noslash", "a/b/c", "-bad/name", "owner/", "owner name/x", None])
def test_bad_slug_is_explained(slug):
    with pytest.raises(ValueError, match="OWNER/NAME"):
        course.check_slug(slug)


def test_good_slug_passes():
    assert course.check_slug("my-school/mgpu_edu.v2") == "my-school/mgpu_edu.v2"


def test_binder_files():
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    requirements = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    assert "." in requirements
    assert any(r.startswith("tensorflow-cpu") for r in requirements)
    assert not any(re.match(r"tensorflow(\[|[<>=]|$)", r) for r in requirements)
    assert re.fullmatch(r"python-3\.1[0-3]\s*", (ROOT / "binder" / "runtime.txt").read_text())


def test_the_wheel_ships_the_lessons_and_worker_scripts_and_nothing_else(tmp_path):
    import shutil
    import subprocess
    import sys
    import zipfile

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "tensorflow" not in " ".join(config["project"]["dependencies"])
    # a copy of the project, with what runs and editors leave in lessons/
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "hatch_build.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("mgpu_edu", "lessons", "examples"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "_scratch"))
    (source / "lessons" / "_scratch").mkdir()
    (source / "lessons" / "_scratch" / "events.log").write_text("a run's output")
    (source / "lessons" / ".ipynb_checkpoints").mkdir()
    (source / "lessons" / ".ipynb_checkpoints" / "00_devices-checkpoint.ipynb").write_text("{}")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("mgpu_edu-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in names if not n.endswith(".py") or "/examples/" in n)
    shipped = [n for n in shipped if ".dist-info/" not in n]
    assert shipped == sorted([f"mgpu_edu/lessons/{file}" for file, _ in course.LESSONS]
                             + ["mgpu_edu/examples/multi_worker_train.py", "mgpu_edu/examples/parameter_server.py"])
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mgpu-edu = mgpu_edu.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def _guide_times(text: str) -> tuple[dict[str, str], dict[str, str], str | None]:
    """The CPU times a course guide quotes: in its table, in each lesson's section, and the course total."""
    table = dict(re.findall(r"^\| (0\d) \|[^|]+\|[^|]+\| ([\d.]+) s \|", text, flags=re.M))
    sections = dict(re.findall(r"^### (0\d) · .*?CPU \(measured\) ([\d.]+) s", text, flags=re.M | re.S))
    total = re.search(r"^\| \| \*\*whole course\*\* \|[^|]+\| \*\*([\d.]+) s\*\* \|", text, flags=re.M)
    return table, sections, total and total.group(1)


def test_instructors_guide_quotes_the_measured_times():
    """docs/instructors.md's CPU times are the latest budget run's (benchmarks/results.json)."""
    import json

    measured = {row["lesson"][:2]: row["seconds"] for row in
                json.loads((ROOT / "benchmarks" / "results.json").read_text())["lessons"]}
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    table, sections, total = _guide_times(guide)
    expected = {k: f"{v:.1f}" for k, v in measured.items()}
    assert table == expected
    assert sections == expected
    assert total == f"{sum(measured.values()):.1f}"
    assert {f"0{i}" for i in range(9)} == set(measured)


def test_budget_script_rewrites_every_time_in_the_guide(tmp_path):
    """budgets.py --readme puts each lesson's time, and the course total, into a copy of the guide."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("budgets", ROOT / "benchmarks" / "budgets.py")
    budgets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(budgets)
    guide = tmp_path / "instructors.md"
    shutil.copy(ROOT / "docs" / "instructors.md", guide)
    rows = [{"lesson": f"0{i}_lesson.ipynb", "seconds": 1.0 + i / 10} for i in range(9)]
    budgets.refresh_guide(rows, guide)
    expected = {row["lesson"][:2]: f"{row['seconds']:.1f}" for row in rows}
    assert _guide_times(guide.read_text(encoding="utf-8")) == (expected, expected, "12.6")


def _package_namespace() -> dict:
    """Every mgpu_edu module by its short name, and every public name they define (for lesson expressions)."""
    import importlib
    import pkgutil

    import mgpu_edu

    namespace = {"mgpu_edu": mgpu_edu}
    for info in pkgutil.iter_modules(mgpu_edu.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"mgpu_edu.{info.name}")
        namespace[info.name] = module
        namespace.update({k: v for k, v in vars(module).items() if not k.startswith("_") and callable(v)})
    return namespace


def _show_source_outputs():
    for file, _ in course.LESSONS:
        nb = nbformat.read(LESSONS / file, as_version=4)
        for cell in nb.cells:
            match = cell.cell_type == "code" and re.search(r"show_source\((.+)\)\s*$", cell.source, flags=re.M)
            if match:
                yield file, match.group(1), cell


@pytest.mark.parametrize(("file", "expression", "cell"), list(_show_source_outputs()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_stored_show_source_outputs_match_the_code(file, expression, cell):
    """A lesson that walks through package code shows the code as it is now (run make lessons after an edit)."""
    from mgpu_edu import show_source

    stored = [o for o in cell.outputs if o.get("output_type") == "execute_result"]
    assert stored, f"{file}: show_source({expression}) has no stored output; run make lessons"
    current = repr(show_source(eval(expression, _package_namespace())))
    # Jupyter stores a text result without its final newline
    assert stored[0]["data"]["text/plain"] == current.rstrip("\n"), \
        f"{file}: show_source({expression}) is stale; run make lessons"
