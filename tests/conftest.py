"""Shared fixtures: a fake TensorFlow for the GPU branch, and a fresh-process runner."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from unittest import mock

import pytest

from mgpu_edu import devices, env, processes, quiet


class FakeDevice:
    def __init__(self, name: str, device_type: str):
        self.name, self.device_type = name, device_type

    def __repr__(self) -> str:
        return f"FakeDevice({self.name!r})"


class FakeConfig:
    """Just enough of ``tf.config`` for setup_devices, recording every call."""

    def __init__(self, gpus: int, gpu_name: str, initialized: bool = False):
        self.physical = {
            "GPU": [FakeDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(gpus)],
            "CPU": [FakeDevice("/physical_device:CPU:0", "CPU")],
        }
        self.gpu_name = gpu_name
        self.initialized = initialized
        self.visible: list[FakeDevice] | None = None
        self.logical_config: list[types.SimpleNamespace] | None = None
        self.calls: list[str] = []
        self.tf32: bool | None = None  # what enable_tensor_float_32_execution was last given
        self.experimental = types.SimpleNamespace(get_device_details=self._details,
                                                  enable_tensor_float_32_execution=self._set_tf32)

    # compute capability by card name, as TensorFlow reports it (T4 7.5, A100 8.0, H100 9.0)
    CAPABILITY = {"Tesla T4": (7, 5), "NVIDIA A100-SXM4-40GB": (8, 0), "NVIDIA H100 80GB HBM3": (9, 0)}

    def _details(self, device: FakeDevice) -> dict:
        if device.device_type != "GPU":
            return {}
        details = {"device_name": self.gpu_name}
        if self.gpu_name in self.CAPABILITY:
            details["compute_capability"] = self.CAPABILITY[self.gpu_name]
        return details

    def _set_tf32(self, enabled: bool) -> None:
        self.calls.append(f"enable_tensor_float_32_execution({enabled})")
        self.tf32 = enabled

    def list_physical_devices(self, kind: str) -> list[FakeDevice]:
        return list(self.physical[kind])

    def LogicalDeviceConfiguration(self, memory_limit=None):  # TF's name
        return types.SimpleNamespace(memory_limit=memory_limit)

    def _check(self) -> None:
        if self.initialized:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")

    def set_visible_devices(self, devices_: list, kind: str) -> None:
        self._check()
        self.calls.append(f"set_visible_devices({len(devices_)})")
        self.visible = list(devices_)

    def set_logical_device_configuration(self, device, configs) -> None:
        self._check()
        self.calls.append(f"set_logical_device_configuration({device.name}, {len(configs)})")
        self.logical_config = list(configs)

    def list_logical_devices(self, kind: str) -> list[FakeDevice]:
        if kind == "CPU":
            return [FakeDevice("/device:CPU:0", "CPU")]
        if self.logical_config is not None:
            count = len(self.logical_config)
        elif self.visible is not None:
            count = len(self.visible)
        else:
            count = len(self.physical["GPU"])
        return [FakeDevice(f"/device:GPU:{i}", "GPU") for i in range(count)]


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make setup_devices see a fake machine: fake_gpu(gpus=1, name="Tesla T4", memory_mb=15360)."""

    def install(gpus: int = 1, name: str = "Tesla T4", memory_mb: int | None = 15360,
                platform: str = "colab", initialized: bool = False) -> FakeConfig:
        config = FakeConfig(gpus, name, initialized)
        fake_tf = types.SimpleNamespace(config=config)
        monkeypatch.setattr(quiet, "import_tensorflow", lambda: fake_tf)
        monkeypatch.setattr(
            env, "_query_nvidia_smi",
            lambda: tuple(env.GpuInfo(i, name, memory_mb) for i in range(gpus)),
        )
        monkeypatch.setenv(env.PLATFORM_VARIABLE, platform)
        env.detect_environment.cache_clear()
        return config

    monkeypatch.setattr(devices, "_ACTIVE", None)
    monkeypatch.setattr(devices, "_ACTIVE_CALL", "")
    yield install
    env.detect_environment.cache_clear()


def budgets_script() -> types.ModuleType:
    """benchmarks/budgets.py (a script, not part of the package), loaded as a module for the tests that check it."""
    spec = importlib.util.spec_from_file_location("budgets", Path(__file__).resolve().parents[1] / "benchmarks"
                                                  / "budgets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_fresh(code: str, timeout: float = 180) -> dict:
    """Run code in a new Python process (one device layout per process); return its JSON result.

    The code must assign a JSON-able value to ``result``; printed text comes back as "stdout".
    """
    wrapper = textwrap.dedent(code) + "\nimport json as _j\nprint('@@RESULT@@' + _j.dumps(result))\n"
    completed = processes.run_in_new_process(wrapper, timeout=timeout)
    assert completed.returncode == 0, completed.stderr[-3000:]
    stdout, _, payload = completed.stdout.rpartition("@@RESULT@@")
    return {"stdout": stdout, "result": json.loads(payload)}


@pytest.fixture(scope="session", autouse=True)
def four_devices() -> list[str]:
    """This test process's one device layout: 4 logical CPUs (or GPUs where there is one), set up before its
    first test. pytest-xdist hands a process its test files in whatever order processes free up, so the layout
    must not depend on which file reaches TensorFlow first: a test that ran TensorFlow on the default single
    device first left every later test in that process unable to set up four (one run of make test)."""
    layout = devices.setup_devices(4, verbose=False)
    return list(layout)


# Commands libraries run to ask about the machine (h5py, imported by TensorFlow, runs `uname -p` once per
# process; mgpu_edu.env runs nvidia-smi where it is on the PATH): not what the `processes` mark is about.
MACHINE_QUERIES = {"uname", "nvidia-smi"}
HOW_TO_MARK = "or @pytest.mark.light if none of its processes imports TensorFlow; tests/conftest.py says why"


@contextlib.contextmanager
def _refusing_new_processes(item):
    """A test that starts a process through ``subprocess`` (``run``, ``Popen``, asyncio's subprocesses and
    jupyter_client's kernels all go through ``Popen``: a fresh Python with a device layout of its own, the
    command line through its entry point, a kernel, a cluster, git) says so with ``@pytest.mark.processes``,
    or with ``@pytest.mark.light`` where none of its processes imports TensorFlow; the oldest-Python job runs
    only the ``light`` ones. While an unmarked test and the fixtures it sets up run, every such start is
    refused, and the test fails afterwards even if the code under test caught the refusal, so the mark can't
    be missing where this test process starts processes. (``os.fork``, ``os.system`` and ``multiprocessing``
    are not watched: nothing here uses them. A fixture shared with marked tests is seen only when an unmarked
    test sets it up, as in the oldest-Python job. Tests marked ``slow`` or ``lessons`` start processes by design.)"""
    if any(item.get_closest_marker(mark) for mark in ("processes", "light", "slow", "lessons")):
        yield
        return
    refused: list[str] = []
    original = subprocess.Popen.__init__

    def refuse(self, args, *rest, **options):
        command = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if Path(os.fsdecode(command[0]).split()[0]).name in MACHINE_QUERIES:
            return original(self, args, *rest, **options)
        refused.append(repr(args))
        raise AssertionError(f"{item.nodeid} starts a process ({args!r}) but is not marked "
                             f"@pytest.mark.processes: mark it ({HOW_TO_MARK})")

    with mock.patch.object(subprocess.Popen, "__init__", refuse):
        yield
    if refused:
        pytest.fail(f"{item.nodeid} started {len(refused)} process(es) without @pytest.mark.processes: "
                    f"{refused[0]} ({HOW_TO_MARK})", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _refusing_new_processes(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _refusing_new_processes(item):
        return (yield)


# Freeing a MirroredStrategy input iterator can block for about as long as the iterator has lived, on a busy
# machine: a race in TensorFlow's tf.data autotuning thread (CONTRIBUTING.md). An iterator a test leaves in
# cyclic garbage (a failed `fit` does) would be freed by Python's collector whenever it next runs, minutes
# later, inside another test. So the garbage is collected as soon as a test that made one ends.
_DISTRIBUTED_ITERATORS = {"made": 0, "seen": 0}


def _count_distributed_iterators() -> bool:
    """Count the iterators over several devices made from now on; True the first time it can (TF loaded)."""
    module = sys.modules.get("tensorflow.python.data.ops.multi_device_iterator_ops")
    made = getattr(module, "OwnedMultiDeviceIterator", None)
    if made is None or getattr(made, "_counted_by_conftest", False):
        return False
    original = made.__init__

    def counted(self, *args, **kwargs):
        _DISTRIBUTED_ITERATORS["made"] += 1
        return original(self, *args, **kwargs)

    made.__init__, made._counted_by_conftest = counted, True
    return True


def pytest_runtest_teardown(item, nextitem):
    first_time = _count_distributed_iterators()  # TensorFlow loaded during this test: it may have made some
    if first_time or _DISTRIBUTED_ITERATORS["made"] != _DISTRIBUTED_ITERATORS["seen"]:
        _DISTRIBUTED_ITERATORS["seen"] = _DISTRIBUTED_ITERATORS["made"]
        gc.collect()


# The test files in this order: make test-main and make check hand whole files to two processes (pytest-xdist,
# --dist loadfile, --no-loadscope-reorder: the Makefile says why), a process taking the next file once its
# current one has two tests left to run. Any lesson make check runs (a notebook it names) first, then nbgrader's
# round trip, which runs every student version (minutes), and the website, built twice and opened in Chromium;
# then the other long files, longest first (their times on an idle machine, in seconds, in the comments), and
# every other file after them, in pytest's order (each a few seconds), so that the run ends with short files, not
# with one process working through a long one alone while the other waits.
FIRST = (
    "tests/test_nbgrader.py", "tests/test_site.py",
    "tests/test_mirrored.py",  # 158
    "tests/test_grading.py",  # 100: a class of notebooks graded, two at a time, and five smaller batches
    "tests/test_warm_kernels.py",  # 77 beside other work: a zygote's imports, then fourteen kernels (three fresh)
    "tests/test_meshes.py",  # 54
    "tests/test_cluster.py",  # 40, mostly waiting for processes to stop
    "tests/test_keras_facts.py",  # 37
    "tests/test_tradeoffs.py", "tests/test_allreduce.py",  # 33 each
    "tests/test_tensor.py", "tests/test_data.py",  # 25, 23
    "tests/test_devices.py", "tests/test_sharding.py", "tests/test_cli.py",  # 16 to 17
    "tests/test_collectives.py", "tests/test_offline.py",  # 15 each
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        if path.endswith(".ipynb"):
            return -1
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order
