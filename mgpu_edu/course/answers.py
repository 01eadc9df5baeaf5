"""Answers as data: how a graded notebook's answers leave the student's kernel, and how the grader reads them.

``mgpu-edu grade`` never trusts what a student's kernel *says* about an answer: it asks the kernel for
the answer itself, as plain data, and judges it with its own copy of :mod:`mgpu_edu.check`, in its own
process. This module is both ends of that exchange:

- in the kernel, :func:`capture` turns an exercise's answer into JSON (:func:`encode`): numbers keep
  their dtype, tensors become their value, shape, dtype and device, a ``planner.Layout`` its fields.
  An answer that is a function is run by the course's check there, and what the function returned
  at each call is recorded (:class:`Recorder`);
- in the grader, :func:`decode` rebuilds those values from the JSON, never by unpickling, and a
  recorded function becomes a :class:`Replay` that returns what it returned, call by call, so the
  grader's own check sees what the kernel's saw.

What crosses is data of bounded size. Code in the kernel can change what it hands over (any code can
compute and hand over any answer), but not how the grader judges it. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
from collections.abc import Callable
from typing import Any

#: Largest answer (as JSON) the grader reads; a bigger one is judged "too large".
MAX_BYTES = 2_000_000
#: Deepest nesting and most items an encoded answer may have.
MAX_DEPTH = 24
MAX_ITEMS = 200_000
#: Most calls a function answer may be recorded for.
MAX_CALLS = 500
#: The mimetype a capture's report travels under, in a display_data message.
MIME = "application/vnd.mgpu-edu.answer+json"


class AnswerError(ValueError):
    """An answer the grader can't read (too large, too deep, or not data)."""


class _Budget:
    def __init__(self) -> None:
        self.items = 0

    def spend(self) -> None:
        self.items += 1
        if self.items > MAX_ITEMS:
            raise AnswerError(f"the answer holds more than {MAX_ITEMS:,} values")


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return str(getattr(dtype, "name", dtype))


def _number(value: Any) -> dict[str, Any] | float | int:
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    return value


def encode(value: Any, depth: int = 0, budget: _Budget | None = None) -> Any:
    """value as JSON-able data, tagged where JSON alone would lose what a check reads.

    Example:
        >>> encode((1, 2.5, None, ...))
        {'tuple': [1, 2.5, None, {'ellipsis': True}]}
    """
    budget = budget or _Budget()
    budget.spend()
    if depth > MAX_DEPTH:
        raise AnswerError(f"the answer is nested more than {MAX_DEPTH} levels deep")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if abs(value) < 2**63 else {"int": str(value)}
    if kind is float:
        return _number(value)
    if value is Ellipsis:
        return {"ellipsis": True}
    module = kind.__module__.split(".")[0]
    if hasattr(value, "device") and callable(getattr(value, "numpy", None)):  # a TensorFlow tensor or variable
        array = value.numpy()
        return {"tensor": {"value": encode(array, depth + 1, budget), "device": str(value.device),
                           "dtype": _dtype_name(value)}}
    if module == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray):
            if value.size > MAX_ITEMS:
                raise AnswerError(f"the answer holds an array of {value.size:,} values")
            budget.items += int(value.size)
            flat = [_number(v) for v in value.astype(np.float64 if value.dtype.kind in "fV" else value.dtype)
                    .ravel().tolist()] if value.dtype.kind in "biufV" else None
            if flat is None:
                raise AnswerError(f"the answer holds a NumPy array of {value.dtype}")
            return {"ndarray": {"values": flat, "shape": list(value.shape), "dtype": value.dtype.name}}
        if isinstance(value, np.generic) and value.dtype.kind in "biufV":
            scalar = value.item() if value.dtype.kind != "V" else float(value)
            return {"scalar": {"value": _number(scalar), "dtype": value.dtype.name}}
    if kind in (list, tuple) or (module == "builtins" and isinstance(value, range)):
        items = [encode(item, depth + 1, budget) for item in value]
        return {"tuple": items} if kind is tuple else items
    if kind is dict:
        return {"dict": [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)] for k, v in value.items()]}
    if type(value).__name__ == "Layout" and module == "mgpu_edu":
        import dataclasses

        return {"layout": {f.name: encode(getattr(value, f.name), depth + 1, budget)
                           for f in dataclasses.fields(value)}}
    if type(value).__name__ == "DeviceLayout" and module == "mgpu_edu":  # a lesson's layout: its device names
        return encode(list(value), depth, budget)
    if kind.__name__ == "generator":
        return [encode(item, depth + 1, budget) for item in _bounded(value)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # a subclass: only its value counts
        return encode(int(value) if isinstance(value, int) else float(value), depth, budget)
    return {"other": {"type": kind.__name__, "repr": _short_repr(value)}}


def _bounded(items: Any) -> Any:
    for count, item in enumerate(items):
        if count >= MAX_ITEMS:
            raise AnswerError(f"the answer yields more than {MAX_ITEMS:,} values")
        yield item


def _short_repr(value: Any) -> str:
    try:
        text = builtins.repr(value)
    except Exception as error:  # a learner's __repr__ may raise anything
        text = f"<{type(value).__name__}, whose repr raised {type(error).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


# --- rebuilding values, in the grader --------------------------------------------------------------------------

class Unknown:
    """An answer of a type the grader doesn't rebuild: checks see an object with a name and a repr, nothing more."""

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text


class RecordedTensor:
    """A tensor as the kernel reported it: its value (a NumPy array), dtype and device, as a check reads them."""

    def __init__(self, value: Any, device: str, dtype: str) -> None:
        import numpy as np

        self._value = np.asarray(value) if not isinstance(value, np.ndarray) else value
        self.device = device
        self.dtype = _Dtype(dtype if _holds(self._value, dtype) else "float64")
        self.shape = tuple(self._value.shape)

    def numpy(self) -> Any:
        return self._value

    def __repr__(self) -> str:
        return f"tf.Tensor({self._value!r}, shape={self.shape}, dtype={self.dtype.name})"


class _Dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


def _holds(values: Any, dtype: str) -> bool:
    """Can a tensor of dtype hold these values exactly? A check judges a low-precision answer to its dtype's
    precision, so a claimed dtype counts only when the values are ones that dtype can hold."""
    import numpy as np

    try:
        array = np.asarray(values, dtype=np.float64)
        if dtype in ("float16", "half"):
            return bool(np.all(array.astype(np.float16).astype(np.float64) == array))
        if dtype in ("float32", "bfloat16"):
            single = array.astype(np.float32)
            exact = bool(np.all(single.astype(np.float64) == array))
            return exact and (dtype == "float32" or not np.any(single.view(np.uint32) & 0xFFFF))
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _numpy_dtype(name: str) -> Any:
    import numpy as np

    try:
        return np.dtype(name)
    except TypeError:  # bfloat16 and other dtypes NumPy alone doesn't know: judged as float32
        return np.dtype("float32")


def decode(data: Any, depth: int = 0) -> Any:
    """The value :func:`encode` encoded (tensors as :class:`RecordedTensor`, other objects as :class:`Unknown`).

    Example:
        >>> decode({"tuple": [1, {"ellipsis": True}]})
        (1, Ellipsis)
    """
    if depth > MAX_DEPTH + 2:
        raise AnswerError("the answer is nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(item, depth + 1) for item in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise AnswerError(f"not an encoded answer: {_short_repr(data)}")
    (tag, body), = data.items()
    if tag == "ellipsis":
        return Ellipsis
    if tag == "int":
        return int(str(body)[:400])
    if tag == "float":
        return float(str(body))
    if tag == "tuple":
        return tuple(decode(item, depth + 1) for item in _list(body))
    if tag == "dict":
        pairs = [(decode(k, depth + 1), decode(v, depth + 1)) for k, v in _list(body)]
        try:
            return dict(pairs)
        except TypeError:  # a key that can't be one in Python (a list): not an answer a check accepts
            return Unknown("dict", "a dict with unhashable keys")
    if tag == "scalar":
        import numpy as np

        return np.array(decode(body["value"]), dtype=_numpy_dtype(str(body["dtype"])))[()]
    if tag == "ndarray":
        import numpy as np

        values = [decode(v) for v in _list(body["values"])]
        shape = tuple(int(n) for n in _list(body["shape"]))
        if math.prod(shape) != len(values):
            raise AnswerError("an array's shape doesn't match its values")
        return np.array(values, dtype=_numpy_dtype(str(body["dtype"]))).reshape(shape)
    if tag == "tensor":
        value = decode(body["value"], depth + 1)
        return RecordedTensor(value, str(body["device"]), str(body["dtype"]))
    if tag == "layout":
        from mgpu_edu.analysis import planner

        fields = {str(k): decode(v, depth + 1) for k, v in dict(body).items()}
        try:
            return planner.Layout(**fields)
        except (TypeError, ValueError):
            return Unknown("Layout", f"Layout({fields})")
    if tag == "other":
        return Unknown(str(body.get("type", "object")), str(body.get("repr", ""))[:200])
    raise AnswerError(f"not an encoded answer: tag {tag!r}")


def _list(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise AnswerError("not an encoded answer: expected a list")
    return body


def recorded_error(name: str, message: str) -> Exception:
    """The exception a recorded call raised: the built-in one of that name, or an Exception subclass named so."""
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin.__module__ == "builtins":
        try:
            return builtin(message)
        except TypeError:  # a built-in exception that takes other arguments (UnicodeDecodeError)
            pass
    return type(name if name.isidentifier() else "Error", (Exception,), {})(message)


# --- function answers: record in the kernel, replay in the grader ------------------------------------------------

class Recorder:
    """Wraps a learner's function in the kernel: each call's result (or error) is recorded as data, and the
    check is handed the *rebuilt* value, exactly what the grader's :class:`Replay` will hand its own check."""

    replays_recording = False

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(self.calls) >= MAX_CALLS:
            raise AnswerError(f"the check called the function more than {MAX_CALLS} times")
        try:
            encoded = encode(self.fn(*args, **kwargs))
            json.dumps(encoded)
        except Exception as error:  # a learner's function may raise anything: that is its result
            self.calls.append({"raised": [type(error).__name__, str(error)[:1000]]})
            raise recorded_error(type(error).__name__, str(error)[:1000]) from None
        self.calls.append({"returned": encoded})
        return decode(encoded)


class Replay:
    """A function answer as the grader sees it: returns (or raises) what the learner's function did, call by call."""

    replays_recording = True

    def __init__(self, calls: list[Any]) -> None:
        self.calls = list(calls)
        self.made = 0
        self.ran_out = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.made >= len(self.calls):
            self.ran_out = True
            raise AnswerError("the recording of this function ended before the check was done")
        call = self.calls[self.made]
        self.made += 1
        if not isinstance(call, dict):
            raise AnswerError("a call in the recording is not data")
        if "raised" in call:
            name, message = (list(call["raised"]) + ["", ""])[:2]
            raise recorded_error(str(name), str(message))
        return decode(call.get("returned"))


def is_function(value: Any) -> bool:
    """An answer to run rather than to read: a callable that isn't a tensor, an array or a class."""
    return callable(value) and not isinstance(value, type) and not hasattr(value, "numpy")


# --- the kernel's side -------------------------------------------------------------------------------------------

def capture(token: str, check: str, answer: Callable[[], Any], arguments: Callable[[], dict[str, Any]]) -> None:
    """In the kernel: send the exercise's answer (and the check's other arguments) to the grader as JSON.

    The report goes out as display data of its own mimetype (:data:`MIME`), tagged with the grader's
    token, and is all the grader reads of the kernel's work.

    ``answer`` and ``arguments`` are thunks, so that a NameError (the learner's cell above failed) is
    reported rather than raised. A function answer is run by the course's own check here, wrapped in a
    :class:`Recorder`, with the check's printing silenced; only the recording is handed over.
    """
    report: dict[str, Any] = {"token": token}
    try:
        report["arguments"] = encode(arguments())
        value = answer()
        if is_function(value):
            from mgpu_edu.display import check as checks

            recorder = Recorder(value)
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    getattr(checks, check)(recorder, **decode(report["arguments"]))
                except Exception:  # noqa: S110 (the check itself failed: the recording so far is the answer)
                    pass
            report["function"] = recorder.calls
        else:
            report["answer"] = encode(value)
    except AnswerError as error:
        report = {"token": token, "unreadable": str(error)}
    except Exception as error:  # the answer's name isn't defined, or reading it raised
        report = {"token": token, "raised": [type(error).__name__, str(error)[:1000]]}
    text = json.dumps(report)
    if len(text) > MAX_BYTES:
        text = json.dumps({"token": token, "unreadable": f"the answer is over {MAX_BYTES:,} bytes as data"})
    from IPython.display import publish_display_data

    publish_display_data({MIME: text})
