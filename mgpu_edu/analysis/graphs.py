"""Counting in TensorFlow's own graph: what the backward pass keeps, and what crosses devices.

:mod:`memory` says what a layer *should* keep for the backward pass, by formula. This module asks
TensorFlow: :func:`kept_for_backward` traces a forward and a backward pass as one ``tf.function``
and lists every tensor that the backward ops computing the returned gradients read from the forward
pass. Those tensors must stay in memory from the moment the forward pass makes them until their
gradient is computed: they are the activations of a traced training step, counted one tensor at a
time, on the device TensorFlow places them, with the name scopes they were made in. Weights
(variable reads), constants and the function's inputs are not activations and are left out; so are
reads of a tensor's shape only, and backward ops whose results no returned gradient uses (the
gradient of a constant, which TensorFlow builds and then drops). Run eagerly, a ``tf.GradientTape``
keeps more than this: every input and output of a recorded op that its gradient function might read.

:func:`bytes_between_devices` counts, in the same kind of graph, the bytes each device receives from
another: each tensor made on one device and read on another is copied there once; so is a
variable's or a captured tensor's value read on a device other than its own. Tracing costs far more
than reading: :func:`trace` traces a step once, and :func:`kept_in` and :func:`received_in` read it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from mgpu_edu.runtime import quiet

#: Ops whose outputs are not activations: inputs, constants and weights (a variable's value is counted as a
#: parameter, not an activation).
NOT_ACTIVATIONS = frozenset({"Placeholder", "Const", "ReadVariableOp", "VarHandleOp"})
#: Backward ops that read only a tensor's shape, not its values: the tensor need not stay in memory for them.
SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "BroadcastGradientArgs"})


@dataclasses.dataclass(frozen=True)
class Kept:
    """One forward tensor the backward pass reads."""

    name: str  #: the tensor's name, its name scopes first: "block0/split/Softmax:0"
    op: str  #: the type of the op that made it: "Softmax"
    device: str  #: where it was placed, short: "CPU:1", "GPU:0" ("" when TensorFlow chooses)
    shape: tuple[int, ...]
    nbytes: int
    read_by: tuple[str, ...]  #: the types of the backward ops that read it

    def scopes(self) -> list[str]:
        """Its name scopes, outermost first, without the "_1", "_2" TensorFlow adds to a scope entered again."""
        out = []
        for part in self.name.split("/")[:-1]:
            head, _, tail = part.rpartition("_")
            out.append(head if head and tail.isdigit() else part)
        return out

    def scope(self, level: int = 0) -> str:
        """Its ``level``-th name scope ("block0" at 0, "split" at 1), or "" if it has fewer."""
        scopes = self.scopes()
        return scopes[level] if level < len(scopes) else ""


def short_device(device: str) -> str:
    """"CPU:1" for "/job:localhost/replica:0/task:0/device:CPU:1" (or "/device:CPU:1"); "" for ""."""
    tf = quiet.import_tensorflow()
    if not device:
        return ""
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index}"


def _nbytes(tensor: Any) -> int:
    if not tensor.shape.is_fully_defined():
        raise ValueError(f"{tensor.name} has shape {tensor.shape}, not fully known when traced: give the traced "
                         "function inputs of fixed shapes (a tf.TensorSpec with every dimension, or real tensors).")
    return tensor.shape.num_elements() * tensor.dtype.size


def kept_for_backward(forward: Callable[..., Any], backward: Callable[[Any], Any], *inputs: Any) -> list[Kept]:
    """Every tensor the backward pass reads from the forward pass, traced by TensorFlow.

    ``forward(*inputs)`` runs the forward pass (recording tapes) and returns what ``backward`` needs;
    ``backward(that)`` computes the gradients. Both are traced together as one ``tf.function``
    (nothing runs), and each forward tensor a backward op reads is listed once, with its device
    and bytes. Variables must exist before the call.

    The function's inputs are not counted either: they exist whatever the backward pass needs.

    Example (the input x, which w's gradient reads, is an input; ReLU's gradient reads its output):
        >>> w = tf.Variable(tf.ones([4, 3]))  # doctest: +SKIP
        >>> def forward(x):  # doctest: +SKIP
        ...     with tf.GradientTape() as tape:
        ...         loss = tf.reduce_sum(tf.nn.relu(x @ w))
        ...     return tape, loss
        >>> kept = kept_for_backward(forward, lambda r: r[0].gradient(r[1], w), tf.ones([8, 4]))  # doctest: +SKIP
        >>> [(k.op, k.shape, k.nbytes, k.read_by) for k in kept]  # doctest: +SKIP
        [('Relu', (8, 3), 96, ('ReluGrad',))]
    """
    return kept_in(trace(forward, backward, *inputs))


@dataclasses.dataclass(frozen=True)
class Traced:
    """A forward and a backward pass traced by TensorFlow as one ``tf.function`` (nothing ran): the graph's ops in
    the order they were made, those the forward pass made, the gradients (symbolic tensors of that graph), and the
    device of each value the function captured from outside (variables and tensors), by the inside tensor's ref."""

    ops: list[Any]
    made: set[Any]
    gradients: Any
    captured_on: dict[Any, str]


def trace(forward: Callable[..., Any], backward: Callable[[Any], Any], *inputs: Any) -> Traced:
    """Trace ``backward(forward(*inputs))`` as one ``tf.function`` (nothing runs), to read with :func:`kept_in` and
    :func:`received_in`: one trace answers both."""
    tf = quiet.import_tensorflow()
    seen: dict[str, Any] = {}

    @tf.function(autograph=False)
    def step(*args: Any) -> Any:
        graph = tf.compat.v1.get_default_graph()
        result = forward(*args)
        seen["made"] = set(graph.get_operations())
        seen["gradients"] = backward(result)
        seen["ops"] = list(graph.get_operations())  # before tf.function adds the outputs' identities
        seen["captured_on"] = {inside.ref(): short_device(getattr(value, "device", "") or "")
                               for value, inside in graph.captures}  # each captured tensor's (or variable's) device
        return seen["gradients"]

    step.get_concrete_function(*inputs)
    return Traced(seen["ops"], seen["made"], seen["gradients"], seen["captured_on"])


def kept_in(traced: Traced) -> list[Kept]:
    """What :func:`kept_for_backward` returns, read from a step already traced (:func:`trace`)."""
    live = feeding(traced.gradients, traced.made)
    readers: dict[str, list[str]] = collections.defaultdict(list)
    tensors: dict[str, Any] = {}
    for op in traced.ops:
        if op not in live or op.type in SHAPE_ONLY:
            continue
        for tensor in op.inputs:
            if tensor.op in traced.made and tensor.op.type not in NOT_ACTIVATIONS:
                tensors[tensor.name] = tensor
                readers[tensor.name].append(op.type)
    return [Kept(name, tensor.op.type, short_device(tensor.op.device), tuple(tensor.shape.as_list()), _nbytes(tensor),
                 tuple(sorted(set(readers[name])))) for name, tensor in tensors.items()]


def feeding(outputs: Any, made: set[Any]) -> set[Any]:
    """The ops ``outputs`` depend on (their inputs and control inputs, and theirs), their own ops included, that
    are not in ``made``: with a traced step's forward ops as ``made``, the backward ops they wait for."""
    tf = quiet.import_tensorflow()
    live: set[Any] = set()
    stack = [x.op for x in tf.nest.flatten(outputs, expand_composites=True) if x is not None]
    while stack:
        op = stack.pop()
        if op in live or op in made:
            continue
        live.add(op)
        stack.extend([*(x.op for x in op.inputs), *op.control_inputs])
    return live


def op_devices(forward: Callable[..., Any], backward: Callable[[Any], Any], *inputs: Any,
               scope: str | None = None) -> dict[str, dict[str, int]]:
    """Where the ops of a traced forward and backward pass ask to run: {"forward": {device: ops},
    "backward": {device: ops}}, "" for an op that names no device (TensorFlow then places it itself).
    Constants and inputs are not counted; with ``scope``, only ops made under a name scope of that name
    (at any depth, "_1", "_2" ignored)."""
    traced = trace(forward, backward, *inputs)
    counts: dict[str, dict[str, int]] = {"forward": collections.Counter(), "backward": collections.Counter()}
    for op in traced.ops:
        if scope is not None and scope not in {part.rpartition("_")[0] if part.rpartition("_")[2].isdigit() else part
                                               for part in op.name.split("/")[:-1]}:
            continue
        if op.type not in ("Const", "Placeholder"):
            counts["forward" if op in traced.made else "backward"][short_device(op.device)] += 1
    return {phase: dict(sorted(c.items())) for phase, c in counts.items()}


def by_device(kept: Iterable[Kept], scope: str | None = None) -> dict[str, int]:
    """Bytes kept per device (only tensors made under the name scope ``scope``, if given, e.g. "block0")."""
    totals: dict[str, int] = collections.defaultdict(int)
    for item in kept:
        if scope is None or item.scope(0) == scope:
            totals[item.device] += item.nbytes
    return dict(sorted(totals.items()))


def bytes_between_devices(fn: Callable[..., Any], *inputs: Any) -> dict[str, int]:
    """Bytes each device receives from other devices when ``fn(*inputs)`` runs, traced as one ``tf.function``.

    A tensor made on one device and read by ops on another is copied there once. A captured tensor
    or variable (one made outside ``fn``) lives on its own device: read elsewhere, its value is
    copied too. The function's inputs, whose device TensorFlow chooses, are not counted. Returns
    {device: bytes received}, devices short ("CPU:1").
    """
    return received_in(trace(fn, lambda result: result, *inputs))


def received_in(traced: Traced) -> dict[str, int]:
    """What :func:`bytes_between_devices` returns, read from a step already traced (:func:`trace`): every op of
    the forward and the backward pass counts."""
    tf = quiet.import_tensorflow()
    received: dict[str, int] = collections.defaultdict(int)

    def home(tensor: Any) -> str:
        if tensor.ref() in traced.captured_on:
            return traced.captured_on[tensor.ref()]
        if tensor.op.type == "ReadVariableOp" and not tensor.op.device:  # read where the variable lives
            return home(tensor.op.inputs[0])
        return short_device(tensor.op.device)

    copies: set[tuple[str, str]] = set()
    for op in traced.ops:
        there = short_device(op.device) if op.device or op.type != "ReadVariableOp" else home(op.inputs[0])
        for tensor in op.inputs:
            here = home(tensor)
            if here and there and here != there and tensor.dtype != tf.resource and (tensor.name, there) not in copies:
                copies.add((tensor.name, there))
                received[there] += _nbytes(tensor)
    return dict(sorted(received.items()))
