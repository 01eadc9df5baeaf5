"""Model parallelism: split a model's layers over devices, pipeline micro-batches, split a layer.

- :class:`StagedModel` places consecutive blocks of a model on different devices (a layer
  split) and runs forward and backward one stage at a time, so each stage's work can be timed.
- :func:`gpipe_schedule` and :func:`bubble_fraction`: the ideal GPipe schedule and its idle time.
- :func:`run_pipeline` runs a schedule for real, one thread per stage, and measures it.
- :func:`column_parallel_dense` and :func:`row_parallel_dense`: one Dense layer split across
  devices (tensor parallelism).
- :func:`parallelism_costs`: memory per device and bytes moved per step, for each strategy.

Everything runs on logical CPUs when there is no GPU; the timings then share the same cores.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from mgpu_edu import quiet
from mgpu_edu._validate import whole_number
from mgpu_edu.parallel import shard_sizes


class Event(NamedTuple):
    """One slot of a pipeline schedule: a stage runs a micro-batch's forward ("F") or backward ("B")."""

    stage: int
    micro_batch: int
    phase: str
    start: float
    end: float


def _count(name: str, value: Any) -> int:
    return whole_number(name, value, example=4)


def gpipe_schedule(stages: int, micro_batches: int) -> list[Event]:
    """The ideal GPipe schedule with unit-time slots: all forwards, then all backwards.

    Micro-batch m's forward on stage s runs in slot s + m (after stage s − 1 finished it);
    backwards run in reverse stage order once every forward is done. Each stage runs one
    event at a time. Pure arithmetic: no TensorFlow, no devices.

    Example:
        >>> [(e.stage, e.micro_batch, e.phase, e.start) for e in gpipe_schedule(2, 2)][:4]
        [(0, 0, 'F', 0), (0, 1, 'F', 1), (1, 0, 'F', 1), (1, 1, 'F', 2)]
        >>> max(e.end for e in gpipe_schedule(2, 2))  # 2 (M + P − 1) slots
        6
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    forward_end = m + p - 1
    events = [Event(s, i, "F", s + i, s + i + 1) for s in range(p) for i in range(m)]
    events += [Event(s, i, "B", forward_end + (p - 1 - s) + i, forward_end + (p - 1 - s) + i + 1)
               for s in reversed(range(p)) for i in range(m)]
    return sorted(events, key=lambda e: (e.phase == "B", e.start, e.stage if e.phase == "F" else -e.stage))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Share of stage-time the GPipe schedule leaves idle: (P − 1) / (M + P − 1).

    Example:
        >>> bubble_fraction(4, 1), bubble_fraction(4, 8)
        (0.75, 0.2727272727272727)
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    return (p - 1) / (m + p - 1)


def idle_fraction(events: Sequence[Event]) -> float:
    """Idle share of a schedule computed from its events: 1 − busy ÷ (stages × makespan)."""
    stages = {e.stage for e in events}
    start, end = min(e.start for e in events), max(e.end for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1 - busy / (len(stages) * (end - start))


def micro_batches_for_bubble(stages: int, target: float) -> int:
    """The fewest micro-batches that bring the bubble of a P-stage pipeline under target.

    Example:
        >>> micro_batches_for_bubble(4, 0.10)
        28
    """
    p = _count("stages", stages)
    if not 0 < target < 1:
        raise ValueError(f"target={target!r} must be a fraction between 0 and 1, e.g. 0.1 for 10 %.")
    m = 1
    while bubble_fraction(p, m) >= target:
        m += 1
    return m


# ----------------------------------------------------------------------------- layer split


class StagedModel:
    """Consecutive blocks of a model, block s placed on device s (a layer split).

    Each block's variables are created on its device; :meth:`forward` and :meth:`backward`
    run one stage at a time, so a caller (or :func:`run_pipeline`) can time each stage's work.
    ``widths`` are the layer sizes: widths[0] inputs, then each Dense layer's units; the
    layers are dealt out to the stages in order.
    """

    def __init__(self, widths: Sequence[int], devices: Sequence[str], classes: int, seed: int = 0) -> None:
        tf = quiet.import_tensorflow()
        import keras

        self.devices = list(devices)
        layers_per_stage = _deal(len(widths) - 1, len(self.devices))
        keras.utils.set_random_seed(seed)
        self.blocks, self.boundaries = [], []
        index = 1
        for stage, (device, count) in enumerate(zip(self.devices, layers_per_stage, strict=True)):
            with tf.device(device):
                layers = [keras.Input((widths[index - 1],))]
                for _ in range(count):
                    last = index == len(widths) - 1 and stage == len(self.devices) - 1
                    layers.append(keras.layers.Dense(widths[index], activation=None if last else "relu"))
                    index += 1
                block = keras.Sequential(layers, name=f"stage{stage}")
                block.build((None, widths[index - count - 1]))
            self.blocks.append(block)
            self.boundaries.append(widths[index - 1])
        if widths[-1] != classes:
            raise ValueError(f"the last width {widths[-1]} must equal classes={classes} (the logits).")

    @property
    def trainable_variables(self) -> list[Any]:
        """Every stage's variables, stage 0 first."""
        return [v for block in self.blocks for v in block.trainable_variables]

    def variable_devices(self) -> list[tuple[str, str]]:
        """(variable path, device) for every trainable variable."""
        return [(v.path, v.value.device) for v in self.trainable_variables]

    def forward(self, stage: int, x: Any) -> tuple[Any, Any]:
        """Run stage s on its device; returns (output, tape) for the backward pass."""
        tf = quiet.import_tensorflow()
        with tf.device(self.devices[stage]):
            x = tf.identity(x)  # the copy into this stage's device: what crosses the boundary
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = self.blocks[stage](x, training=True)
        return (x, y), tape

    def backward(self, stage: int, saved: Any, tape: Any, upstream: Any) -> tuple[Any, list[Any]]:
        """Backward through stage s: returns (gradient for the previous stage's output, variable grads)."""
        tf = quiet.import_tensorflow()
        x, y = saved
        with tf.device(self.devices[stage]):
            grads = tape.gradient(y, [x, *self.blocks[stage].trainable_variables], output_gradients=upstream)
        return grads[0], grads[1:]

    def __call__(self, x: Any) -> Any:
        """Plain forward through every stage (for predictions)."""
        tf = quiet.import_tensorflow()
        for device, block in zip(self.devices, self.blocks, strict=True):
            with tf.device(device):
                x = block(x, training=False)
        return x


def _deal(items: int, bins: int) -> list[int]:
    if bins > items:
        raise ValueError(f"{bins} stages need at least {bins} layers, got {items}. Use fewer devices or more layers.")
    return shard_sizes(items, bins)


_ABORT = object()  # put in every queue when a stage fails, so no other stage waits for ever


class _Abort(Exception):
    """Raised in a stage thread when another stage has failed."""


def _take(q: queue.Queue) -> Any:
    item = q.get(timeout=300)  # no stage waits for ever, even if a hand-over is lost
    if item is _ABORT:
        raise _Abort
    return item


@dataclasses.dataclass
class PipelineRun:
    """What one pipelined step produced: gradients, mean loss, and the measured events (seconds)."""

    grads: list[Any]
    loss: float
    events: list[Event]


def run_pipeline(model: StagedModel, loss_fn: Any, x: Any, y: Any, micro_batches: int) -> PipelineRun:
    """One GPipe step for real: M micro-batches through P stages, one thread per stage.

    Each stage's thread runs its forwards in micro-batch order as soon as the previous stage
    hands it an activation, then (after all forwards) its backwards as the next stage hands
    back gradients. Gradients are summed over micro-batches and divided by the whole batch,
    so they equal the unpipelined step's. Events are measured with time.perf_counter.
    micro_batches=1 is the naive layer split: one stage busy at a time.
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.parallel import split_batch

    m = _count("micro_batches", micro_batches)
    p = len(model.blocks)
    xs, ys = split_batch(x, m), split_batch(y, m)
    total = tf.cast(tf.shape(x)[0], tf.float32)
    forward_in = [queue.Queue() for _ in range(p + 1)]
    backward_in = [queue.Queue() for _ in range(p + 1)]
    events: list[Event] = []
    grads: list[list[Any]] = [[] for _ in range(p)]
    losses: list[Any] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    origin = time.perf_counter()

    def stage_worker(s: int) -> None:
        try:
            saved = []
            for i in range(m):
                inputs = xs[i] if s == 0 else _take(forward_in[s])
                start = time.perf_counter()
                output, tape = model.forward(s, inputs)
                loss_grad = None
                if s == p - 1:  # the loss and its gradient for the logits, on the last stage's device
                    with tf.device(model.devices[s]), tf.GradientTape() as loss_tape:
                        loss_tape.watch(output[1])
                        loss = tf.reduce_sum(loss_fn(ys[i], output[1])) / total
                    loss_grad = loss_tape.gradient(loss, output[1])
                    losses.append(loss)
                _ = output[1].numpy()  # wait for the work, so the timing is real
                end = time.perf_counter()
                saved.append((output, tape, loss_grad))
                with lock:
                    events.append(Event(s, i, "F", start - origin, end - origin))
                if s < p - 1:
                    forward_in[s + 1].put(output[1])
            for i in range(m):
                output, tape, loss_grad = saved[i]
                start = time.perf_counter()
                upstream = loss_grad if s == p - 1 else _take(backward_in[s])
                upstream_start = time.perf_counter() if s < p - 1 else start
                back, var_grads = model.backward(s, output, tape, upstream)
                _ = back.numpy()
                end = time.perf_counter()
                grads[s].append(var_grads)
                with lock:
                    events.append(Event(s, i, "B", upstream_start - origin, end - origin))
                if s > 0:
                    backward_in[s - 1].put(back)
        except _Abort:
            return  # another stage failed; its error is re-raised below
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(error)
            for q in (*forward_in, *backward_in):
                for _ in range(m):
                    q.put(_ABORT)

    threads = [threading.Thread(target=stage_worker, args=(s,), daemon=True) for s in range(p)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    summed = []
    for s in range(p):
        with tf.device(model.devices[s]):
            summed += [tf.add_n(list(parts)) for parts in zip(*grads[s], strict=True)]
    return PipelineRun(summed, float(tf.add_n(losses)), sorted(events, key=lambda e: e.start))


# ----------------------------------------------------------------------------- tensor parallelism


def column_parallel_dense(x: Any, kernel: Any, bias: Any, devices: Sequence[str]) -> Any:
    """Dense layer with its kernel split by output columns: device i computes x @ W[:, cols_i] + b_i.

    Every device needs all of x; the partial outputs are concatenated (an all-gather).
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.parallel import split_batch

    columns = split_batch(tf.transpose(kernel), len(devices))
    biases = split_batch(bias, len(devices))
    parts = []
    for device, w, b in zip(devices, columns, biases, strict=True):
        with tf.device(device):
            parts.append(tf.matmul(x, w, transpose_b=True) + b)
    with tf.device(devices[0]):
        return tf.concat(parts, axis=1)


def row_parallel_dense(x: Any, kernel: Any, bias: Any, devices: Sequence[str]) -> list[Any]:
    """Dense layer with its kernel split by input rows: device i computes x[:, rows_i] @ W[rows_i, :].

    Each partial product has the full output shape; adding them needs an all-reduce (the ring
    from lesson 03). Returns the full output on every device; the bias is added once.
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.allreduce import ring_allreduce
    from mgpu_edu.parallel import split_batch

    rows = split_batch(kernel, len(devices))
    inputs = split_batch(tf.transpose(x), len(devices))
    partial = []
    for device, w, xt in zip(devices, rows, inputs, strict=True):
        with tf.device(device):
            partial.append(tf.matmul(xt, w, transpose_a=True))
    summed = ring_allreduce(partial)
    out = []
    for device, s in zip(devices, summed, strict=True):
        with tf.device(device):
            out.append(s + bias)
    return out


# ----------------------------------------------------------------------------- costs


def parallelism_costs(widths: Sequence[int], batch: int, devices: int, micro_batches: int = 4,
                      bytes_per_value: int = 4) -> list[dict[str, Any]]:
    """Memory per device and bytes moved per training step, for an MLP of the given widths.

    Counted, not measured: parameters (weights + biases) and the activations a step keeps for
    the backward pass (each layer's output, batch × width), times bytes_per_value.

    - data: every device holds all parameters and 1/N of the activations; it all-reduces the
      gradients (ring: 2(N−1)/N × parameter bytes per device).
    - layer split: device s holds its stage's parameters and activations; each boundary
      sends the activation forward and its gradient back.
    - pipeline: the same parameters and traffic as the layer split (in M messages); at most
      the same activations, because all M micro-batches are kept until the backward pass.
    - tensor: every layer split by columns: 1/N of the parameters and activations per device;
      each layer all-gathers its output forward and all-reduces its input gradient back.

    idle_fraction is the ideal share of device-time spent waiting: (P−1)/P for the layer
    split, the GPipe bubble for the pipeline, 0 for data and tensor parallelism.
    """
    _count("devices", devices)
    _count("batch", batch)
    layers = list(zip(widths[:-1], widths[1:], strict=True))
    params = [(i * o + o) * bytes_per_value for i, o in layers]
    acts = [batch * o * bytes_per_value for _, o in layers]
    n = devices
    per_stage = _deal(len(layers), n)
    bounds, start = [], 0
    for count in per_stage:
        bounds.append((start, start + count))
        start += count
    stage_mem = [sum(params[a:b]) + sum(acts[a:b]) for a, b in bounds]
    boundary_bytes = sum(2 * acts[b - 1] for _, b in bounds[:-1])
    ring = 2 * (n - 1) / n
    # per layer: all-gather its output forward ((N−1)/N of it), all-reduce its input's gradient
    # backward (2(N−1)/N of it; the first layer's input is data and needs no gradient)
    tensor_traffic = sum((n - 1) / n * a for a in acts) + sum(ring * a for a in acts[:-1])
    return [
        {"strategy": "data", "memory_per_device": sum(params) + sum(acts) / n,
         "bytes_per_step": ring * sum(params), "idle_fraction": 0.0},
        {"strategy": "layer split", "memory_per_device": max(stage_mem), "bytes_per_step": boundary_bytes,
         "idle_fraction": bubble_fraction(n, 1)},
        {"strategy": f"pipeline (M={micro_batches})", "memory_per_device": max(stage_mem),
         "bytes_per_step": boundary_bytes, "idle_fraction": bubble_fraction(n, micro_batches)},
        {"strategy": "tensor", "memory_per_device": (sum(params) + sum(acts)) / n,
         "bytes_per_step": tensor_traffic, "idle_fraction": 0.0},
    ]
