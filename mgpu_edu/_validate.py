"""Argument checks shared by the modules: errors that name the argument, the value, and what to pass.

Every public function checks its arguments with these, so a learner's mistake reads the same
everywhere: ``replicas=0 must be a whole number from 1 to 4, e.g. replicas=2.``
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class BadArgument(ValueError, TypeError):
    """An argument of the wrong kind or out of range. It is a ValueError and a TypeError, so callers
    that catch either (the CLI, the widgets, a learner's ``except ValueError``) catch it."""


def _range(minimum: float | None, maximum: float | None, above: bool = False) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum:g} to {maximum:g}"
    if minimum is not None:
        return f" above {minimum:g}" if above else f" of at least {minimum:g}"
    if maximum is not None:
        return f" of at most {maximum:g}"
    return ""


def _fail(name: str, value: Any, kind: str, minimum: float | None, maximum: float | None, example: Any,
          hint: str, above: bool = False, where: str = "") -> BadArgument:
    eg = f", e.g. {name}={example!r}" if example is not None else ""
    return BadArgument(f"{where and where + ': '}{name}={value!r} must be {kind}{_range(minimum, maximum, above)}"
                       f"{eg}.{hint and ' ' + hint}")


def whole_number(name: str, value: Any, example: int | None = None, minimum: int | None = 1,
                 maximum: int | None = None, hint: str = "", where: str = "", float_ok: bool = False) -> int:
    """Return value if it is a whole number (not a bool) in [minimum, maximum], else raise BadArgument naming it.

    ``where`` (the call, e.g. "setup_devices(0)") starts the message; ``hint`` ends it. With
    ``float_ok`` a float with no fractional part (``7.5e9``, as learners write big counts) is
    accepted and returned as an int.

    Example:
        >>> whole_number("replicas", 2)
        2
        >>> whole_number("replicas", 0, example=2)
        Traceback (most recent call last):
        ...
        mgpu_edu._validate.BadArgument: replicas=0 must be a whole number of at least 1, e.g. replicas=2.
    """
    if type(value) is int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value  # the common case, without the abstract-class checks below (the planner calls this often)
    if float_ok and isinstance(value, float) and value.is_integer():
        value = int(value)
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or (minimum is not None and value < minimum) or (maximum is not None and value > maximum)):
        raise _fail(name, value, "a whole number", minimum, maximum, example, hint, where=where)
    return int(value)


def real_number(name: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                above: bool = False, example: float | None = None, hint: str = "") -> float:
    """Return value if it is a real number (not a bool) in range, else raise BadArgument naming it.

    ``above=True`` makes the minimum exclusive (value > minimum).

    Example:
        >>> real_number("overlap", 0.5, 0, 1)
        0.5
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and minimum is not None:
        ok = value > minimum if above else value >= minimum  # False for NaN too
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        raise _fail(name, value, "a number", minimum, maximum, example, hint, above)
    return value


def positive_number(name: str, value: Any) -> float:
    """Return value if it is a number > 0 (not a bool), else raise BadArgument naming it."""
    return real_number(name, value, minimum=0, above=True)


def one_of(name: str, value: T, options: Iterable[T], hint: str = "") -> T:
    """Return value if it is one of options, else raise BadArgument listing them.

    Example:
        >>> one_of("algorithm", "ring", ("ring", "tree"))
        'ring'
    """
    options = tuple(options)
    if value not in options:
        raise BadArgument(f"{name}={value!r} is not one of {', '.join(map(repr, options))}: pick one of those."
                          f"{hint and ' ' + hint}")
    return value
