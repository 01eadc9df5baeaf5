"""Data parallelism by hand: split a batch over devices, one tower per device, combine gradients.

This is what ``tf.distribute.MirroredStrategy`` does for you, written out so each step can be
seen and checked. Every function works on any list of device names, so on a machine with no
GPU it runs on the logical CPUs that :func:`mgpu_edu.setup_devices` made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from mgpu_edu._validate import BadArgument, one_of, whole_number
from mgpu_edu.runtime import quiet


def _device_list(devices: Sequence[str]) -> list[str]:
    """devices as a list, or BadArgument when there are none (naming ``devices``, the caller's argument)."""
    devices = list(devices)
    if not devices:
        raise BadArgument("devices is empty: pass the device names to use, e.g. mgpu_edu.logical_devices(4).")
    return devices


def _check_count(n: object, what: str = "n") -> int:
    return whole_number(what, n, example=4, hint="It is the number of shards: pass the number of devices.")


def shard_sizes(batch: int, n: int) -> list[int]:
    """Sizes of n shards of a batch: they differ by at most 1, larger shards first.

    Example:
        >>> shard_sizes(10, 4)
        [3, 3, 2, 2]
        >>> shard_sizes(2, 4)  # fewer examples than devices: the last shards are empty
        [1, 1, 0, 0]
    """
    n = _check_count(n)
    whole_number("batch", batch, minimum=0, hint="It is the number of examples in the batch.")
    base, extra = divmod(batch, n)
    return [base + 1 if i < extra else base for i in range(n)]


def split_batch(x: Any, n: int) -> list[Any]:
    """Split a tensor or array into n shards along axis 0 (sizes differ by at most 1).

    Concatenating the shards gives x back in order. A batch smaller than n leaves the
    trailing shards empty. NumPy arrays give NumPy shards; TensorFlow tensors give tensors
    (this also works inside ``tf.function``, where the batch size may be unknown).

    Example:
        >>> import numpy as np
        >>> [s.tolist() for s in split_batch(np.arange(5), 3)]
        [[0, 1], [2, 3], [4]]
    """
    n = _check_count(n)
    if hasattr(x, "numpy") or type(x).__module__.startswith("tensorflow"):
        tf = quiet.import_tensorflow()
        batch = tf.shape(x)[0]
        base, extra = batch // n, batch % n
        sizes = [base + tf.cast(i < extra, batch.dtype) for i in range(n)]
        return tf.split(x, tf.stack(sizes), num=n, axis=0)
    import numpy as np

    array = np.asarray(x)
    if array.ndim == 0:
        raise ValueError(f"split_batch needs a batch (at least 1 dimension), got a scalar {x!r}.")
    bounds = np.cumsum(shard_sizes(len(array), n))[:-1]
    return np.split(array, bounds)


class Tower(NamedTuple):
    """What one device computed: its share of the batch and the gradient of its summed loss."""

    device: str
    examples: Any
    loss_sum: Any
    grads: list[Any]
    outputs: Any


def tower_gradients(model: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any,
                    devices: Sequence[str]) -> list[Tower]:
    """Run one tower per device: forward and backward on that device's shard of (x, y).

    Each tower returns the gradient of the *sum* of its per-example losses, so towers
    with different shard sizes can be combined exactly (see :func:`combine_towers`).
    With no GPU the towers run on logical CPUs: the same placement, shared cores.

    Example:
        >>> towers = tower_gradients(model, loss_fn, x, y, ["/device:CPU:0", "/device:CPU:1"])  # doctest: +SKIP
        >>> [int(t.examples) for t in towers]  # doctest: +SKIP
        [5, 4]
    """
    tf = quiet.import_tensorflow()
    devices = _device_list(devices)
    towers = []
    for device, xs, ys in zip(devices, split_batch(x, len(devices)), split_batch(y, len(devices)), strict=True):
        with tf.device(device):
            with tf.GradientTape() as tape:
                outputs = model(xs, training=True)
                loss_sum = tf.reduce_sum(loss_fn(ys, outputs))
            grads = tape.gradient(loss_sum, model.trainable_variables)
            grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, model.trainable_variables,
                                                                            strict=True)]
            towers.append(Tower(device, tf.shape(xs)[0], loss_sum, grads, outputs))
    return towers


def combine_towers(towers: Sequence[Tower], weighting: str = "examples", device: str | None = None) -> list[Any]:
    """Combine the towers' gradients into the gradient of the whole batch's mean loss.

    weighting="examples" (right): add the towers' summed gradients, divide by the total
    number of examples. weighting="mean_of_means" is the common mistake, kept here so the
    lessons can show it: it averages each tower's mean gradient, which over-weights the
    examples in smaller shards whenever the shards differ in size, and gives NaN when a
    shard is empty (its mean is 0/0).

    The sum runs on ``device`` (default: the first tower's device).
    """
    tf = quiet.import_tensorflow()
    one_of("weighting", weighting, ("examples", "mean_of_means"), hint="'examples' is right; the other, the mistake.")
    if not towers:
        raise BadArgument("towers is empty: pass what tower_gradients returned, one tower per device.")
    with tf.device(device or towers[0].device):
        if weighting == "examples":
            total = tf.cast(tf.add_n([t.examples for t in towers]), towers[0].grads[0].dtype)
            return [tf.add_n(list(parts)) / total for parts in zip(*(t.grads for t in towers), strict=True)]
        means = [[g / tf.cast(t.examples, g.dtype) for g in t.grads] for t in towers]
        return [tf.add_n(list(parts)) / len(towers) for parts in zip(*means, strict=True)]


def data_parallel_gradients(model: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any,
                            devices: Sequence[str]) -> list[Any]:
    """Gradients of the whole batch's mean loss, computed with one tower per device.

    ``loss_fn(y_true, y_pred)`` must return per-example losses (shape ``[batch]``). The
    result equals the single-device gradient of ``mean(loss_fn(y, model(x)))``, also for
    uneven and empty shards. No GPU: the towers run on logical CPUs.

    Example:
        >>> grads = data_parallel_gradients(model, loss_fn, x, y, logical_devices(3))  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    batch = x.shape[0] if getattr(x, "shape", None) is not None else None
    if batch is not None and not isinstance(batch, int):
        batch = None
    if batch == 0 or (batch is None and int(tf.shape(x)[0]) == 0):
        raise ValueError("data_parallel_gradients got an empty batch (0 examples): there is no mean loss to "
                         "differentiate. Pass at least one example.")
    return combine_towers(tower_gradients(model, loss_fn, x, y, devices))


def data_parallel_step(model: Any, optimizer: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any,
                       devices: Sequence[str]) -> tuple[Any, Any]:
    """One training step by hand: split, towers, combine, one update; returns (mean loss, outputs).

    The outputs are the towers' outputs concatenated back in the batch's original order.
    """
    tf = quiet.import_tensorflow()
    towers = tower_gradients(model, loss_fn, x, y, devices)
    grads = combine_towers(towers)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    with tf.device(towers[0].device):
        total = tf.cast(tf.add_n([t.examples for t in towers]), towers[0].loss_sum.dtype)
        loss = tf.add_n([t.loss_sum for t in towers]) / total
        outputs = tf.concat([t.outputs for t in towers], axis=0)
    return loss, outputs


def data_parallel_predict(model: Any, x: Any, devices: Sequence[str]) -> Any:
    """Forward pass only, one tower per device; outputs concatenated in the batch's order.

    Works with any number of devices, one included, so a model trained on N devices can
    predict on fewer, or on the CPU alone.
    """
    tf = quiet.import_tensorflow()
    devices = _device_list(devices)
    outputs = []
    for device, xs in zip(devices, split_batch(x, len(devices)), strict=True):
        with tf.device(device):
            outputs.append(model(xs, training=False))
    with tf.device(devices[0]):
        return tf.concat(outputs, axis=0)


class Span(NamedTuple):
    """One device's work in a timeline: seconds from the start of the call."""

    device: str
    start: float
    end: float


def timed_on_devices(work: Callable[[Any], Any], shards: Sequence[Any], devices: Sequence[str],
                     graph: bool = False) -> tuple[list[Any], list[Span]]:
    """Run ``work(shard)`` for each shard on its device; return the outputs and when each ran.

    The times come from ``tf.timestamp()`` ops placed before and after each device's work:
    host clock readings. On CPUs every operation runs to completion where it stands, so the
    spans are when the work ran, in eager mode (one device after another) and in a graph
    (graph=True: TensorFlow may run independent work at the same time). On a GPU, kernels run
    asynchronously: a timestamp can be taken before the GPU finishes the work it follows, so
    the spans show when work was handed to each device; use the profiler for the device side.
    The loop over devices is a Python loop, unrolled when the graph is built, so a Python list
    collects the outputs (a ``tf.TensorArray`` is needed only in a loop TensorFlow runs itself).
    With no GPU this shows logical CPUs, which share the machine's cores.
    """
    tf = quiet.import_tensorflow()
    devices = _device_list(devices)
    if len(shards) != len(devices):
        raise ValueError(f"got {len(shards)} shards for {len(devices)} devices: pass one shard per device.")
    run = timestamped(work, devices)
    if graph:
        # tf.function would keep stateful ops such as tf.timestamp in program order, which
        # serialises the very timeline we want to see; wrap_function builds the same graph
        # without that ordering, so only the data dependencies order the work.
        runner = tf.compat.v1.wrap_function(run, [tf.TensorSpec.from_tensor(s) for s in shards])
        runner(*shards)  # warm up, so the timeline shows running, not first-call set-up
    else:
        runner = run
    t0 = time.time()
    results, stamps = runner(*shards)
    stamps = stamps.numpy() - t0
    spans = [Span(d, float(s), float(e)) for d, (s, e) in zip(devices, stamps, strict=True)]
    return results, spans


def timestamped(work: Callable[[Any], Any], devices: list[str]) -> Callable[..., tuple[Any, Any]]:
    """What :func:`timed_on_devices` runs: a function of one shard per device that runs ``work`` on each shard
    on its device between two ``tf.timestamp()`` ops, and returns the outputs and the [start, end] stamps."""
    tf = quiet.import_tensorflow()

    def run(*inputs: Any) -> tuple[Any, Any]:
        outputs, stamps = [], []
        for device, shard in zip(devices, inputs, strict=True):  # a Python loop: unrolled, one copy per device
            with tf.device(device):
                start = tf.timestamp()
                with tf.control_dependencies([start]):
                    result = work(tf.identity(shard))
                with tf.control_dependencies([result]):
                    end = tf.timestamp()
            outputs.append(tf.cast(result, tf.float32))
            stamps.append(tf.stack([start, end]))
        return outputs, tf.stack(stamps)
    return run


def waits_between_devices(work: Callable[[Any], Any], shards: Sequence[Any], devices: Sequence[str],
                          builder: str = "wrap_function") -> int:
    """How many devices' work must wait for another device's, in the graph :func:`timed_on_devices` runs.

    Traces it (nothing runs) with ``builder``: ``"wrap_function"``, as ``timed_on_devices(graph=True)`` does,
    or ``"tf.function"``, which keeps stateful ops such as ``tf.timestamp`` in program order. Counts the devices
    whose first timestamp has, among the ops it waits for (its inputs and control inputs, and theirs), an op
    placed on another device.

    Example (four devices):
        >>> [waits_between_devices(work, shards, layout, b) for b in ("wrap_function", "tf.function")]  # doctest: +SKIP
        [0, 3]
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.analysis import graphs

    one_of("builder", builder, ("wrap_function", "tf.function"))
    devices = _device_list(devices)
    specs = [tf.TensorSpec.from_tensor(s) for s in shards]
    run = timestamped(work, devices)
    if builder == "tf.function":
        ops = tf.function(run).get_concrete_function(*specs).graph.get_operations()
    else:
        ops = tf.compat.v1.wrap_function(run, specs).graph.get_operations()
    starts = [op for op in ops if op.type == "Timestamp"][::2]  # each device's first
    return sum(any(op.device and op.device != start.device for op in graphs.feeding(start.outputs, set()))
               for start in starts)


def overlap_fraction(spans: Sequence[Span]) -> float:
    """How much of the busiest stretch had two or more devices working: 0 = strictly one after another.

    Example:
        >>> overlap_fraction([Span("a", 0, 1), Span("b", 1, 2)])
        0.0
        >>> overlap_fraction([Span("a", 0, 2), Span("b", 0, 2)])
        1.0
    """
    points = sorted({p for s in spans for p in (s.start, s.end)})
    busy = both = 0.0
    for left, right in zip(points, points[1:], strict=False):
        active = sum(1 for s in spans if s.start <= left and s.end >= right)
        busy += (right - left) if active else 0.0
        both += (right - left) if active >= 2 else 0.0
    return both / busy if busy else 0.0
