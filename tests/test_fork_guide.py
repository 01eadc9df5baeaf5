"""The instructors' guide's fork recipe, run as written: docs/instructors.md's commands between the
fork-guide markers, in order, against a local bare repository standing in for the fork on GitHub.

Two lines are stood in for, and only these: the clone's URL (GitHub → the local bare repository) and
`make setup && source .venv/bin/activate`, which would install a second TensorFlow; this run uses the
test's own environment, whose `mgpu-edu` is this checkout's. Then it checks what the recipe promises:
the tag is on the fork, the instructor and student versions there point their badges and Colab installs
at the fork's tag, and the package installs from that tag with pip.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "instructors.md"


def _recipe() -> list[str]:
    text = GUIDE.read_text(encoding="utf-8")
    block = text.split("<!-- fork-guide:start -->")[1].split("<!-- fork-guide:end -->")[0]
    return [line for line in block.split("```bash")[1].split("```")[0].strip().splitlines() if line.strip()]


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-ec", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
@pytest.mark.skipif(sys.platform == "win32", reason="the recipe is a bash one")
def test_the_fork_guide_works_as_written(tmp_path):
    fork = tmp_path / "fork.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(ROOT), str(fork)], check=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "Instructor", "GIT_AUTHOR_EMAIL": "i@example.org",
           "GIT_COMMITTER_NAME": "Instructor", "GIT_COMMITTER_EMAIL": "i@example.org",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    script = []
    for line in _recipe():
        if "make setup" in line:
            script.append(":")  # the test's own environment stands in for ./.venv
            continue
        script.append(line.replace("https://github.com/OWNER/NAME.git", str(fork)))
    done = _run("\n".join(script), tmp_path, env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Tip:" not in done.stdout  # every badges call was given its own --ref
    tag = "v0.1.0-myschool"
    tags = subprocess.run(["git", "tag"], cwd=fork, capture_output=True, text=True, check=True).stdout.split()
    assert tag in tags

    def at_tag(path: str) -> str:
        return subprocess.run(["git", "show", f"{tag}:{path}"], cwd=fork, capture_output=True, text=True,
                              check=True).stdout

    for folder in ("lessons", "student"):
        lesson = at_tag(f"{folder}/03_allreduce.ipynb")
        assert f"colab.research.google.com/github/OWNER/NAME/blob/{tag}/{folder}/03_allreduce.ipynb" in lesson
        assert f"mgpu-edu @ git+https://github.com/OWNER/NAME@{tag}" in lesson
    assert "BEGIN SOLUTION" not in at_tag("student/02_data_parallel.ipynb")  # the students' copy has no answers
    assert f"blob/{tag}/student/00_devices.ipynb" in at_tag("README.md")  # the buttons open the student versions
    assert re.search(rf'ref = "{tag}"', at_tag("lessons/course.toml"))

    # the package installs from the fork's tag, the lessons inside it pointing at the fork
    target = tmp_path / "installed"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(target), f"mgpu-edu @ git+file://{fork}@{tag}"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert pip.returncode == 0, pip.stderr[-2000:]
    shipped = (target / "mgpu_edu" / "lessons" / "course.toml").read_text(encoding="utf-8")
    assert 'repo = "OWNER/NAME"' in shipped and f'ref = "{tag}"' in shipped
