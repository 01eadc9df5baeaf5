"""Run code in a fresh Python process: TensorFlow fixes its devices once per process, so every
other device layout needs a process of its own."""

from __future__ import annotations

import subprocess
import sys

from mgpu_edu import quiet


def run_in_new_process(code: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run Python code in a fresh interpreter and return what it printed.

    TensorFlow configures devices once per process, so this is how a lesson or a test
    tries a second device layout without restarting its own kernel.

    Example:
        >>> run_in_new_process("print(6 * 7)").stdout
        '42\\n'
    """
    quiet.quiet_environment()
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )
