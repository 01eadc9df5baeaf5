"""Import TensorFlow without its start-up noise, so lesson output stays clean and checkable.

TensorFlow 2.21 prints its oneDNN notice through C++ logging before that logging reads
``TF_CPP_MIN_LOG_LEVEL``, straight to file descriptor 2. No environment variable hides it,
so :func:`import_tensorflow` sends descriptor 2 to ``/dev/null`` for the import alone.
Set ``MGPU_EDU_TF_LOGS=1`` to see everything TensorFlow says.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

VERBOSE_VARIABLE = "MGPU_EDU_TF_LOGS"


def _verbose() -> bool:
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")


def quiet_environment() -> None:
    """Ask TensorFlow's C++ side to print errors only (it must run before the import).

    A value the user already set wins.
    """
    if not _verbose():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def muted_stderr() -> Iterator[None]:
    """Send file descriptor 2 (where C++ libraries write) to /dev/null inside the block."""
    if _verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def import_tensorflow() -> ModuleType:
    """Import TensorFlow quietly and return the module.

    Example:
        >>> tf = import_tensorflow()  # doctest: +SKIP
        >>> tf.__version__  # doctest: +SKIP
        '2.21.0'

    It works the same with or without a GPU. If TensorFlow is missing it says how to
    install it.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None:
        quiet_environment()
        try:
            with muted_stderr():
                import tensorflow as tf
        except ImportError as error:
            raise ImportError(
                "TensorFlow is not installed in this Python "
                f"({sys.executable}). Install it with: pip install 'mgpu-edu[cpu]' "
                "(no GPU) or pip install 'mgpu-edu[gpu]' (NVIDIA GPU). "
                "Colab already has TensorFlow: do not reinstall it there."
            ) from error
    if not _verbose():
        tf.get_logger().setLevel("ERROR")  # INFO:tensorflow lines go to stdout otherwise
    return tf
