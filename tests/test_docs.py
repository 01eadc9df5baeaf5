"""The README and the course guide agree with the manifest and with the committed measurements, and
the lessons show the package's code as it is now. Nothing here measures anything: the budget
script checks budgets against their limits; these tests check that derived text matches its source."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import nbformat
import pytest

from conftest import budgets_script
from mgpu_edu import course

ROOT = Path(__file__).resolve().parents[1]
COURSE = course.load(ROOT / "lessons")


def _block(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_readme_generated_blocks_are_the_manifests():
    """The start links, the lesson table and the install table: what `mgpu-edu badges` rewrites for a fork."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, block in course.readme_blocks(COURSE).items():
        assert _block(readme, f"<!-- {name}:start -->", f"<!-- {name}:end -->") == block, name


def test_every_install_command_in_the_readme_installs_from_the_repository():
    """Pasted as they are, they work: the package is not on PyPI, so every pip line names the repository."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"`(pip install [^`]*)`", readme)
    assert len(commands) == 5
    for command in commands:
        assert f"@ git+https://github.com/{COURSE.repo}@{COURSE.ref}" in command, command


def test_no_file_points_outside_the_repository_for_its_conventions():
    """The lesson template and the package's conventions live in docs/style.md, in the repository."""
    for path in (ROOT / "CONTRIBUTING.md", ROOT / "README.md", ROOT / "docs" / "instructors.md"):
        assert "../shared" not in path.read_text(encoding="utf-8"), path
    assert "## A lesson notebook" in (ROOT / "docs" / "style.md").read_text(encoding="utf-8")


def test_guide_time_table_is_generated_from_the_manifest_and_the_committed_results():
    budgets = budgets_script()
    rows = json.loads((ROOT / "benchmarks" / "results.json").read_text())["lessons"]
    when = re.search(r"Measured (.*)\.\n", (ROOT / "benchmarks" / "results.md").read_text()).group(1)
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    expected = budgets.guide_table(COURSE, rows, f"measured {when}")
    assert _block(guide, budgets.TIMES_START, budgets.TIMES_END) == expected


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_no_lesson_count_or_range_is_written_by_hand():
    """Counts and ranges of lessons come from the manifest; grep finds none anywhere else."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    patterns = [r"\b(?:nine|ten|9|10) (?:Jupyter )?lessons\b", r"\blessons? 0\d\s*(?:[–-]|to)\s*0\d\b",
                r"\brange\(9\)", r"0\[0-8\]", r"\ball nine\b"]
    found = []
    for name in tracked:
        path = ROOT / name
        if name == "lessons/course.toml" or path.suffix not in {".py", ".md", ".toml", ".cfg", ".txt", ""} \
                or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for pattern in patterns:
            found += [f"{name}: {m.group(0)!r}" for m in re.finditer(pattern, text, flags=re.I)]
    assert found == []


def test_budget_script_renders_every_lesson_and_the_total():
    rows = [{"lesson": lesson.file, "seconds": 1.0 + i / 10} for i, lesson in enumerate(COURSE.lessons)]
    table = budgets_script().guide_table(COURSE, rows, "today")
    for i, lesson in enumerate(COURSE.lessons):
        assert f"| {lesson.number} | {lesson.title} | {lesson.minutes} min | {1.0 + i / 10:.1f} s |" in table
    assert f"**{sum(r['seconds'] for r in rows):.1f} s**" in table


def test_budget_script_refuses_a_guide_without_markers():
    with pytest.raises(ValueError, match="markers"):
        budgets_script().replace_block("no markers here", "<!-- a -->", "<!-- b -->", "x")


def _package_namespace() -> dict:
    """Every mgpu_edu module by its short name, and every public name they define (for lesson expressions)."""
    import mgpu_edu

    namespace = {}
    for name in mgpu_edu.MODULES:
        namespace.update({k: v for k, v in vars(getattr(mgpu_edu, name)).items()
                          if not k.startswith("_") and callable(v)})
    # a module's short name wins over a function of the same name (check.staleness, the staleness module)
    return {**namespace, **{name: getattr(mgpu_edu, name) for name in mgpu_edu.MODULES}, "mgpu_edu": mgpu_edu}


def _show_source_outputs():
    for lesson in COURSE.lessons:
        nb = nbformat.read(COURSE.folder / lesson.file, as_version=4)
        for cell in nb.cells:
            match = cell.cell_type == "code" and re.search(r"show_source\((.+)\)\s*$", cell.source, flags=re.M)
            if match:
                yield lesson.file, match.group(1), cell


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


def test_the_guides_example_check_runs_as_written():
    """docs/instructors.md's "Writing a new exercise" shows a whole check: it must work with check.py's helpers."""
    from mgpu_edu import check

    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    source = re.search(r"```python\n(\s*def tree_steps.*?)```", guide, flags=re.S).group(1)
    namespace = dict(vars(check))
    exec(compile(textwrap.dedent(source), "instructors.md", "exec"), namespace)  # noqa: S102 - our own guide
    tree_steps = namespace["tree_steps"]
    assert tree_steps(6, n=8).correct and tree_steps(6.0, n=8).correct
    assert "double it" in tree_steps(3, n=8).message
    assert tree_steps(None, n=8).status == "unsolved"
    assert tree_steps("six", n=8).status == tree_steps(6.5, n=8).status == tree_steps(7, n=8).status == "wrong"


@pytest.mark.light  # git
def test_no_file_speaks_of_how_the_work_was_organised():
    """The repository describes the course and its design; its history is `git log`. No numbered rounds of work,
    machines on loan or issue numbers in prose, comments, tests or lessons."""
    ordinals = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
                "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
    patterns = [rf"\b(?:{ordinals}|next|last|this|that|previous|earlier|same|evening|morning|development) session\b",
                r"\bsessions? (?:ago|before|after)\b", r"\b(?:lent|on loan)\b", r"\bcan_start_another\b",
                r"\bissue \d+\b", rf"\b(?:{ordinals}) (?:round|review) of\b", r"\bclosing note\b"]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in tracked:
        path = ROOT / name
        if name.startswith("docs/site/_static/vendor/") or name == "tests/test_docs.py" or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for pattern in patterns:
            found += [f"{name}: {m.group(0)!r}" for m in re.finditer(pattern, text, flags=re.I)]
    assert not found, found
