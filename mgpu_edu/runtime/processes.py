"""Run code in a fresh Python process: TensorFlow fixes its devices once per process, so every
other device layout needs a process of its own."""

from __future__ import annotations

import subprocess
import sys

from mgpu_edu.runtime import quiet

# The child runs the code as its main program (line numbers and ``from __future__`` imports as
# written) after one line of its own: at exit it freezes the garbage collector. A process that has
# imported TensorFlow and Keras holds about 320,000 Python objects, and the collections Python runs
# while it shuts down take about 0.8 s of a 2-core machine's time before the OS frees the memory
# anyway; frozen objects are skipped (0.1 s). ``atexit`` runs even when the code raises.
_PRELUDE = "import atexit, gc, sys; atexit.register(gc.freeze); exec(compile(sys.argv[1], '<string>', 'exec'))"


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
        [sys.executable, "-c", _PRELUDE, code], capture_output=True, text=True, timeout=timeout, check=False
    )
