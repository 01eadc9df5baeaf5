"""What installs: the wheel ships the lessons, their manifest and the worker scripts; Binder's files."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from mgpu_edu import course, data

ROOT = Path(__file__).resolve().parents[1]


def test_binder_files():
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    requirements = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    assert ".[instructor]" in requirements  # the course, and what grading it in the same image needs
    assert any(r.startswith("tensorflow-cpu") for r in requirements)
    assert not any(re.match(r"tensorflow(\[|[<>=]|$)", r) for r in requirements)


@pytest.mark.light  # .ci/python-ok, a Python that imports nothing of ours
def test_the_supported_pythons_are_the_same_everywhere():
    """pyproject.toml's requires-python is the one range: mgpu-edu doctor accepts it, .ci/python-ok (which
    the Makefile runs before it makes .venv, and .ci/env-oldest asks for the oldest) reads it, ruff targets
    its oldest, CI's main job and the Binder-like and Colab-like environments use Pythons inside it, and the
    README names it."""
    from mgpu_edu.course import doctor

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (low, high) = doctor.SUPPORTED_PYTHON
    oldest, newest = f"{low[0]}.{low[1]}", f"{high[0]}.{high[1]}"
    assert config["project"]["requires-python"] == f">={oldest},<{high[0]}.{high[1] + 1}"
    assert config["tool"]["ruff"]["target-version"] == f"py{low[0]}{low[1]}"

    def python_ok(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / ".ci" / "python-ok"), *args], capture_output=True,
                              text=True, timeout=60)

    assert python_ok("--oldest").stdout.strip() == oldest
    assert python_ok().returncode == 0  # the Python running these tests
    for version in (oldest, newest):
        assert python_ok("--version", version).returncode == 0, version
    for version in (f"{low[0]}.{low[1] - 1}", f"{high[0]}.{high[1] + 1}"):
        refused = python_ok("--version", version)
        assert refused.returncode == 1 and f"Python {oldest} to {newest}" in refused.stderr, refused.stderr
        assert f"PYTHON=python{oldest}" in refused.stderr  # says what to type
    assert "OLDEST=$(.ci/python-ok --oldest)" in (ROOT / ".ci" / "env-oldest").read_text(encoding="utf-8")
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    assert re.search(r'target: test-main, python: "([\d.]+)"', ci)[1] == oldest  # so CI needs no test-oldest job
    assert "target: test-oldest" not in ci
    binder = re.fullmatch(r"python-(\d+)\.(\d+)\s*", (ROOT / "binder" / "runtime.txt").read_text(encoding="utf-8"))
    colab = re.search(r"\.ci/python (\d+)\.(\d+)", (ROOT / ".ci" / "env-colab").read_text(encoding="utf-8"))
    assert all(low <= (int(m[1]), int(m[2])) <= high for m in (binder, colab))
    assert f"Python {oldest}–{newest}" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_the_wheel_ships_the_lessons_manifest_worker_scripts_and_digits_and_nothing_else(tmp_path):
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
    assert shipped == sorted([f"mgpu_edu/lessons/{lesson.file}" for lesson in course.load(ROOT / "lessons").lessons]
                             + ["mgpu_edu/lessons/course.toml", "mgpu_edu/examples/multi_worker_train.py",
                                "mgpu_edu/examples/parameter_server.py", "mgpu_edu/workloads/datasets/README.md",
                                f"mgpu_edu/workloads/datasets/{data.DIGITS_PATH.name}"])
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mgpu-edu = mgpu_edu.course.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_order_the_test_files_run_in_names_files_that_exist():
    """tests/conftest.py hands the long test files out first (make test-main, make check): a file renamed or
    removed would silently lose its place, and the run could end with it alone on one process."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    [order] = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
               and [getattr(target, "id", None) for target in node.targets] == ["FIRST"]]
    assert order[0] == "tests/test_nbgrader.py" and len(set(order)) == len(order)
    assert [name for name in order if not (ROOT / name).is_file()] == []
    # else pytest-xdist hands the files out by how many tests each has, not in that order
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^IN_PARALLEL\s*=.*--dist loadfile --no-loadscope-reorder", makefile, re.M)
