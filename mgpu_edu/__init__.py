"""mgpu_edu: the tested helpers behind the multi-GPU lessons.

``import mgpu_edu`` is instant: TensorFlow is imported only by the functions that need it.

The package is laid out by role (CONTRIBUTING.md draws it):

- ``mgpu_edu.runtime``: where the lessons run: logical devices, the environment, TensorFlow imported
  quietly, fresh processes, strategies, local clusters of worker processes;
- ``mgpu_edu.workloads``: what they train: offline datasets and small Keras models;
- ``mgpu_edu.parallelism``: the algorithms the lessons teach, one module each: all-reduce and the other
  collectives, data parallelism by hand, MirroredStrategy runs, model and pipeline parallelism, ZeRO
  sharding, asynchronous staleness, tensor, context and expert parallelism, DTensor meshes, 3-D training,
  overlap;
- ``mgpu_edu.analysis``: models and measurements of cost: memory, time, recomputation, checkpoints, the
  traced graph, and a planner that chooses a layout;
- ``mgpu_edu.display``: what learners see: drawings (matplotlib), widgets (ipywidgets), shown source
  and the exercises' feedback;
- ``mgpu_edu.course``: the course itself and its tooling: the manifest, student versions, nbgrader,
  grading, the ``mgpu-edu`` command and its doctor.

Every module but ``course.manifest`` (whose names are ``mgpu_edu.course``'s) is also reachable by its
short name, as the lessons import them (``from mgpu_edu import allreduce, check, viz``): each is imported
on first use, so importing the package stays quick and free of TensorFlow. Short names are attributes,
not submodules: import a name from a module by its place (``from mgpu_edu.parallelism.pipeline import
bubble_fraction``).

Example:
    >>> import mgpu_edu
    >>> layout = mgpu_edu.setup_devices(4)  # doctest: +SKIP
    Local · No GPU → 4 logical CPUs: same code paths, no real speed-up
"""

from __future__ import annotations

import importlib
from typing import Any

from mgpu_edu.display.source import show_source
from mgpu_edu.runtime.devices import DeviceLayout, DeviceSetupError, logical_devices, setup_devices
from mgpu_edu.runtime.env import Environment, detect_environment
from mgpu_edu.runtime.quiet import import_tensorflow

__version__ = "0.1.0"

#: Each module's short name and the subpackage that holds it.
MODULES = {
    **dict.fromkeys(("cluster", "devices", "env", "processes", "quiet", "renames", "strategies"), "runtime"),
    **dict.fromkeys(("data", "gpt", "models"), "workloads"),
    **dict.fromkeys(("allreduce", "collectives", "context", "experts", "meshes", "mirrored", "overlap", "parallel",
                    "pipeline", "sharding", "staleness", "tensor", "threed"), "parallelism"),
    **dict.fromkeys(("costmodel", "graphs", "memory", "perf", "planner", "recovery", "roofline", "tradeoffs"),
                    "analysis"),
    **dict.fromkeys(("check", "source", "viz", "widgets"), "display"),
    **dict.fromkeys(("answers", "assignments", "cli", "doctor", "grading", "markers", "preprocessors", "sandbox"),
                    "course"),
}


def __getattr__(name: str) -> Any:
    """``mgpu_edu.allreduce`` and ``from mgpu_edu import allreduce``: the module, imported on first use."""
    if name in MODULES:
        module = importlib.import_module(f"mgpu_edu.{MODULES[name]}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'mgpu_edu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *MODULES})


__all__ = [
    "DeviceLayout",
    "DeviceSetupError",
    "Environment",
    "__version__",
    "detect_environment",
    "import_tensorflow",
    "logical_devices",
    "setup_devices",
    "show_source",
]
