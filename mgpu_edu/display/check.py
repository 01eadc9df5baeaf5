"""Feedback for the lessons' exercises.

Each check prints one line and returns a :class:`Feedback`. It never raises for a wrong or
missing answer, so an unsolved exercise doesn't stop the rest of the notebook.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

from mgpu_edu.analysis.memory import USABLE_FRACTION, ZERO_STAGES, model_states
from mgpu_edu.analysis.recovery import checkpoint_interval as _young
from mgpu_edu.analysis.recovery import last_checkpoint
from mgpu_edu.parallelism.mirrored import fit_example_weights, replica_shares
from mgpu_edu.parallelism.parallel import shard_sizes
from mgpu_edu.parallelism.pipeline import bubble_fraction, micro_batches_for_bubble
from mgpu_edu.runtime.devices import default_memory_limit_mb

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


def _unsolved_function(name: str, returned: Any) -> Feedback:
    """Feedback for a function that returns the stub's ``...`` (unsolved) or None (a forgotten return)."""
    if returned is Ellipsis:
        return _report("unsolved", f"`{name}` still returns `...`: write its body, then run this cell again.")
    return _report("wrong", f"`{name}` returned None. Did you forget the `return` statement?")


#: The prefix TensorFlow gives a local device's full name; messages show names without it.
_LOCAL = "/job:localhost/replica:0/task:0"


def _device_key(name: str) -> tuple[str, int] | None:
    """("CPU", 2) for "/job:localhost/replica:0/task:0/device:CPU:2", "/CPU:2" or "/cpu:2"."""
    import re

    match = re.search(r"([A-Za-z]+):(\d+)$", name)
    return (match.group(1).upper(), int(match.group(2))) if match else None


def placed_on(tensor: Any, device: str, expected: float | None = None) -> Feedback:
    """Lesson 00, exercise 1: is `tensor` the result of work placed on `device` (and, if given, equal to expected)?

    Example:
        >>> placed_on(None, "/device:CPU:2").status
        ⏳ Not solved yet: compute something inside `with tf.device(...)` and assign the result.
        'unsolved'
    """
    if _unsolved(tensor):
        return _report("unsolved", "compute something inside `with tf.device(...)` and assign the result.")
    where = getattr(tensor, "device", None)
    if not isinstance(where, str) or _device_key(where) is None:  # NumPy's arrays have device "cpu", no number
        hint = (" `.numpy()` copies the result into a NumPy array, which has left the device: drop it."
                if type(tensor).__module__.split(".")[0] == "numpy" else "")
        return _report("wrong", f"expected a TensorFlow tensor, got {type(tensor).__name__}. Assign the tensor "
                                f"your computation returns, not a Python or NumPy value.{hint}")
    value = _as_number(tensor)
    if _device_key(where) == _device_key(device) and expected is not None and (
            value is None or not _close(value, expected, rel_tol=1e-6)):
        shape = getattr(tensor, "shape", None)
        shown, wanted = _both(value, expected) if value is not None else ("", _show(expected))
        got = (f"a tensor of shape {tuple(shape)}, not the single number" if value is None and shape is not None
               else "something other than" if value is None else f"{shown}, not")
        return _report("wrong", f"your tensor lives on the right device, but it holds {got} "
                                f"{wanted}. Compute the sum the exercise asks for.")
    if _device_key(where) == _device_key(device):
        return _report("correct", f"the result lives on {where}. Pinning work like this is how "
                                  "lesson 02 gives each device its own share of a batch.")
    return _report("wrong", f"your tensor lives on {where}, not {device}. Put the computation itself "
                            f"inside `with tf.device({device!r}):`; creating it elsewhere and "
                            "reading it inside does not move it.")


def memory_split(answer: Any, total_mb: int = 15360, n: int = 5) -> Feedback:
    """Lesson 00, exercise 2: the per-device limit when a total_mb GPU is split n ways."""
    early, answer = _read_number(answer, "set `answer` to a number of megabytes.", "a number of MB")
    if early is not None:
        return early
    expected = default_memory_limit_mb(total_mb, n)
    if answer == expected:
        return _report("correct", f"{expected:,} MB each. The 20 % kept back leaves room for CUDA's "
                                  "own context, and round numbers make limits easy to read in logs.")
    if answer == total_mb / n or answer == total_mb // n:
        hint = "that hands out the whole card. Keep 20 % back first (× 0.8)."
    elif answer == int(total_mb * 0.8) // n or answer == total_mb * 0.8 / n:
        hint = "right share, but round it down to a multiple of 256 MB."
    else:
        hint = "take 80 % of the card, divide by the number of devices, round down to a multiple of 256."
    return _report("wrong", f"{_show(answer)} MB is not it: {hint}")


#: Machine epsilon of the floating dtypes a learner's answer can arrive in (NumPy's and TensorFlow's names).
_EPSILON = {"float16": 2.0 ** -10, "half": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
            "float": 2.0 ** -23, "single": 2.0 ** -23}


class _Number(float):
    """A learner's number as a float that remembers how precise its own dtype is.

    ``precision`` is the relative tolerance the answer deserves: a float32 answer is right to
    about 1e-7 of its value, a Python float (float64) to far less, but a formula evaluated in
    a few steps may round, so no answer is held to better than 1e-9.
    """

    precision: float

    def __new__(cls, value: float, dtype_name: str = "float64") -> _Number:
        number = super().__new__(cls, value)
        number.precision = max(1e-9, 2 * _EPSILON.get(dtype_name, 0.0))
        return number


def _as_number(answer: Any) -> _Number | None:
    """answer as a float (a :class:`_Number`) if it is a real number of any kind a learner can produce, else None.

    Python ints and floats, NumPy scalars (np.int64, np.float32) and 0-d arrays, and scalar
    TensorFlow tensors all count; bools, strings and containers don't. The number keeps the
    precision of its dtype, so a float32 answer is judged to float32's precision.
    """
    if isinstance(answer, bool):
        return None
    if isinstance(answer, numbers.Real) and not hasattr(answer, "dtype"):
        return _Number(float(answer))
    dtype = getattr(answer, "dtype", None)
    dtype_name = str(getattr(dtype, "name", dtype))
    if hasattr(answer, "numpy") and callable(answer.numpy):  # a TensorFlow scalar
        try:
            answer = answer.numpy()
        except Exception:  # whatever it is, it isn't a number we can read
            return None
    if isinstance(answer, bool):
        return None
    if isinstance(answer, numbers.Real) and not hasattr(answer, "dtype"):
        return _Number(float(answer), dtype_name)
    kind = getattr(getattr(answer, "dtype", None), "kind", None)
    if getattr(answer, "shape", None) == () and kind in ("i", "u", "f", "V"):  # NumPy 0-d (bfloat16's kind is V)
        try:
            return _Number(float(answer), dtype_name)
        except (TypeError, ValueError):
            return None
    return None


def _close(answer: float, expected: float, rel_tol: float = 0.0, abs_tol: float = 0.0) -> bool:
    """answer equals expected within the given tolerances, or within the precision of the answer's own dtype."""
    precision = getattr(answer, "precision", 1e-9)
    return math.isclose(answer, expected, rel_tol=max(rel_tol, precision), abs_tol=abs_tol)


def _both(got: float, want: float) -> tuple[str, str]:
    """got and want printed with just enough digits to show that they differ (never '2.33333, expected 2.33333')."""
    for digits in range(6, 18):
        shown = f"{got:.{digits}g}", f"{want:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return repr(float(got)), repr(float(want))


def _whole_numbers(values: Any) -> list[int] | None:
    """The items of values as ints, or None if values isn't iterable or an item isn't a whole number."""
    try:
        read = [_as_number(value) for value in values]
    except TypeError:  # not iterable
        return None
    if any(value is None or not value.is_integer() for value in read):
        return None
    return [int(value) for value in read]


def _show(value: float) -> str:
    """A number as a learner would write it: 96, not 96.0; 0.04, not 0.04000000000000001."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.6g}"


def _function_answer(fn: Any, define: str, call: str) -> Feedback | None:
    """Feedback for a function answer that is still unsolved or isn't a function; None when it is one."""
    if _unsolved(fn):
        return _report("unsolved", f"define `{define}` and pass it to the check.")
    if not callable(fn):
        return _report("wrong", f"expected a function, got {type(fn).__name__} {fn!r}. Pass the function itself: "
                                f"{call}, no parentheses.")
    return None


def _read_number(answer: Any, unsolved_hint: str, what: str = "a number",
                 whole: bool = False) -> tuple[Feedback | None, float]:
    """(feedback, value): feedback for an unsolved, non-numeric (or, with whole, fractional) answer, else None."""
    if _unsolved(answer):
        return _report("unsolved", unsolved_hint), 0.0
    value = _as_number(answer)
    if value is None:
        return _report("wrong", f"expected {what}, got {type(answer).__name__} {answer!r}."), 0.0
    if whole and not value.is_integer():
        return _report("wrong", f"expected {what}, got {_show(value)}: it must be a whole number."), value
    return None, value


def _judge(answer: float, expected: float, correct: str, mistakes: Sequence[tuple[Any, str]], otherwise: str,
           rel_tol: float = 0.0, abs_tol: float = 0.0) -> Feedback:
    """One numeric check: the right answer, then each typical mistake with its hint, then the general rule.

    ``mistakes`` pairs a wrong value (or a tuple of them) with the hint it earns; ``otherwise``
    follows "<answer> is not it". With both tolerances 0 the answer must match to the precision of
    its own dtype (:func:`_as_number`): a float32 answer to float32's, any answer to 1e-9.
    """
    def near(value: float) -> bool:
        return _close(answer, value, rel_tol, abs_tol)

    if near(expected):
        return _report("correct", correct)
    for values, hint in mistakes:
        if any(near(v) for v in (values if isinstance(values, tuple) else (values,))):
            return _report("wrong", hint)
    return _report("wrong", f"{_show(answer)} is not it{otherwise}")


def spread_function(fn: Any, devices: Any) -> Feedback:
    """Lesson 01, exercise 1: ``fn(values)`` puts ``values[i]`` in a tensor on ``devices[i % N]``, round robin.

    ``devices`` is the layout ``setup_devices`` returned (or a list of logical device names or
    devices). The check calls ``fn`` on six numbers and reads, from TensorFlow, where each tensor
    it returns lives.
    """
    early = _function_answer(fn, "spread(values)", "check.spread_function(spread, layout)")
    if early is not None:
        return early
    names = [str(getattr(name, "name", name)) for name in devices]  # LogicalDevice objects too
    values = [float(k + 1) for k in range(len(names) + 2)]
    try:
        got = fn(list(values))
    except Exception as error:  # a learner's code may raise anything
        return _report("wrong", f"spread({values}) raised {type(error).__name__}: {error}.")
    if _unsolved(got):
        return _unsolved_function("spread", got)
    if getattr(got, "shape", None) is not None and hasattr(got, "device"):  # one tensor, or one variable
        return _report("wrong", "spread returned one tensor: a tensor lives on one device. Return a list of "
                                "tensors, one per value, each created on its own device.")
    try:
        got = list(got)
    except TypeError:
        return _report("wrong", f"spread returned {type(got).__name__}: return a list of tensors, one per value.")
    except Exception as error:  # a generator's body runs only now
        return _report("wrong", f"going through what spread({values}) returned raised "
                                f"{type(error).__name__}: {error}.")
    if len(got) != len(values):
        return _report("wrong", f"spread({values}) returned {len(got)} item(s): one tensor per value, so "
                                f"{len(values)}.")
    where = [getattr(t, "device", None) for t in got]
    for k, (item, device) in enumerate(zip(got, where, strict=True)):
        if not (isinstance(device, str) and _device_key(device)):
            numpy_hint = (" `.numpy()` copies a tensor into NumPy, which has left the device: drop it."
                          if type(item).__module__.split(".")[0] == "numpy" else "")
            return _report("wrong", f"item {k} is {type(item).__name__} {item!r}, not a TensorFlow tensor: only a "
                                    f"tensor's .device says where it lives. Create each one inside "
                                    f"`with tf.device(...)`.{numpy_hint}")
    for k, tensor in enumerate(got):
        shape = tuple(getattr(tensor, "shape", ()) or ())
        value = _as_number(tensor)
        if value is None and shape == (1,):
            return _report("wrong", f"item {k} has shape (1,): put the number itself in a tensor, "
                                    "tf.constant(value), not tf.constant([value]).")
        if value is None or not _close(value, values[k], rel_tol=1e-6):
            return _report("wrong", f"item {k} holds {tensor!r}, not {_show(values[k])}: keep the values, in order.")
    for k, device in enumerate(where):
        wanted = names[k % len(names)]
        if _device_key(device) != _device_key(wanted):
            short = device.replace(_LOCAL, "")
            if len({_device_key(w) for w in where}) == 1:
                hint = ("every tensor lives on the same device. Create each one inside its own "
                        "`with tf.device(layout[i % N])` block. If you did, the names you passed may name no "
                        "device here (a GPU on a CPU kernel, '/device:Cpu:1'): soft placement then runs the "
                        "work on another device without a word (section 1).")
            else:
                hint = f"value i goes to device i % {len(names)}, so item {k} to {wanted}."
                if _device_key(device) == _device_key(names[0]) and k >= len(names):
                    hint += (f" (If you asked for device {k}: there is none, so TensorFlow soft-placed it on "
                             f"{short}, without a word.)")
            return _report("wrong", f"item {k} lives on {short}, not {wanted}: {hint}")
    return _report("correct", f"{len(values)} values over {len(names)} devices, wrapping around: item i on device "
                              f"i % {len(names)}, as TensorFlow reports. Lesson 02's towers put each shard in its "
                              "own tf.device block the same way.")


def cross_device_bytes(answer: Any, readers: int, elements: int, itemsize: int = 4) -> Feedback:
    """Lesson 01, exercise 2: bytes copied when `readers` devices read one variable kept on one of them."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    size = elements * itemsize
    expected = (readers - 1) * size
    return _judge(answer, expected, f"{expected:,} bytes: every device except the variable's own gets a copy, each "
                  "step. MirroredStrategy keeps a copy on every device instead, so reads stay local, and all-reduces "
                  "the gradients once a step.", [
                      (readers * size, "the device that holds the variable reads it in place: it copies nothing."),
                      ((elements * (readers - 1), elements * readers),
                       f"that counts elements. Multiply by {itemsize} bytes per float32.")],
                  ". Bytes = (devices that don't hold it) × elements × bytes each.")


def shard_bounds_function(fn: Any) -> Feedback:
    """Lesson 02, exercise 1: a function (batch, n) -> each shard's (start, stop), by shard_sizes' rule.

    Right when ``x[start:stop]`` is each tower's shard, in order: the pieces ``tf.split(x,
    shard_sizes(batch, n))`` cuts (tests/test_check.py compares the two with TensorFlow).
    """
    early = _function_answer(fn, "my_shard_bounds(batch, n)", "check.shard_bounds_function(my_shard_bounds)")
    if early is not None:
        return early
    for batch, n in [(10, 4), (8, 4), (30, 4), (3, 4), (17, 5), (0, 3)]:
        try:
            got = fn(batch, n)
        except Exception as error:  # a learner's code may raise anything
            return _report("wrong", f"my_shard_bounds({batch}, {n}) raised {type(error).__name__}: {error}.")
        if _unsolved(got):
            return _unsolved_function("my_shard_bounds", got)
        sizes = shard_sizes(batch, n)
        want, start = [], 0
        for size in sizes:
            want.append((start, start + size))
            start += size
        try:
            pairs = [tuple(_whole_numbers(pair)) for pair in got]
        except TypeError:  # an item that isn't a pair of whole numbers
            pairs = None
        if pairs is None or any(len(pair) != 2 for pair in pairs):
            if _whole_numbers(got) == sizes:
                return _report("wrong", f"my_shard_bounds({batch}, {n}) returned the shard sizes {sizes}: turn "
                                        "them into (start, stop) pairs, each shard starting where the last stopped.")
            return _report("wrong", f"my_shard_bounds({batch}, {n}) returned {got!r}: return a list of n "
                                    "(start, stop) pairs of whole numbers, one per tower.")
        if pairs == want:
            continue
        if len(pairs) != n:
            return _report("wrong", f"my_shard_bounds({batch}, {n}) gave {len(pairs)} pairs: one per tower, so {n}.")
        if [b - a for a, b in pairs] == [size - 1 for size in sizes]:
            return _report("wrong", f"my_shard_bounds({batch}, {n}) = {pairs}: a slice x[start:stop] stops "
                                    "*before* stop, so stop is start + size, not start + size - 1.")
        if [b - a for a, b in pairs] == sizes:
            return _report("wrong", f"my_shard_bounds({batch}, {n}) = {pairs}: right sizes, but each shard must "
                                    "start where the one before it stopped, the first at 0.")
        return _report("wrong", f"my_shard_bounds({batch}, {n}) = {pairs}, expected {want}: shards of sizes "
                                f"{sizes} (parallel.shard_sizes), one after the other.")
    return _report("correct", "each tower slices exactly its own shard, the pieces tf.split(x, sizes) cuts, in "
                              "order: so concatenating the towers' outputs gives back the batch's order (step 5).")


def combine_function(fn: Any) -> Feedback:
    """Lesson 02, exercise 2: combine per-tower (gradient sum, example count) into the batch-mean gradient."""
    early = _function_answer(fn, "combine(sums, counts)", "check.combine_function(combine)")
    if early is not None:
        return early
    cases = [([6.0, 1.0], [3, 1]), ([10.0, 4.0, 0.0], [4, 2, 0]), ([1.0, 1.0], [2, 2])]
    for sums, counts in cases:
        try:
            got = fn(list(sums), list(counts))
        except ZeroDivisionError:
            return _report("wrong", f"combine({sums}, {counts}) divided by zero: an empty tower has count 0, so "
                                    "never divide by one tower's count. Divide the total by the total.")
        except Exception as error:  # a learner's code may raise anything
            return _report("wrong", f"combine({sums}, {counts}) raised {type(error).__name__}: {error}.")
        if _unsolved(got):
            return _unsolved_function("combine", got)
        number = _as_number(got)
        if number is None:
            return _report("wrong", f"combine({sums}, {counts}) returned {type(got).__name__} {got!r}: return "
                                    "one number, the mean gradient of the whole batch.")
        got = number
        want = sum(sums) / sum(counts)
        if not _close(got, want):
            mean_of_means = sum(s / c for s, c in zip(sums, counts, strict=True) if c) / len(sums)
            shown, wanted = _both(got, want)
            if _close(got, mean_of_means):
                return _report("wrong", f"combine({sums}, {counts}) = {shown} is the mean of the towers' means. "
                                        f"With uneven towers that over-weights the small one: add the sums and "
                                        f"divide by all {sum(counts)} examples ({wanted}).")
            return _report("wrong", f"combine({sums}, {counts}) = {shown}, expected {wanted}.")
    return _report("correct", "sum of tower sums ÷ total examples is exactly the single-device mean, whatever "
                              "the shard sizes: what a correct custom step does (lesson 06). Keras's fit averages "
                              "per-replica means instead, which lesson 04 catches on the short last batch.")


def ring_bytes(answer: Any, n: int, nbytes: int) -> Feedback:
    """Lesson 03, exercise 1: bytes each device sends in a ring all-reduce of nbytes over n devices."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    expected = 2 * (n - 1) * nbytes / n
    return _judge(answer, expected, f"{expected:,.0f} bytes, under 2·S however many devices join: why the ring "
                  "scales where reduce-to-one doesn't.", [
                      ((n - 1) * nbytes / n, "that is one phase. The ring runs reduce-scatter *and* all-gather: "
                                             "double it."),
                      ((n - 1) * nbytes, "that is what reduce-to-one's root sends. In the ring each step moves one "
                                         f"chunk of S/{n}, not the whole tensor.")],
                  ". Each of 2(N−1) steps sends one chunk of S/N bytes.", abs_tol=0.5)


def ring_steps(answer: Any, n: int) -> Feedback:
    """Lesson 03, exercise 2: how many steps a ring all-reduce takes over n devices."""
    early, answer = _read_number(answer, "set `answer` to a whole number of steps.", "a number of steps", whole=True)
    if early is not None:
        return early
    expected = 2 * (n - 1)
    return _judge(answer, expected, f"{expected} steps. Each costs at least one latency α, so the ring's latency "
                  "grows with N: the price of its constant bandwidth.", [
                      (n - 1, "that is one phase (reduce-scatter). The all-gather takes as many again."),
                      ((n, 2 * n), f"a device's own chunk needs no step: each phase takes N−1 = {n - 1} steps.")],
                  ". Count the reduce-scatter steps, then the all-gather steps.")


def steps_per_epoch(answer: Any, examples: int, per_replica: int, replicas: int) -> Feedback:
    """Lesson 04, exercise 1: steps in one epoch for a per-replica batch on some replicas."""
    early, answer = _read_number(answer, "set `answer` to a whole number of steps.", "a number of steps", whole=True)
    if early is not None:
        return early
    global_batch = per_replica * replicas
    expected = math.ceil(examples / global_batch)
    return _judge(answer, expected, f"{expected} steps of {global_batch}: the last one takes the "
                  f"{examples - (expected - 1) * global_batch} examples left over.", [
                      (examples // global_batch, "that drops the short last batch. Round up: the leftover examples "
                                                 "make one more step."),
                      ((math.ceil(examples / per_replica), examples // per_replica),
                       f"that uses the per-replica batch. Each step consumes the global batch: {per_replica} × "
                       f"{replicas}.")],
                  ": steps = ⌈examples ÷ (per-replica batch × replicas)⌉.")


def batch_shares(answer: Any, batch: int, replicas: int) -> Feedback:
    """Lesson 04, exercise 2: how many examples of one batch TensorFlow gives each replica."""
    hint = f"set `answer` to a list of {replicas} whole numbers, one per replica."
    if _unsolved(answer):
        return _report("unsolved", hint)
    shares = None if isinstance(answer, (str, bytes)) else _whole_numbers(answer)
    if shares is None or any(share < 0 for share in shares):
        return _report("wrong", f"expected a list of {replicas} whole numbers, got {type(answer).__name__} "
                                f"{answer!r}.")
    expected = replica_shares(batch, replicas)
    if len(shares) != replicas:
        return _report("wrong", f"{shares} has {len(shares)} numbers: give one per replica, {replicas} in all.")
    if shares == expected:
        weights = ", ".join("none" if w is None else f"{w:.3g}" for w in fit_example_weights(expected))
        return _report("correct", f"{expected}: ⌈{batch} ÷ {replicas}⌉ = {expected[0]} each, in order, until the "
                                  "batch runs out. fit then weighs each example by 1/(N × its replica's share) "
                                  f"instead of 1/{batch}: replica by replica, [{weights}] × the right weight.")
    if sum(shares) != batch:
        return _report("wrong", f"{shares} adds up to {sum(shares)} examples; the replicas share all {batch} of them.")
    if shares == shard_sizes(batch, replicas):
        return _report("wrong", f"{shares} is lesson 02's even split. TensorFlow fills the replicas in order "
                                f"with ⌈{batch} ÷ {replicas}⌉ = {expected[0]} examples each until the batch runs out.")
    return _report("wrong", f"{shares} is not how TensorFlow splits it: each replica gets ⌈batch ÷ replicas⌉ "
                            "examples, in order, and the last ones get what is left (or nothing).")


def softmax_floor(answer: Any, classes: int) -> Feedback:
    """Lesson 05, exercise 2: the lowest loss a softmax-twice model can reach on C classes."""
    early, answer = _read_number(answer, "set `answer` to a loss (a number).", "a number")
    if early is not None:
        return early
    expected = math.log(1 + (classes - 1) / math.e)
    return _judge(answer, expected, f"{expected:.4f} = log(1 + {classes - 1}/e): the perfect probabilities "
                  f"(1, 0, …, 0) softmaxed again give the right class only e/(e + {classes - 1}).", [
                      (0, "0 is what the right loss gives a perfect prediction. Here the loss applies softmax to "
                          "(1, 0, …, 0) first: work out the right class's probability after that softmax."),
                      (math.log(classes), f"log({classes}) is the loss of a uniform guess. The perfect "
                                          "probabilities are not uniform: softmax(1, 0, …, 0) gives the right "
                                          "class e/(e + C − 1)."),
                      (math.e / (math.e + classes - 1), "that is the right class's probability after the "
                                                        "second softmax. The loss is −log of it."),
                      (math.log(1 + (classes - 1) * math.e), "the e is upside down: the right class's score "
                                                             "is 1 and the others' 0, so its share is "
                                                             "e/(e + C − 1).")],
                  f": −log of e/(e + C − 1) with C = {classes}.", rel_tol=1e-3, abs_tol=1e-3)


def scaled_lr(answer: Any, base_lr: float, base_batch: int, replicas: int, per_replica: int) -> Feedback:
    """Lesson 05, exercise 1: the learning rate after the linear scaling rule."""
    early, answer = _read_number(answer, "set `answer` to a learning rate.", "a number")
    if early is not None:
        return early
    factor = per_replica * replicas / base_batch
    expected = base_lr * factor
    return _judge(answer, expected, f"{expected:g}: the global batch grew {factor:g}×, "
                  "so does the rate. Watch the loss: the rule breaks at large factors.", [
                      (base_lr, "that keeps the rate: with fewer, bigger steps per epoch training slows down. "
                                "Multiply by how much the global batch grew."),
                      (base_lr * math.sqrt(factor), f"that is the square-root rule (× √{factor:g}), the usual start "
                                                    "for Adam and its relatives. The exercise asks for the linear "
                                                    f"rule, SGD's: multiply by the factor itself, {factor:g}."),
                      (base_lr / replicas, "that divides. A bigger batch gives a less noisy gradient, so the rule "
                                           "multiplies.")],
                  ": rate × (global batch ÷ the batch it was tuned for).", rel_tol=1e-6)


def replica_loss(answer: Any, loss_sum: float, per_replica: int, global_batch: int) -> Feedback:
    """Lesson 06, exercise 1: what one replica's scaled loss must be (its loss sum ÷ the global batch)."""
    early, answer = _read_number(answer, "set `answer` to the loss this replica should return.", "a number")
    if early is not None:
        return early
    expected = loss_sum / global_batch
    return _judge(answer, expected, f"{expected:g}. Summed over the replicas by the all-reduce, these give the mean "
                  "over the global batch: lesson 02's fix, done by "
                  f"tf.nn.compute_average_loss(losses, global_batch_size={global_batch}).", [
                      (loss_sum / per_replica, f"that is this replica's own mean. The all-reduce *adds* the "
                                               f"replicas' losses, so {global_batch // per_replica} means would make "
                                               "the loss that many times too big. Divide by the global batch."),
                      (loss_sum, "that is the sum. Divide by the global batch, so the replicas' sum is a mean.")],
                  ": this replica's loss sum ÷ the global batch size.", rel_tol=1e-6)


def python_runs(answer: Any, replicas: int, batches: int = 100) -> Feedback:
    """Lesson 06, exercise 2: how often the Python body of a replica function runs under tf.function,
    over ``batches`` calls with batches of one shape."""
    early, answer = _read_number(answer, "set `answer` to a whole number.", "a number of runs", whole=True)
    if early is not None:
        return early
    return _judge(answer, replicas, f"{replicas}: once per replica while tracing, then never again; the graph runs "
                  "the steps. Python side effects (print, list.append) happen only while tracing.", [
                      (1, "MirroredStrategy traces the replica function once per replica, not once in all."),
                      ((batches, batches * replicas), "inside tf.function the Python body runs only while "
                                                      "tracing; later calls run the graph. Shapes don't change "
                                                      "here, so there is no retracing.")],
                  ". Think: traced once per replica, and not again for same shapes.")


def micro_batches(answer: Any, stages: int, target: float) -> Feedback:
    """Lesson 07, exercise 1: the fewest micro-batches that keep a P-stage bubble under target."""
    early, answer = _read_number(answer, "set `answer` to a whole number of micro-batches.",
                                 "a whole number of micro-batches", whole=True)
    if early is not None:
        return early
    if answer < 1:
        return _report("wrong", f"expected a whole number of micro-batches, at least 1, got {_show(answer)}.")
    answer = int(answer)
    expected = micro_batches_for_bubble(stages, target)
    if answer == expected:
        return _report("correct", f"M = {expected}: bubble {bubble_fraction(stages, expected):.2%}. More micro-batches "
                                  "shrink the bubble, but each is smaller, so a device does less per launch.")
    if bubble_fraction(stages, answer) == target:
        return _report("wrong", f"M = {answer} gives exactly {target:.0%}: you need *under* it. One more.")
    if answer > expected:
        return _report("wrong", f"M = {answer} works, but it isn't the fewest: try smaller M while "
                                f"(P−1)/(M+P−1) stays under {target:.0%}.")
    return _report("wrong", f"M = {answer} leaves a bubble of {bubble_fraction(stages, answer):.1%}. "
                            f"Solve (P−1)/(M+P−1) < {target} for M.")


def kernel_shard(answer: Any, inputs: int, outputs: int, devices: int) -> Feedback:
    """Lesson 07, exercise 2: kernel parameters per device when a Dense kernel is split by columns."""
    early, answer = _read_number(answer, "set `answer` to a number of parameters.", "a number")
    if early is not None:
        return early
    expected = inputs * outputs // devices
    return _judge(answer, expected, f"{expected:,} per device: tensor parallelism divides a layer's memory, which "
                  "is why it is used for layers too big for one device.", [
                      (inputs * outputs, "that is the whole kernel. Each device keeps only its share of the "
                                         "columns."),
                      ((outputs // devices, inputs // devices), "that counts columns (or rows), not parameters: each "
                                                                "column has one weight per input.")],
                  ": (inputs × outputs) ÷ devices.")


def allreduce_seconds(answer: Any, params: float, replicas: int, gbytes_per_s: float,
                      bytes_per_param: int = 4) -> Feedback:
    """Lesson 08, exercise 1: seconds for a ring all-reduce of a model's gradients, latency ignored."""
    early, answer = _read_number(answer, "set `answer` to a number of seconds.", "a number of seconds")
    if early is not None:
        return early
    size = params * bytes_per_param
    expected = 2 * (replicas - 1) / replicas * size / (gbytes_per_s * 1e9)
    return _judge(answer, expected, f"{expected * 1e3:.0f} ms per step. Compare it with the step's compute time: "
                  "that ratio decides the scaling efficiency.", [
                      (expected / bytes_per_param, "that counts parameters, not bytes: each float32 gradient is "
                                                   f"{bytes_per_param} bytes."),
                      (size / (gbytes_per_s * 1e9), "that sends the tensor once. The ring sends 2(N−1)/N of it per "
                                                    "device.")],
                  ": 2(N−1)/N × params × bytes ÷ bandwidth.", rel_tol=1e-3)


def model_speedup(answer: Any, compute_s: float, comm_s: float, replicas: int) -> Feedback:
    """Lesson 08, exercise 2: speed-up of N replicas when each step adds comm_s to compute_s (no overlap)."""
    early, answer = _read_number(answer, "set `answer` to the speed-up (a number like 2.5).", "a number")
    if early is not None:
        return early
    expected = compute_s * replicas / (compute_s + comm_s)
    return _judge(answer, expected, f"{expected:g}×, an efficiency of {expected / replicas:.0%}: the all-reduce "
                  "costs what the replicas would otherwise gain.", [
                      (replicas, "that is the ideal. Each step also waits for the all-reduce."),
                      (compute_s / (compute_s + comm_s), "that is the efficiency. Multiply by the number of replicas "
                                                         "for the speed-up.")],
                  ": N replicas process N batches in (compute + comm) seconds.", rel_tol=1e-3)


def global_batch_workers(answer: Any, workers: int, per_worker: int) -> Feedback:
    """Lesson 09, exercise 1: the global batch of a multi-worker job."""
    early, answer = _read_number(answer, "set `answer` to a whole number of examples.", "a number of examples",
                                 whole=True)
    if early is not None:
        return early
    expected = workers * per_worker
    return _judge(answer, expected, f"{expected}: MultiWorkerMirroredStrategy adds up replicas across machines "
                  "exactly as MirroredStrategy does across the GPUs of one.",
                  [(per_worker, "that is one worker's share. The global batch counts every worker's.")],
                  ": workers × per-worker batch.")


def staleness(answer: Any, workers: int) -> Feedback:
    """Lesson 09, exercise 2: how stale a gradient typically is with N asynchronous workers."""
    early, answer = _read_number(answer, "set `answer` to a whole number of updates.", "a number of updates",
                                 whole=True)
    if early is not None:
        return early
    expected = workers - 1
    return _judge(answer, expected, f"{expected}: while one worker computes, the other {expected} each apply an "
                  "update. More workers, staler gradients: one reason to lower the learning rate.",
                  [(workers, "a worker's own update isn't in between: count only the others.")],
                  ": the other workers' updates land while one worker computes.")


def zero_stage_that_fits(answer: Any, params: float, devices: int, gpu_gb: float, optimizer: str = "adam",
                         precision: str = "mixed") -> Feedback:
    """Lesson 10, exercise 1: the lowest ZeRO stage whose model states fit on a card of gpu_gb (decimal GB).

    "Fit" means what it means in the lesson (:func:`mgpu_edu.memory.fits`): at most
    ``USABLE_FRACTION`` (90 %) of the card, the rest left for what the count leaves out.
    """
    early, answer = _read_number(answer, "set `answer` to a ZeRO stage, 0 to 3.", "a stage number", whole=True)
    if early is not None:
        return early
    totals = {stage: model_states(params, devices, stage, optimizer, precision).total / 1e9
              for stage in ZERO_STAGES}
    usable = USABLE_FRACTION * gpu_gb
    fitting = [stage for stage in ZERO_STAGES if totals[stage] <= usable]
    if not fitting:
        return _report("wrong", "no stage fits here; the exercise expects one that does.")
    expected = fitting[0]
    if answer == expected:
        return _report("correct", f"stage {expected}: {totals[expected]:.1f} GB per device, where stage "
                                  f"{expected - 1} needs {totals[expected - 1]:.1f} GB. Each stage shards more, "
                                  "and sends as much or more (with one micro-batch per step, stage 3 sends 1.5×): "
                                  "use the lowest that fits."
                       if expected else f"stage 0 already fits ({totals[0]:.1f} GB).")
    if answer in totals and answer > expected:
        return _report("wrong", f"stage {int(answer)} fits ({totals[int(answer)]:.1f} GB), but so does stage "
                                f"{expected}, which sends no more (with one micro-batch per step stages 0–2 send the "
                                "same and stage 3 1.5×; with gradient accumulation, each higher stage sends more): "
                                "pick the lowest.")
    if answer in totals:
        over = ("more than the whole card" if totals[int(answer)] > gpu_gb else
                f"it fits on the {gpu_gb:g} GB card only without the 10 % the lesson keeps spare")
        return _report("wrong", f"stage {int(answer)} needs {totals[int(answer)]:.1f} GB per device: {over} "
                                f"(memory.fits allows {usable:g} GB). Shard more.")
    return _report("wrong", f"{_show(answer)} is not a ZeRO stage: they are 0, 1, 2 and 3.")


def zero3_bytes(answer: Any, n: int, params: float, bytes_per_param: int = 2) -> Feedback:
    """Lesson 10, exercise 2: bytes one device sends per step under ZeRO-3."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    size = params * bytes_per_param
    expected = 3 * (n - 1) / n * size
    return _judge(answer, expected, f"{expected:,.0f} bytes: 1.5× plain data parallelism's 2(N−1)/N·S (S = the "
                  "weights' bytes), because every layer's weights are gathered twice, for the forward and the "
                  "backward pass.", [
                      (2 * (n - 1) / n * size, "that is stages 0–2. Stage 3 also all-gathers the weights again for "
                                               "the backward pass: three ring phases, not two."),
                      (3 * (n - 1) * size, "that is all devices together. Each sends (N−1)/N of S per phase."),
                      (3 * (n - 1) / n * params, f"that counts weights, not bytes: {bytes_per_param} bytes each."),
                      (3 * size, "that leaves out (N−1)/N: in each ring phase a device sends every shard but one "
                                 "(N−1 chunks of S/N), not the whole S."),
                      *([(3 * (n - 1) / n * params * 4, f"that counts 4 bytes per weight; here each weight and "
                                                         f"gradient takes {bytes_per_param}.")]
                        if bytes_per_param != 4 else []),
                      (expected / 1e9, "that is in GB: the answer is in bytes (multiply by 10⁹)."),
                      (expected / 2**30, "that is in GiB: the answer is in bytes (multiply by 2³⁰).")],
                  ": 3 × (N−1)/N × weights × bytes per weight.", rel_tol=1e-6)



def lost_steps(answer: Any, steps_done: int, every: int) -> Feedback:
    """Lesson 11, exercise 1: the steps a restarted run must run again after a failure."""
    early, answer = _read_number(answer, "set `answer` to a whole number of steps.", "a number of steps", whole=True)
    if early is not None:
        return early
    saved = last_checkpoint(steps_done, every)
    expected = steps_done - saved
    return _judge(answer, expected, f"{expected}: the run resumes from the checkpoint of step {saved} and runs steps "
                  f"{saved + 1} to {steps_done} again. On average a failure costs half an interval.",
                  [(saved, f"{saved} is the step it resumes *from*; count the steps after it that are lost."),
                   (saved + every - steps_done, "that counts forward to the next checkpoint, which was never "
                                                "written. Count back to the last one."),
                   (0, "only what a checkpoint holds survives; the steps after it are lost."),
                   (steps_done, "the checkpoint keeps the steps before it: only the ones after it are lost.")],
                  f": find the last multiple of {every} at or before step {steps_done}.")


def checkpoint_interval(answer: Any, save_seconds: float, mtbf_seconds: float) -> Feedback:
    """Lesson 11, exercise 2: Young's checkpoint interval, in seconds (2 % tolerance)."""
    early, answer = _read_number(answer, "set `answer` to a number of seconds.", "a number of seconds")
    if early is not None:
        return early
    expected = _young(save_seconds, mtbf_seconds)
    return _judge(answer, expected, f"about {expected:,.0f} s ({expected / 60:.0f} min): checkpoint more often and "
                  "saving eats the time; less often and each failure throws away more work.",
                  [(math.sqrt(save_seconds * mtbf_seconds), "that leaves out the 2 under the square root."),
                   (2 * save_seconds * mtbf_seconds, "that is 2·δ·M itself: take its square root."),
                   (expected / 60, "that is in minutes, or the MTBF is still in hours: put both times in "
                                   f"seconds (MTBF {mtbf_seconds:,.0f} s) and give seconds.")],
                  ": √(2 × save time × MTBF), both in seconds.", rel_tol=0.02)


def all_to_all_bytes(answer: Any, n: int, nbytes: int) -> Feedback:
    """Lesson 12, exercise 1: bytes each device sends in an all-to-all of nbytes per device over n devices."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    expected = (n - 1) * nbytes / n
    return _judge(answer, expected, f"{expected:,.0f} bytes: N−1 of its N chunks, S/N each, while its own chunk "
                  "stays. As much as a reduce-scatter, half of an all-reduce.", [
                      ((n - 1) * nbytes, "that sends the whole tensor to every other device. Each device is sent "
                                         f"only the chunk meant for it: S/{n} bytes."),
                      (nbytes, f"that counts the chunk a device keeps for itself: it sends {n - 1} of its {n} "
                               "chunks."),
                      (2 * (n - 1) * nbytes / n, "that is an all-reduce's, which runs two phases. An all-to-all "
                                                 "moves each chunk once."),
                      (nbytes / n, f"that is one chunk. A device sends one chunk to each of the other {n - 1} "
                                   "devices.")],
                  ". Each device sends one chunk of S/N bytes to each of the other N−1 devices.", abs_tol=0.5)


def reduce_scatter_function(fn: Any, devices: Any) -> Feedback:
    """Lesson 12, exercise 2: ``fn(tensors)`` is a reduce-scatter built from all_reduce and slicing.

    The check places a 7 × 2 tensor on each device in ``devices`` (7 rows don't divide by 2, 3 or
    4 devices), calls ``fn`` and compares what each device got with chunk i
    (``numpy.array_split`` along axis 0) of the sum, and reads from TensorFlow where it lives.
    """
    import numpy as np

    from mgpu_edu.runtime import quiet

    early = _function_answer(fn, "reduce_scatter_by_all_reduce(tensors)",
                             "check.reduce_scatter_function(reduce_scatter_by_all_reduce, layout)")
    if early is not None:
        return early
    names = [str(getattr(name, "name", name)) for name in devices]
    n = len(names)
    rng = np.random.default_rng(12)
    values = [rng.integers(-9, 10, size=(7, 2)).astype(np.float32) for _ in range(n)]
    tensors = list(values)  # a grader replaying a recorded answer (mgpu_edu.course.answers) needs no TensorFlow
    if not getattr(fn, "replays_recording", False):
        tf = quiet.import_tensorflow()
        tensors = []
        for value, name in zip(values, names, strict=True):
            with tf.device(name):
                tensors.append(tf.constant(value))
    wanted = np.array_split(np.sum(values, axis=0), n)
    try:
        got = fn(list(tensors))
    except Exception as error:  # a learner's code may raise anything
        if type(error).__name__ == "InvalidArgumentError" and "evenly divide" in str(error):
            return _report("wrong", f"tf.split(total, {n}) needs {n} to divide the 7 rows, and it doesn't. Pass the "
                                    f"chunk sizes instead: tf.split(total, parallel.shard_sizes(7, {n})).")
        return _report("wrong", f"reduce_scatter_by_all_reduce raised {type(error).__name__}: {error}.")
    if _unsolved(got):
        return _unsolved_function("reduce_scatter_by_all_reduce", got)
    try:
        got = list(got)
    except TypeError:
        return _report("wrong", f"it returned {type(got).__name__}: return a list with one tensor per device.")
    if len(got) != n:
        return _report("wrong", f"it returned {len(got)} item(s) for {n} devices: one tensor per device.")
    arrays = []
    for i, item in enumerate(got):
        if isinstance(item, np.ndarray) or np.isscalar(item):
            return _report("wrong", f"item {i} is a NumPy {type(item).__name__}, which lives on no device: NumPy "
                                    "functions (np.array_split, .numpy()) leave TensorFlow. Cut with tf.split or by "
                                    "slicing the tensor.")
        if not hasattr(item, "device") or not hasattr(item, "numpy"):
            return _report("wrong", f"item {i} is {type(item).__name__}, not a TensorFlow tensor: return each "
                                    "device's chunk as a tensor on its device.")
        arrays.append(item.numpy())
    total = np.sum(values, axis=0)
    for i, array in enumerate(arrays):
        if array.shape == wanted[i].shape and np.allclose(array, wanted[i]):
            continue
        if array.shape == total.shape and np.allclose(array, total):
            return _report("wrong", f"device {i} kept the whole sum. A reduce-scatter leaves device i only chunk i "
                                    "of it: cut each sum and keep one piece.")
        if i > 0 and array.shape == wanted[0].shape and np.allclose(array, wanted[0]):
            return _report("wrong", f"device {i} kept chunk 0. Device i keeps chunk i (its index in the list).")
        floor = 7 // n
        if array.shape[0] in (floor, 7 - floor * (n - 1)) and array.shape[0] != wanted[i].shape[0]:
            return _report("wrong", f"device {i} got {array.shape[0]} row(s), not {wanted[i].shape[0]}. Cut 7 rows "
                                    f"the way numpy.array_split does: the first 7 % {n} = {7 % n} chunks get one row "
                                    f"more, {[len(w) for w in wanted]} (parallel.shard_sizes(7, {n})).")
        return _report("wrong", f"device {i} got {array.tolist()}, expected chunk {i} of the sum: "
                                f"{wanted[i].tolist()}.")
    for i, item in enumerate(got):
        if _device_key(item.device) != _device_key(names[i]):
            return _report("wrong", f"device {i}'s chunk lives on {item.device.replace(_LOCAL, '')}, not {names[i]}. "
                                    "Slice inside `with tf.device(tensors[i].device):` so the chunk stays where "
                                    "its sum is (lesson 01: an op without a device runs on the default one).")
    return _report("correct", f"chunk i of the sum on device i, for {n} devices and 7 uneven rows. Built from an "
                              "all-reduce, as the exercise asks, a reduce-scatter moves 2(N−1)/N·S per device, twice "
                              "what a real one sends: every device receives finished sums it then throws away.")


def tp_block_bytes(answer: Any, t: int, seq: int, batch: int, hidden: int, itemsize: int = 2) -> Feedback:
    """Lesson 13, exercise 1: bytes each device sends in one block's forward pass under tensor parallelism."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    activation = seq * batch * hidden * itemsize
    expected = 2 * 2 * (t - 1) / t * activation
    return _judge(answer, expected, f"{expected:,.0f} bytes: two ring all-reduces (after attention, after the MLP) "
                  f"of the block's {activation:,} bytes of activations, 2(t−1)/t of it each. The backward pass "
                  "sends as much again.", [
                      (expected / 2, "that is half of it: one all-reduce (a block has two, after attention and "
                                     "after the MLP), or (t−1)/t of the activations per all-reduce instead of the "
                                     "ring's 2(t−1)/t."),
                      (2 * 2 * activation, "that leaves out the ring's (t−1)/t: a device doesn't send the chunk it "
                                           "keeps."),
                      (4 * 2 * (t - 1) / t * activation, "that is twice it: the backward pass too, or 4 bytes a "
                                                         f"value. The question asks for the forward pass, at "
                                                         f"{itemsize} bytes a value.")],
                  ". Each all-reduce moves 2(t−1)/t of s·b·h values per device; count the block's all-reduces.",
                  abs_tol=0.5)


def block_weights_per_device(answer: Any, hidden: int, t: int) -> Feedback:
    """Lesson 13, exercise 2: how many of one block's weights each of t tensor-parallel devices holds."""
    early, answer = _read_number(answer, "set `answer` to a whole number of weights.", "a number of weights",
                                 whole=True)
    if early is not None:
        return early
    h = hidden
    split, copied = 12 * h * h + 4 * h, 6 * h  # wq wk wv wo w1 w2 and b1; the LayerNorms, bo and b2
    expected = split // t + copied
    return _judge(answer, expected, f"{expected:,}: 1/{t} of the {split:,} split weights (wq, wk, wv, wo, w1, w2 "
                  f"and b1) plus all {copied} copied ones (two LayerNorms, bo, b2).", [
                      ((split + copied) // t, f"that splits everything. The LayerNorms and the biases added after "
                                              f"an all-reduce (bo, b2) are copied: {copied} weights on every device."),
                      (split // t, f"that leaves out the {copied} copied weights: two LayerNorms (4·h), bo and b2."),
                      (12 * h * h // t + copied, "that leaves b1 out: it is cut with w1's columns, 4·h/t each."),
                      ((split + 2 * h) // t + 4 * h, "that splits bo and b2 with the rows of wo and w2. They are added "
                                                     "after the all-reduce, once, so every device holds them whole."),
                      (12 * h * h // t + copied + 4 * h, "that copies b1. It belongs to w1's columns: each device adds "
                                                         "only its own 4·h/t units' biases before GELU."),
                      (split + copied, "that is the whole block: each device holds a slice.")],
                  ". Count each weight of the block, then divide only the ones that are cut.")


def ring_attention_bytes(answer: Any, n: int, batch: int, heads: int, seq: int, head_dim: int,
                         itemsize: int = 2) -> Feedback:
    """Lesson 14, exercise 1: bytes each device sends in one ring attention's forward pass."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    block = batch * heads * (seq // n) * head_dim * itemsize  # one device's keys (or values)
    expected = (n - 1) * 2 * block
    return _judge(answer, expected, f"{expected:,.0f} bytes: N−1 = {n - 1} steps, each sending the key block and "
                  f"the value block the device holds, {block:,} bytes each ({2 * block:,} a step). The backward "
                  "pass sends twice as much: the blocks go round again, and their gradients once.", [
                      (expected / 2, "that is half of it: the keys only (each step passes the value block too), or "
                                     "a count of values rather than bytes."),
                      (n * 2 * block, f"that is N steps. A device starts with its own block: N−1 = {n - 1} sends "
                                      "bring it the others'."),
                      (expected * n, f"that is {n}× it: the total over all {n} GPUs, or the whole sequence's keys "
                                     "and values at every step. The question asks what each GPU sends, and it "
                                     "passes on only the block it holds, s/N positions."),
                      (expected * 3 / 2, "that sends the queries too: they stay on their device; only the keys and "
                                         "values travel."),
                      (expected * 4 / itemsize, f"that is twice it: 4 bytes a value (the question's take {itemsize}), "
                                                "or the backward pass alone (the question asks for the forward)."),
                      (expected * 3, "that is the forward and backward passes together (the backward sends twice "
                                     "the forward's bytes); the question asks for the forward.")],
                  ". Count the steps round the ring, and what one device sends at each: its current key and value "
                  "block, b·heads·(s/N)·head_dim values each.", abs_tol=0.5)


def zigzag_function(fn: Any) -> Feedback:
    """Lesson 14, exercise 2: ``fn(device, n)`` gives the two chunks (of 2N) that device holds under the zig-zag."""
    early = _function_answer(fn, "zigzag(device, n)", "check.zigzag_function(zigzag)")
    if early is not None:
        return early
    for n in range(1, 9):
        seen = []
        for device in range(n):
            try:
                got = fn(device, n)
            except Exception as error:  # a learner's code may raise anything
                return _report("wrong", f"zigzag({device}, {n}) raised {type(error).__name__}: {error}.")
            if _unsolved(got):
                return _unsolved_function("zigzag", got)
            chunks = _whole_numbers(got)
            if chunks is None or len(chunks) != 2:
                return _report("wrong", f"zigzag({device}, {n}) returned {got!r}: return the two chunk numbers, "
                                        "e.g. [0, 7].")
            want = sorted([device, 2 * n - 1 - device])
            if sorted(chunks) != want:
                if sorted(chunks) == sorted([2 * device, 2 * device + 1]):
                    hint = ("those are two neighbouring chunks: device N−1 would still get the two latest, whose "
                            "queries see the most keys. Pair an early chunk with a late one.")
                elif sorted(chunks) == sorted([device, n - 1 - device]):
                    hint = "there are 2N chunks, numbered 0 to 2N−1: the mirror of chunk d is 2N−1−d."
                else:
                    hint = f"device {device} of {n} takes chunk {device} and its mirror from the end."
                return _report("wrong", f"zigzag({device}, {n}) returned {chunks}, not {want}: {hint}")
            seen += chunks
        if sorted(seen) != list(range(2 * n)):
            return _report("wrong", f"for N = {n} the devices' chunks are {sorted(seen)}: every chunk 0…{2 * n - 1} "
                                    "must be held by exactly one device.")
    from mgpu_edu.parallelism import context

    return _report("correct", "device d holds chunks d and 2N−1−d, for N = 1…8: every device then computes "
                              f"2N+1 causal chunk products ({context.blocks_computed(4, layout='zigzag')} for N = 4), "
                              f"where the contiguous split gives {context.blocks_computed(4)}.")


def dropped_tokens(answer: Any, tokens: int, experts: int, top_k: int, capacity_factor: float,
                   routed: int) -> Feedback:
    """Lesson 14, exercise 3: token choices an expert drops, given how many the router sent it."""
    early, answer = _read_number(answer, "set `answer` to a whole number of token choices.",
                                 "a number of token choices", whole=True)
    if early is not None:
        return early
    from mgpu_edu.parallelism import experts as moe

    slots = moe.capacity(tokens, experts, top_k, capacity_factor)
    expected = max(0, routed - slots)
    one_choice = max(0, routed - moe.capacity(tokens, experts, 1, capacity_factor))
    rounded_down = max(0, routed - math.floor(capacity_factor * top_k * tokens / experts))
    return _judge(answer, expected, f"{expected}: the expert has ⌈{capacity_factor} · {top_k} · {tokens} / "
                  f"{experts}⌉ = {slots} slots, and {routed} choices want one; the rest are dropped.", [
                      (one_choice, f"that leaves k out of the capacity: with top-{top_k} every token makes {top_k} "
                                   f"choices, and capacity = ⌈factor · k · tokens / E⌉ = {slots}."),
                      (max(0, routed - top_k * tokens // experts), "that ignores the capacity factor: an expert "
                                                                   "gets factor · k · tokens / E slots."),
                      (max(0, routed - tokens // experts), "that ignores the capacity factor and k: an expert gets "
                                                           "factor · k · tokens / E slots, not tokens / E."),
                      (rounded_down, "capacity rounds up to a whole number of slots: ⌈…⌉, not ⌊…⌋."),
                      (slots, "that is the number of slots; the question asks how many choices find none."),
                      (routed, "the expert takes its first `capacity` choices; only the rest are dropped.")],
                  ". capacity = ⌈capacity factor · k · tokens per group / experts⌉; an expert drops what is "
                  "routed to it beyond that.")


def dtensor_gather_bytes(answer: Any, n: int, rows: int, cols: int, itemsize: int = 4) -> Feedback:
    """Lesson 15, exercise 1: bytes each device sends when DTensor, on CPUs, gathers a tensor split n ways."""
    early, answer = _read_number(answer, "set `answer` to a number of bytes.", "a number of bytes")
    if early is not None:
        return early
    whole = rows * cols * itemsize
    expected = 2 * (n - 1) / n * whole
    return _judge(answer, expected, f"{expected:,.0f} bytes: by default (CPUs and GPUs) DTensor puts each device's "
                  f"share into a zero-filled "
                  f"copy of the whole tensor ({whole:,} bytes) and all-reduces it, and a ring all-reduce sends "
                  f"2(N−1)/N of it: twice what a ring all-gather would.", [
                      ((n - 1) / n * whole, "that is a ring all-gather's bytes, (N−1)/N of the whole. Look again at "
                                            "the op section 3 found: DTensor gathers with an all-reduce here."),
                      (whole, "that is the whole tensor's size; a ring all-reduce sends 2(N−1)/N of what each "
                              "device puts in."),
                      (whole / n, "that is one device's share; what goes into the all-reduce is the zero-padded "
                                  "whole tensor."),
                      (2 * (n - 1) * whole, "that multiplies by N − 1 where a ring all-reduce sends 2(N−1)/N of "
                                            "the tensor: each of its 2(N−1) steps sends one chunk, 1/N of it.")],
                  ". Each device all-reduces a zero-filled tensor of the whole shape; a ring all-reduce of S bytes "
                  "sends 2(N−1)/N · S per device.", rel_tol=1e-9)


def megatron_layouts(answer: Any) -> Feedback:
    """Lesson 15, exercise 2: the layouts of a transformer block's weights for Megatron's tensor parallelism."""
    from mgpu_edu.parallelism.meshes import MEGATRON, TENSOR

    if _unsolved(answer):
        return _report("unsolved", "set `answer` to a dict of weight name → axes, e.g. {'wq': (None, 'model'), …}.")
    if not isinstance(answer, dict):
        return _report("wrong", f"expected a dict of weight name → axes, got {type(answer).__name__} {answer!r}.")
    why = {"wq": "each device computes its own heads, so it needs all rows of wq and some columns",
           "wk": "keys, like queries, are computed head by head: split the columns",
           "wv": "values, like queries, are computed head by head: split the columns",
           "wo": "each device holds some heads' outputs, which meet the rows of wo for those heads: split the "
                 "rows, and one all-reduce sums the partial results",
           "w1": "the MLP's first matrix is split by columns, so GELU runs on each device's columns alone",
           "b1": "b1 adds to the columns of x·w1 each device holds: split it like those columns",
           "w2": "w2's rows meet the columns of w1 each device holds: split the rows, then one all-reduce"}
    for name, axes in answer.items():
        if isinstance(axes, str):
            return _report("wrong", f"{name} → {axes!r} is a string, not a tuple: in Python ({axes!r}) is just "
                                    f"{axes!r}. Write one entry per dimension, with a comma for one: ({axes!r},).")
    def spelled(axes: Any) -> Any:  # DTensor's own spelling, "unsharded", means None
        return tuple(None if a == "unsharded" else a for a in axes) if isinstance(axes, (list, tuple)) else axes

    for name, axes in MEGATRON.items():
        if name not in answer:
            return _report("wrong", f"{name} is missing; {why[name]}: {name} → {axes}.")
        got = spelled(answer[name])
        renamed = tuple(a if a is None else TENSOR for a in got) if isinstance(got, (list, tuple)) else got
        if got != axes and renamed == axes:
            other = next(a for a in got if a is not None and a != TENSOR)
            return _report("wrong", f"{name} → {got!r} splits the right dimension, along an axis named {other!r}: "
                                    f"the mesh's tensor axis is named {TENSOR!r} (meshes.TENSOR).")
        if got != axes:
            return _report("wrong", f"{name} → {got!r} is not it: {why[name]}.")
    for name, axes in answer.items():
        if name in MEGATRON:
            continue
        if not isinstance(axes, (list, tuple)) or any(a is not None for a in spelled(axes)):
            return _report("wrong", f"{name} → {axes!r}: every weight outside the split matrices (LayerNorms, the "
                                    "output biases bo and b2, embeddings, head) is held whole by each device, "
                                    "(None,) per dimension; or leave it out of the dict.")
    return _report("correct", f"the {len(MEGATRON)} split weights are Megatron's: queries, keys, values and w1 (with "
                              f"b1) by columns, wo and w2 by rows, along {TENSOR!r}; DTensor inserts the all-reduces "
                              "after wo and w2 that lesson 13 wrote by hand.")


def planner_puzzle(answer: Any, puzzle: str) -> Feedback:
    """Lesson 16's puzzles: a ``planner.Layout`` that solves ``puzzle`` (a key of ``planner.PUZZLES``)."""
    from mgpu_edu.analysis import planner

    if _unsolved(answer):
        return _report("unsolved", "set `answer` to a planner.Layout(data=…, tensor=…, pipeline=…, …).")
    model, cluster, global_batch, max_sent = planner.PUZZLES[puzzle]
    problem = planner.judge(puzzle, answer)
    if problem:
        label = answer.describe() if isinstance(answer, planner.Layout) else repr(answer)
        return _report("wrong", f"{label}: {problem}")
    p = planner.predict(model, answer, cluster, **planner.PUZZLE_OPTIONS.get(puzzle, {}))
    limit = "" if max_sent is None else f" (at most {max_sent / 1e9:,.0f} GB allowed)"
    return _report("correct", f"{answer.describe()}: {p.held_total / 2**30:,.1f} GiB on the fullest device, "
                              f"{p.sent_total / 1e9:,.1f} GB sent per step by the busiest{limit}, about "
                              f"{p.seconds:,.1f} s a step by the cost model.")


def mfu_from_throughput(answer: Any, tokens_per_second: float, devices: int, peak_flops: float) -> Feedback:
    """Lesson 17, exercise 1: the MFU of GPT-3 175B (``planner.PUBLISHED``'s shape, 2,048 tokens, a vocabulary of
    51,200) trained at ``tokens_per_second`` on ``devices`` devices of ``peak_flops`` FLOP/s each."""
    from mgpu_edu.analysis import costmodel, planner

    early, answer = _read_number(answer, "set `answer` to the MFU, a fraction such as 0.5.", "a fraction")
    if early is not None:
        return early
    model = planner.PUBLISHED["GPT-3 175B on 64 A100s (Megatron-LM)"].model
    expected = costmodel.mfu(model, tokens_per_second, devices, peak_flops)
    hardware = costmodel.transformer_flops(model, "full").total * tokens_per_second / (devices * peak_flops)
    six = 6 * model.params * tokens_per_second / (devices * peak_flops)
    return _judge(answer, expected, f"{expected:.1%}: the model's own FLOPs per second over the GPUs' peak, so runs "
                  "with and without recomputation compare fairly.", [
                      (hardware, "that counts the forward pass that recomputation runs again (the paper's Eq. 3, "
                                 "its 140 TFLOP/s): that is hardware FLOPs. MFU counts the model's FLOPs alone: "
                                 "costmodel.transformer_flops(model) without recomputation."),
                      (six, "6 FLOPs per parameter and token leave out attention's scores and weighted sum "
                            "(4·s·h per layer forward): costmodel.transformer_flops counts them."),
                      ((100 * expected, 100 * hardware), "write it as a fraction (0.5 for 50 %), not a percentage.")],
                  ": MFU = model FLOPs per token × tokens per second ÷ (devices × peak FLOP/s).", rel_tol=2e-3)



def fsdp_tokens(answer: Any, device: str = "H100", n: int = 8) -> Feedback:
    """Lesson 18, exercise 1: the tokens per device below which FSDP over ``n`` devices of ``device``
    (``roofline.DEVICES``, inside one node) is communication-bound, by lesson 03's α-β model with α = 0."""
    from mgpu_edu.analysis import roofline

    early, answer = _read_number(answer, "set `answer` to a number of tokens per device.", "a number of tokens")
    if early is not None:
        return early
    spec = roofline.DEVICES[device]
    expected = roofline.data_parallel_tokens(spec, n)
    ratio = spec.flops / spec.intra_bandwidth
    return _judge(answer, expected, f"{expected:,.0f} tokens: FSDP computes 6·b·D·F per weight matrix while two "
                  f"all-gathers and a reduce-scatter send 3 · (N − 1)/N · 2·D·F bytes, so the two take as long "
                  f"when b = (N − 1)/N · C/W = {n - 1}/{n} · {ratio:,.0f}: the same threshold as data parallelism.", [
                      (ratio, f"that is C/W alone, the limit for many devices; with {n}, each sends (N − 1)/N of "
                              "what it gathers: multiply by that."),
                      (ratio * (n - 1) / n / 3, "that sets the forward and backward passes' 6·b·D·F against one "
                                                "collective: FSDP runs three, two all-gathers of the weights "
                                                "and a reduce-scatter of the gradient."),
                      (ratio * (n - 1) / n * 3 / 2, "that counts FSDP's three collectives but only the backward "
                                                    "pass's 4·b·D·F: the forward pass's 2·b·D·F hides them too."),
                      (ratio * (n - 1) / n * 2, "that compares the gradient's all-reduce with the weights' "
                                                "bytes at 4 bytes a value, or the compute at half: both are "
                                                "16-bit, 2 bytes a value, and 2 FLOPs a multiply-add."),
                      (spec.flops / spec.inter_bandwidth * (n - 1) / n, "that uses the network between nodes; "
                                                                        "the question's 8 GPUs share one node's "
                                                                        "NVLink.")],
                  ": set the compute time 6·b·D·F / C equal to the collectives' 3 · (N − 1)/N · 2·D·F / W and "
                  "solve for b.", rel_tol=2e-3)


def zero_bubble(answer: Any, stages: int, micro_batches: int) -> Feedback:
    """Lesson 18, exercise 2: the bubble of the ZB-H1 schedule as a share of the ideal time, with equal forward,
    input-gradient and weight-gradient passes (Qi et al., Table 2), counted from the schedule the pipeline module
    builds."""
    from mgpu_edu.parallelism import pipeline

    early, answer = _read_number(answer, "set `answer` to the bubble, a fraction of the ideal time.", "a fraction")
    if early is not None:
        return early
    p, m = stages, micro_batches
    expected = pipeline.zero_bubble_ratio(p, m)
    one_f_one_b = pipeline.zero_bubble_ratio(p, m, split=False)
    return _judge(answer, expected, f"{expected:.4g}: (P − 1)(T_F + T_B − T_W) over M(T_F + T_B + T_W) = "
                  f"{p - 1}/{3 * m}, a third of 1F1B's {one_f_one_b:.4g}: each W fills a slot where a stage "
                  "would have waited.", [
                      (one_f_one_b, "that is 1F1B's bubble, (P − 1)/M: the weight gradients still run right after "
                                    "their input gradients. ZB-H1 moves them into the waits."),
                      (0.0, "that is ZB-H2's aim, with 2P − 1 micro-batches in flight; ZB-H1 keeps 1F1B's peak "
                            "memory, P micro-batches', and a third of its bubble."),
                      ((p - 1) / (3 * m + p - 1), "that is the share of the whole run (ideal plus bubble); the "
                                                  "question asks for a share of the ideal time, 3M slots.")],
                  ": with unit passes the ideal time is 3M slots a stage, and ZB-H1 adds P − 1.", rel_tol=1e-6)
