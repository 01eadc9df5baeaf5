"""Where are we running? Colab, Binder or a local machine, with or without a GPU.

This module never imports TensorFlow: it asks ``nvidia-smi`` about GPUs, so it is
instant and safe to call before TensorFlow has configured its devices.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform as _platform
import shutil
import subprocess
import sys

PLATFORMS = ("colab", "binder", "local")

#: Set this variable to ``colab``, ``binder`` or ``local`` to override detection
#: (the CI jobs that imitate Colab and Binder use it).
PLATFORM_VARIABLE = "MGPU_EDU_PLATFORM"

_BINDER_VARIABLES = ("BINDER_SERVICE_HOST", "BINDER_REQUEST", "BINDER_REPO_URL", "BINDER_LAUNCH_HOST")


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as ``nvidia-smi`` reports it."""

    index: int
    name: str
    memory_mb: int | None


@dataclasses.dataclass(frozen=True)
class Environment:
    """What this machine offers the lessons.

    Example:
        >>> env = detect_environment()
        >>> env.label in ("Colab", "Binder", "Local")
        True

    On a machine with no GPU, ``gpus`` is empty and ``has_gpu`` is False.
    """

    platform: str
    gpus: tuple[GpuInfo, ...]
    python: str

    @property
    def label(self) -> str:
        """The platform's display name: "Colab", "Binder" or "Local"."""
        return self.platform.capitalize()

    @property
    def has_gpu(self) -> bool:
        """True when ``nvidia-smi`` lists at least one GPU."""
        return bool(self.gpus)


def _detect_platform() -> str:
    forced = os.environ.get(PLATFORM_VARIABLE, "").strip().lower()
    if forced:
        if forced not in PLATFORMS:
            raise ValueError(
                f"{PLATFORM_VARIABLE}={forced!r} is not a platform this course knows. "
                f"Use one of {', '.join(PLATFORMS)}, or unset it to detect the platform."
            )
        return forced
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if any(name in os.environ for name in _BINDER_VARIABLES):
        return "binder"
    return "local"


def parse_nvidia_smi(text: str) -> tuple[GpuInfo, ...]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits``.

    Example:
        >>> parse_nvidia_smi("0, Tesla T4, 15360\\n")
        (GpuInfo(index=0, name='Tesla T4', memory_mb=15360),)
    """
    gpus = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        memory = int(parts[2]) if parts[2].isdigit() else None
        gpus.append(GpuInfo(index=int(parts[0]), name=parts[1], memory_mb=memory))
    return tuple(gpus)


def _query_nvidia_smi() -> tuple[GpuInfo, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        result = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return parse_nvidia_smi(result.stdout) if result.returncode == 0 else ()


@functools.lru_cache(maxsize=1)
def detect_environment() -> Environment:
    """Describe this machine: platform (Colab, Binder or local) and its GPUs.

    The answer is cached for the life of the process; call
    ``detect_environment.cache_clear()`` to ask again.

    Example:
        >>> detect_environment().python.count(".") == 2
        True
    """
    return Environment(platform=_detect_platform(), gpus=_query_nvidia_smi(), python=_platform.python_version())
