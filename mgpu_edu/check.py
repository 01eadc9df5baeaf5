"""Feedback for the lessons' exercises.

Each check prints one line and returns a :class:`Feedback`. It never raises for a wrong or
missing answer, so an unsolved exercise doesn't stop the rest of the notebook.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mgpu_edu.devices import default_memory_limit_mb

_ICONS = {"correct": "✅ Correct", "wrong": "❌ Not yet right", "unsolved": "⏳ Not solved yet"}


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The result of one exercise check: status is "correct", "wrong" or "unsolved"."""

    status: str
    message: str

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    def __str__(self) -> str:
        return f"{_ICONS[self.status]}: {self.message}"


def _report(status: str, message: str) -> Feedback:
    feedback = Feedback(status, message)
    print(feedback)
    return feedback


def _unsolved(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


def placed_on(tensor: Any, device: str) -> Feedback:
    """Lesson 00, exercise 1: is `tensor` the result of work placed on `device`?

    Example:
        >>> placed_on(None, "/device:CPU:2").status
        ⏳ Not solved yet: compute something inside `with tf.device(...)` and assign the result.
        'unsolved'
    """
    if _unsolved(tensor):
        return _report("unsolved", "compute something inside `with tf.device(...)` and assign the result.")
    where = getattr(tensor, "device", None)
    if not isinstance(where, str):
        return _report("wrong", f"expected a TensorFlow tensor, got {type(tensor).__name__}. "
                                "Assign the tensor your computation returns, not a Python value.")
    if where.endswith(device.split("device:")[-1]):
        return _report("correct", f"the result lives on {where}. Pinning work like this is how "
                                  "lesson 02 gives each device its own share of a batch.")
    return _report("wrong", f"your tensor lives on {where}, not {device}. Put the computation itself "
                            f"inside `with tf.device({device!r}):`; creating it elsewhere and "
                            "reading it inside does not move it.")


def memory_split(answer: Any, total_mb: int = 15360, n: int = 5) -> Feedback:
    """Lesson 00, exercise 2: the per-device limit when a total_mb GPU is split n ways."""
    if _unsolved(answer):
        return _report("unsolved", "set `answer` to a number of megabytes.")
    expected = default_memory_limit_mb(total_mb, n)
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return _report("wrong", f"expected a number of MB, got {type(answer).__name__} {answer!r}.")
    if answer == expected:
        return _report("correct", f"{expected:,} MB each. The 20 % kept back leaves room for CUDA's "
                                  "own context, and round numbers make limits easy to read in logs.")
    if answer == total_mb / n or answer == total_mb // n:
        hint = "that hands out the whole card. Keep 20 % back first (× 0.8)."
    elif answer == int(total_mb * 0.8) // n or answer == total_mb * 0.8 / n:
        hint = "right share, but round it down to a multiple of 256 MB."
    else:
        hint = "take 80 % of the card, divide by the number of devices, round down to a multiple of 256."
    return _report("wrong", f"{answer!r} MB is not it: {hint}")
