"""Trading compute for memory on one device: activation recomputation and gradient accumulation.

- :func:`checkpointed_step` computes one step's gradients with every ``segment`` consecutive
  layers under ``tf.recompute_grad``: the backward pass runs each segment's forward again
  instead of keeping its activations. :func:`kept_activations` counts what the forward pass
  keeps each way; :func:`step_memory` reads what TensorFlow's allocator really holds, after the
  forward pass and at the step's peak.
- :func:`accumulated_gradients` runs a batch as micro-batches one after another and adds up
  their gradients: divided by the whole batch's size, that is the whole batch's step; divided
  by the number of micro-batches (what Keras 3's ``gradient_accumulation_steps`` does), it is
  a different step whenever the micro-batches differ in size.
"""

from __future__ import annotations

import dataclasses
import gc
import warnings
from collections.abc import Callable
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, whole_number
from mgpu_edu.analysis.memory import layer_activations
from mgpu_edu.runtime import quiet

#: How :func:`accumulated_gradients` divides the summed gradients.
DIVIDE_BY = ("examples", "micro_batches")


def _layers(model: Any) -> list[Any]:
    layers = [layer for layer in getattr(model, "layers", []) if type(layer).__name__ != "InputLayer"]
    if not layers:
        raise BadArgument(f"model={model!r} has no layers to run: pass a built keras.Sequential, e.g. "
                          "models.mlp(64, 10, hidden=(256,) * 8).")
    return layers


def segments(model: Any, segment: int) -> list[list[Any]]:
    """The model's layers in consecutive groups of ``segment`` (the last group may be shorter).

    Example:
        >>> [len(g) for g in segments(models.mlp(64, 10, hidden=(32,) * 4), 2)]  # doctest: +SKIP
        [2, 2, 1]
    """
    layers = _layers(model)
    whole_number("segment", segment, minimum=1, maximum=len(layers),
                 hint=f"It is how many consecutive layers run under one tf.recompute_grad; this model has "
                      f"{len(layers)} layers.")
    return [layers[i:i + segment] for i in range(0, len(layers), segment)]


def checkpointed_step(model: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any,
                      segment: int | None = None, forward_runs: list[int] | None = None) -> tuple[Any, list[Any]]:
    """One step's mean loss and gradients; with ``segment``, each group of that many layers is recomputed.

    ``tf.recompute_grad`` keeps only a segment's input during the forward pass and runs the
    segment forward again, under a tape, when the backward pass reaches it. The gradients are
    the same; the work is one more forward pass. ``loss_fn`` returns one loss per example.
    If ``forward_runs`` is a list, each segment's forward appends the segment's index when its
    Python code runs (in eager mode: once forward, once more when recomputed).
    """
    tf = quiet.import_tensorflow()
    groups = segments(model, segment) if segment else [_layers(model)]

    def run(index: int, group: list[Any]) -> Callable[[Any], Any]:
        def forward(h: Any) -> Any:
            if forward_runs is not None:
                forward_runs.append(index)
            for layer in group:
                h = layer(h, training=True)
            return h
        return tf.recompute_grad(forward) if segment else forward

    with tf.GradientTape() as tape:
        h = x
        for index, group in enumerate(groups):
            h = run(index, group)(h)
        loss = tf.reduce_mean(loss_fn(y, h))
    return loss, tape.gradient(loss, model.trainable_variables)


def kept_activations(model: Any, batch: int, segment: int | None = None, bytes_per_value: int = 4) -> int:
    """Bytes of activations the forward pass keeps for the backward pass, counted from the layers' shapes.

    Without recomputation: the input and every layer's output
    (:func:`mgpu_edu.memory.layer_activations`). With segments of k layers: only each segment's
    input and the logits; the backward pass then rebuilds one segment at a time, so its own
    peak adds that segment's outputs, and more besides (:func:`step_memory` measures it). With L
    equal layers and k ≈ √L, the forward keeps about √L layers' outputs and one rebuilt segment
    adds about √L more: 2√L instead of L (Chen et al., 2016). Counted, not measured.

    Example:
        >>> kept_activations(models.mlp(64, 10, hidden=(256,) * 8), 512, segment=3)  # doctest: +SKIP
        1200128
    """
    rows = [nbytes for _, nbytes in layer_activations(model, batch, bytes_per_value)]
    if not segment:
        return sum(rows)
    sizes = [len(g) for g in segments(model, segment)]
    starts = [sum(sizes[:j]) for j in range(len(sizes))]  # rows[start] is segment j's input
    return sum(rows[i] for i in {*starts, len(rows) - 1})


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One training step's memory as TensorFlow's allocator reported it, in bytes.

    Every figure is what the allocator held *above* what it held before the step (the weights
    and the batch, allocated earlier, are not in it):

    - ``kept``: held when the forward pass ended, what waits for the backward pass;
    - ``peak``: the most held at any moment of the step;
    - ``gradients``: held once the step ended, the weights' gradients;
    - ``timeline``: ``(phase, layer, bytes held)`` at every layer boundary, phase "forward",
      "recompute" (a segment rebuilt in the backward pass) or "backward".
    """

    kept: int
    peak: int
    gradients: int
    timeline: list[tuple[str, int, int]]


def _memory_device(device: str | None) -> str:
    """The device whose allocator :func:`step_memory` reads; says where a CPU's allocator counts too little.

    It asks the allocator itself, since what it counts depends on how TensorFlow started. With
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` set before, a CPU uses the allocator GPUs use, which counts every
    allocation (a 4-byte tensor as 256 bytes). Without it, where oneDNN is on (by default on Linux x86 CPUs
    with AVX-512 VNNI or BF16, AVX-VNNI or AMX, and on Arm Neoverse V1; ``TF_ENABLE_ONEDNN_OPTS`` changes it
    in builds that include oneDNN), it counts allocations of 256 KiB and more only, and a 4-byte tensor as
    nothing: a warning says so. Without oneDNN it keeps no counts, and ``get_memory_info`` raises: so does
    this, saying how to count.
    """
    tf = quiet.import_tensorflow()
    if device is None:
        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    if "CPU" not in device.upper():
        return device
    fix = ('Set TF_CPU_ALLOCATOR_USE_BFC=true first thing (os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true", '
           "before setup_devices) and restart the kernel to count every allocation, as GPUs do.")
    info = tf.config.experimental.get_memory_info
    try:
        before = info(device)["current"]
    except ValueError as error:
        if "Allocator stats not available" not in str(error):
            raise  # not this: a device TensorFlow doesn't know, say
        raise ValueError(f"device={device!r}: TensorFlow's CPU allocator keeps no memory counts here (oneDNN "
                         f"is off and TF_CPU_ALLOCATOR_USE_BFC was not set before TensorFlow started: "
                         f"{error}). {fix}") from None
    with tf.device(device):
        probe = tf.ones((1,))  # 4 bytes: counted as 256 by the allocator GPUs use, as 0 by oneDNN's
    counted = info(device)["current"] - before
    del probe
    if counted == 0:
        warnings.warn(f"device={device!r}: TensorFlow's CPU allocator here (oneDNN's) counts only allocations of "
                      f"256 KiB and more, so small tensors (biases, small gradients) are missing from these "
                      f"readings. {fix}", stacklevel=3)
    return device


def step_memory(model: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any, segment: int | None = None,
                device: str | None = None) -> StepMemory:
    """Run one step of :func:`checkpointed_step`'s computation eagerly and read its memory from TensorFlow's allocator.

    The step runs eagerly, so each reading is taken at a known point. The allocator hands out
    blocks from a pool it keeps, rounded up, so readings vary by a few percent with what ran
    before in the process. ``device`` is the allocator to read (default: GPU 0 if there is a
    GPU, else CPU 0). On a CPU, set ``TF_CPU_ALLOCATOR_USE_BFC=true`` before TensorFlow
    starts: it switches to the allocator GPUs use, which counts every allocation. Without it,
    the CPU's allocator counts only allocations of 256 KiB and more where oneDNN is on (a
    warning says so), and nothing elsewhere (an error says so). A compiled
    step (``tf.function``) may order and free its work differently, so its peak differs and
    can change from run to run.

    Example:
        >>> m = step_memory(models.mlp(64, 10, hidden=(256,) * 8), loss_fn, x, y, segment=3)  # doctest: +SKIP
        >>> m.kept < m.peak  # doctest: +SKIP
        True
    """
    tf = quiet.import_tensorflow()
    device = _memory_device(device)
    groups = segments(model, segment) if segment else [_layers(model)]
    info = tf.config.experimental.get_memory_info
    timeline: list[tuple[str, int, int]] = []
    runs = [0] * len(groups)  # forward runs of each segment: the second is the recomputation

    def read(phase: str, layer: int) -> None:
        timeline.append((phase, layer, info(device)["current"] - base))

    def probe(h: Any, layer: int, group: int) -> Any:
        @tf.custom_gradient
        def identity(value: Any) -> Any:
            read("recompute" if runs[group] > 1 else "forward", layer)

            def grad(upstream: Any) -> Any:
                read("backward", layer)
                return upstream
            return tf.identity(value), grad
        return identity(h)

    def run(index: int, group: list[Any], first: int) -> Callable[[Any], Any]:
        def forward(h: Any) -> Any:
            runs[index] += 1
            for offset, layer in enumerate(group):
                h = probe(layer(h, training=True), first + offset + 1, index)
            return h
        return tf.recompute_grad(forward) if segment else forward

    gc.collect()
    with tf.device(device):
        base = info(device)["current"]
        tf.config.experimental.reset_memory_stats(device)
        with tf.GradientTape() as tape:
            h, first = x, 0
            for index, group in enumerate(groups):
                h = run(index, group, first)(h)
                first += len(group)
            loss = tf.reduce_mean(loss_fn(y, h))
        kept = info(device)["current"] - base
        grads = tape.gradient(loss, model.trainable_variables)
        peak = info(device)["peak"] - base
        held = info(device)["current"] - base
    del grads, tape, h, loss
    return StepMemory(int(kept), int(peak), int(held), timeline)


def accumulated_gradients(model: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any, micro_batch: int,
                          divide_by: str = "examples") -> list[Any]:
    """Gradients of a batch run as micro-batches of ``micro_batch`` examples, one after another.

    Each micro-batch's per-example losses are summed, and its gradients added into one buffer;
    only one micro-batch's activations exist at a time. ``divide_by``:

    - ``"examples"``: divide by the whole batch's size, so the result is the whole batch's
      mean-loss gradient, whatever the micro-batches' sizes (a short last one included);
    - ``"micro_batches"``: average each micro-batch's mean-loss gradient, which is what Keras
      3's ``gradient_accumulation_steps`` does; it over-weights the examples of a short
      micro-batch.
    """
    tf = quiet.import_tensorflow()
    one_of("divide_by", divide_by, DIVIDE_BY)
    total = int(x.shape[0])
    if total == 0 or int(y.shape[0]) != total:
        raise BadArgument(f"x has {total} examples and y {int(y.shape[0])}: pass a non-empty batch with one label "
                          "per example.")
    sizes = micro_batch_sizes(total, micro_batch)
    summed = None
    start = 0
    for size in sizes:
        with tf.GradientTape() as tape:
            losses = loss_fn(y[start:start + size], model(x[start:start + size], training=True))
            loss = tf.reduce_sum(losses) / (total if divide_by == "examples" else size * len(sizes))
        grads = tape.gradient(loss, model.trainable_variables)
        summed = grads if summed is None else [a + g for a, g in zip(summed, grads, strict=True)]
        start += size
    return summed


def micro_batch_sizes(batch: int, micro_batch: int) -> list[int]:
    """The micro-batches a batch splits into, in order: full ones, then the rest.

    Example:
        >>> micro_batch_sizes(80, 32)
        [32, 32, 16]
    """
    total = whole_number("batch", batch, minimum=1)
    b = whole_number("micro_batch", micro_batch, minimum=1, maximum=total,
                     hint=f"It is examples per micro-batch, at most the batch's {total}.")
    return [b] * (total // b) + ([total % b] if total % b else [])


def gpt_step_memory(model: Any, tokens: Any, targets: Any, recompute: str = "none",
                    device: str | None = None) -> StepMemory:
    """One eager training step of the tiny GPT (:func:`gpt.forward`) with every block's ``recompute``
    (:data:`gpt.RECOMPUTE`), read from TensorFlow's allocator as :func:`step_memory` reads it: ``kept`` when
    the forward pass ends, ``peak`` over the step, ``gradients`` at its end; no timeline.

    Example:
        >>> gpt_step_memory(model, tokens, targets, "selective").kept  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.workloads import gpt

    one_of("recompute", recompute, gpt.RECOMPUTE)
    device = _memory_device(device)
    info = tf.config.experimental.get_memory_info
    gc.collect()
    with tf.device(device):
        base = info(device)["current"]
        tf.config.experimental.reset_memory_stats(device)
        with tf.GradientTape() as tape:
            logits = gpt.forward(model.weights_by_name(), tokens, model.heads, recompute)
            loss = gpt.next_token_loss(logits, targets)
        kept = info(device)["current"] - base
        grads = tape.gradient(loss, model.trainable_variables)
        peak = info(device)["peak"] - base
        held = info(device)["current"] - base
    del grads, tape, logits, loss
    return StepMemory(int(kept), int(peak), int(held), [])


def kept_by(fn: Callable[..., Any], *inputs: Any, device: str | None = None) -> int:
    """Bytes TensorFlow's allocator holds for the backward pass after ``fn(*inputs)`` runs eagerly under a
    ``tf.GradientTape`` watching ``inputs``: what the tape keeps, the output itself not counted.

    Example:
        >>> kept_by(gpt.attention, q, k, v)  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    device = _memory_device(device)
    info = tf.config.experimental.get_memory_info
    gc.collect()
    with tf.device(device):
        base = info(device)["current"]
        with tf.GradientTape() as tape:
            tape.watch(list(inputs))
            out = fn(*inputs)
        kept = info(device)["current"] - base - out.shape.num_elements() * out.dtype.size
    del tape, out
    return int(kept)
