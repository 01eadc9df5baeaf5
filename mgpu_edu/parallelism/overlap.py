"""Hiding communication behind computation: a collective matmul, and which work a step's communication can
overlap.

A tensor-parallel layer whose input arrives split by rows (sequence parallelism) all-gathers it, then
multiplies: nothing computes while the gather runs. The **collective matmul** (Wang et al., 2023; the JAX
scaling book's "collective matmul"; UvA's tensor-parallel notebooks) cuts the two into N steps: each device
multiplies the chunk of rows it holds by its weight columns while it passes that chunk on round the ring,
so every send but none of the products waits: each step's send overlaps that step's product. The bytes are
the all-gather's; what changes is that the product no longer waits for all of them.

:func:`collective_matmul` runs it on logical devices (sends through :func:`collectives.send_receive`),
equal to the all-gather followed by the product; its trace counts, step by step, the bytes in flight and the
multiply-adds that can run meanwhile. Logical devices run one op at a time, so the overlap is counted, not
timed: on GPUs the send and the product run on different engines at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument
from mgpu_edu.parallelism import collectives
from mgpu_edu.runtime import quiet


@dataclasses.dataclass
class OverlapTrace:
    """What a decomposed collective moved and computed, step by step (every device alike)."""

    bytes_sent: list[int]  #: per device, over the whole run
    sent_per_step: list[int]  #: bytes each device sends at step k (0 at the last: nothing left to pass on)
    flops_per_step: list[int]  #: FLOPs device 0 computes at step k, while that step's send is in flight

    @property
    def overlapped_steps(self) -> int:
        """Steps whose product runs while a send is in flight: every step but the last."""
        return sum(1 for sent in self.sent_per_step if sent)


def collective_matmul(x_shards: Sequence[Any], w_shards: Sequence[Any], trace: bool = False) -> Any:
    """All-gather then multiply, decomposed: device d ends with [x_0; x_1; …; x_{N−1}] · w_d.

    ``x_shards[d]`` ([rows/N, k]) and ``w_shards[d]`` ([k, n_d]) sit on device d (the input split by rows, as
    sequence parallelism leaves it; the weight split by columns, as a column-parallel layer holds it). At step
    j device d multiplies the chunk it holds, chunk (d − j) mod N, by w_d, and passes the chunk on to device
    d + 1, N − 1 sends in all: an all-gather's (N − 1)/N of the input, moved one chunk at a time while the
    products run. Returns one [rows, n_d] tensor per device (its rows in order), or ``(outputs,
    OverlapTrace)`` with ``trace=True``.

    Example:
        >>> outputs = collective_matmul(x_shards, w_shards)  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    x_shards, w_shards = list(x_shards), list(w_shards)
    n = len(x_shards)
    if n == 0 or len(w_shards) != n:
        raise BadArgument(f"collective_matmul needs one input shard and one weight shard per device, got "
                          f"{len(x_shards)} and {len(w_shards)}.")
    rows, k = (int(v) for v in x_shards[0].shape)
    if any(tuple(x.shape) != (rows, k) for x in x_shards) or any(int(w.shape[0]) != k for w in w_shards):
        raise BadArgument(f"collective_matmul: every input shard must be [rows/N, k] and every weight shard [k, n_d]: "
                          f"got inputs {[list(x.shape) for x in x_shards]} and weights "
                          f"{[list(w.shape) for w in w_shards]}.")
    devices = [x.device for x in x_shards]
    held = list(x_shards)
    parts: list[dict[int, Any]] = [{} for _ in range(n)]
    record = OverlapTrace([0] * n, [], [])
    for step in range(n):
        for d in range(n):
            with tf.device(devices[d]):
                parts[d][(d - step) % n] = tf.matmul(held[d], w_shards[d])  # this step's product
        record.flops_per_step.append(2 * rows * k * int(w_shards[0].shape[-1]))
        if step < n - 1:  # meanwhile, the chunk goes on to the next device
            held, sent = collectives.send_receive(held, offset=1, trace=True)
            record.bytes_sent = [a + b for a, b in zip(record.bytes_sent, sent.bytes_sent, strict=True)]
            record.sent_per_step.append(sent.bytes_sent[0])
        else:
            record.sent_per_step.append(0)
    outputs = []
    for d in range(n):
        with tf.device(devices[d]):
            outputs.append(tf.concat([parts[d][c] for c in range(n)], axis=0))
    return (outputs, record) if trace else outputs


@dataclasses.dataclass(frozen=True)
class Ready:
    """One weight's gradient in a traced backward pass: its bytes, and the backward pass's matrix-product FLOPs
    that are not among what it waits for (``remaining``): the work that can still run once it exists."""

    name: str
    nbytes: int
    remaining: int


def gradient_readiness(model: Any, loss_fn: Any, x: Any, y: Any) -> list[Ready]:
    """Each trainable weight's gradient, earliest ready first, with the backward FLOPs that can overlap its
    all-reduce: read from TensorFlow's traced graph (:func:`graphs.trace`), not timed.

    A gradient can be sent as soon as the ops it depends on have run; every backward op it doesn't depend on
    can run meanwhile. ``remaining`` counts those ops' matrix-product FLOPs (MatMul, BatchMatMul, Einsum:
    2·m·k·n from their shapes): at most what its all-reduce can hide behind, if a scheduler keeps that work
    for later. The first layer's kernel, which waits for every input gradient, has only the other layers'
    weight gradients left: an all-reduce that starts when the backward pass ends hides behind nothing.
    ``loss_fn(y, predictions)`` returns the batch's loss (a scalar) or one loss per example (averaged).
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.analysis import graphs

    weights = list(model.trainable_variables)

    def forward(xs: Any, ys: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(ys, model(xs, training=True)))
        return tape, loss

    traced = graphs.trace(forward, lambda r: r[0].gradient(r[1], weights), x, y)
    backward = [op for op in traced.ops if op not in traced.made]
    flops = {op: _product_flops(op) for op in backward}
    total = sum(flops.values())
    backward_set = set(backward)
    out = []
    for weight, grad in zip(weights, traced.gradients, strict=True):
        seen, todo = set(), [grad.op]
        while todo:
            op = todo.pop()
            if op in seen or op not in backward_set:
                continue
            seen.add(op)
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
        nbytes = int(tf.size(weight)) * tf.as_dtype(weight.dtype).size
        out.append(Ready(weight.path if hasattr(weight, "path") else weight.name, nbytes,
                         total - sum(flops[op] for op in seen)))
    return sorted(out, key=lambda r: -r.remaining)


def _product_flops(op: Any) -> int:
    """2·m·k·n for a matrix product op (batched: times the batch), from its output's and first input's shapes."""
    if op.type not in ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"):
        return 0
    out, first = op.outputs[0].shape, op.inputs[0].shape
    if not out.is_fully_defined() or not first.is_fully_defined():
        return 0
    if op.type == "MatMul":
        contracted = first[0] if op.get_attr("transpose_a") else first[1]
    elif op.type == "Einsum":
        left, right = op.get_attr("equation").decode().split("->")[0].split(",")
        contracted = 1
        for letter, size in zip(left, first, strict=False):
            if letter not in op.get_attr("equation").decode().split("->")[1]:
                contracted *= size
    else:
        contracted = first[-2] if op.get_attr("adj_x") else first[-1]
    return 2 * int(out.num_elements()) * int(contracted)


def buckets(ready: Sequence[Ready], bucket_bytes: int) -> list[tuple[int, int]]:
    """Group gradients, earliest ready first, into buckets of at most ``bucket_bytes`` (a gradient larger than
    that makes a bucket of its own), as DDP's and Keras's gradient packing do; each bucket's all-reduce can start
    once its last gradient is ready. Returns (bytes, backward FLOPs that can still overlap it) per bucket.

    Example:
        >>> buckets([Ready("a", 400, 90), Ready("b", 400, 50), Ready("c", 400, 0)], 800)
        [(800, 50), (400, 0)]
    """
    from mgpu_edu._validate import whole_number

    whole_number("bucket_bytes", bucket_bytes, hint="It is the most bytes one all-reduce carries, e.g. 25 * 2**20.")
    out: list[tuple[int, int]] = []
    size, remaining = 0, None
    for r in ready:
        if size and size + r.nbytes > bucket_bytes:
            out.append((size, remaining))
            size = 0
        size += r.nbytes
        remaining = r.remaining
    if size:
        out.append((size, remaining))
    return out
