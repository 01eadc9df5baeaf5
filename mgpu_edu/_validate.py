"""Argument checks shared by the modules: errors that name the value and the range."""

from __future__ import annotations

from typing import Any


def whole_number(name: str, value: Any, example: int | None = None) -> int:
    """Return value if it is a whole number ≥ 1 (not a bool), else raise ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        hint = f", e.g. {name}={example}" if example is not None else ""
        raise ValueError(f"{name}={value!r} must be a whole number of at least 1{hint}.")
    return value


def positive_number(name: str, value: Any) -> float:
    """Return value if it is a number > 0 (not a bool), else raise ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number.")
    return value
