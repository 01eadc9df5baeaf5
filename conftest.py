"""pytest set-up shared by the unit tests and nbval's lesson runs."""

import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

# The banner says where it runs; CI and nbval runs count as a local machine.
os.environ.setdefault("MGPU_EDU_PLATFORM", "local")

# Every test, lesson kernel and worker process runs offline: tests/offline/sitecustomize.py
# blocks the network for each Python process started from here, and logs what it blocked.
OFFLINE_GUARD = Path(__file__).resolve().parent / "tests" / "offline"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(OFFLINE_GUARD), os.environ.get("PYTHONPATH")) if p)
NETWORK_LOG = Path(tempfile.mkstemp(prefix="mgpu-edu-network-", suffix=".log")[1])
os.environ["MGPU_EDU_NETWORK_LOG"] = str(NETWORK_LOG)


def load_module(name: str, path: Path):
    """A Python file as a module (this file serves `pytest lessons` too, where tests/ isn't on the path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


load_module("mgpu_edu_offline_guard", OFFLINE_GUARD / "sitecustomize.py")  # and pytest itself


def _untracked() -> set[str] | None:
    """Files git doesn't track and doesn't ignore, or None outside a git checkout."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return {line[3:] for line in done.stdout.splitlines() if line.startswith("??")}


ROOT = Path(__file__).resolve().parent
UNTRACKED_AT_START = _untracked()


# MGPU_EDU_WARM_KERNELS=1 (the Colab-like lessons in make test: .ci/env-colab): nbval's kernels run this
# environment's Python, forked from a process that has imported TensorFlow and Keras (tests/warm_kernels.py),
# instead of each importing them again.
_WARM_KERNELS = []


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if os.environ.get("MGPU_EDU_WARM_KERNELS") == "1" and hasattr(config.option, "nbval_kernel_name"):
        module = load_module("warm_kernels", ROOT / "tests" / "warm_kernels.py")
        kernels = module.warm_kernels()
        kernels.__enter__()
        _WARM_KERNELS.append((module, kernels))
        config.option.nbval_current_env = False  # this Python, through the kernel spec warm_kernels() writes
        config.option.nbval_kernel_name = "python3"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Name the notebook whose kernel nbval may start next (a notebook that must import TensorFlow itself gets
    a kernel started as usual: tests/warm_kernels.py)."""
    if _WARM_KERNELS and item.nodeid.split("::")[0].endswith(".ipynb"):
        os.environ[_WARM_KERNELS[0][0].NOTEBOOK_VARIABLE] = str(item.path)


def pytest_collectstart(collector):
    """Don't compare stderr in lessons: TensorFlow writes different start-up lines there
    under nbval than in JupyterLab. stdout and rich outputs of checked cells still count."""
    if hasattr(collector, "skip_compare"):  # nbval's notebook collector
        collector.skip_compare = (*collector.skip_compare, "stderr")


def _leftover_processes(grace_s: float = 5.0) -> list[str]:
    """Processes this run started that are still alive after a grace period; they are then killed."""
    import psutil

    children = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    described = []
    for proc in alive:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            continue
    return described


#: Where `make test` counts executions (.ci/executions.py reads it): one line per notebook run, as
#: "environment <tab> what ran <tab> lesson file". This run's nbval notebooks are noted as they start.
EXECUTION_LOG = os.environ.get("MGPU_EDU_EXECUTION_LOG")
_NBVAL_RUNS: list[str] = []


def note_execution(kind: str, file: str) -> None:
    """Count one run of a lesson's notebook (kind: "lesson", "student version", "widget's cells")."""
    if EXECUTION_LOG:
        Path(EXECUTION_LOG).parent.mkdir(parents=True, exist_ok=True)
        with open(EXECUTION_LOG, "a", encoding="utf-8") as log:
            log.write(f"{os.environ['MGPU_EDU_PLATFORM']}\t{kind}\t{Path(file).name}\n")


@pytest.fixture(scope="session")
def executions():
    """note_execution, for tests that run a lesson's notebook themselves."""
    return note_execution


def pytest_runtest_logstart(nodeid, location):
    file = nodeid.split("::")[0]
    if file.endswith(".ipynb") and file not in _NBVAL_RUNS:  # nbval's first cell of a notebook
        _NBVAL_RUNS.append(file)
        note_execution("lesson", file)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if it touched the network, left files in the checkout or left processes running.

    Lessons and tests may write only to temporary folders and git-ignored ones (lessons/_scratch).
    """
    while _WARM_KERNELS:
        module, kernels = _WARM_KERNELS.pop()
        kernels.__exit__(None, None, None)
        os.environ.pop(module.NOTEBOOK_VARIABLE, None)
    problems = []
    attempts = NETWORK_LOG.read_text(encoding="utf-8").splitlines() if NETWORK_LOG.exists() else []
    NETWORK_LOG.unlink(missing_ok=True)
    problems += [f"network access attempted (pid, command, address): {line}" for line in attempts]
    after = _untracked()
    if UNTRACKED_AT_START is not None and after is not None:
        problems += [f"left a file in the checkout: {name}" for name in sorted(after - UNTRACKED_AT_START)]
    problems += [f"left a process running: {proc}" for proc in _leftover_processes()]
    if problems:
        print("\nThis run was not offline and clean:")
        print("\n".join(f"  {line}" for line in problems))
        session.exitstatus = 1
