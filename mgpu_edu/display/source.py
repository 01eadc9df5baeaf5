"""Show the source of a function, so a lesson walks through the code it runs."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any


class Source:
    """Source code that displays highlighted in Jupyter and as plain text elsewhere."""

    def __init__(self, text: str, name: str) -> None:
        self.text = text
        self.name = name

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        formatter = HtmlFormatter(noclasses=True, style="default")
        code = highlight(self.text, PythonLexer(), formatter)
        return f"<details open><summary><code>{self.name}</code></summary>{code}</details>"


def show_source(obj: Any) -> Source:
    """Return obj's source for display: the code a lesson is about to run.

    Example:
        >>> from mgpu_edu.runtime.devices import default_memory_limit_mb
        >>> print(repr(show_source(default_memory_limit_mb)).splitlines()[0])
        def default_memory_limit_mb(total_mb: int, n: int) -> int:
    """
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError) as error:
        raise TypeError(
            f"show_source({obj!r}): can't find source code for this object. "
            "Pass a function, class or module written in Python."
        ) from error
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    label = f"{module}.{name}" if module and module != name else name
    return Source(textwrap.dedent(text).rstrip() + "\n", label)
