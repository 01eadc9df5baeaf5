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
multiply-adds that can run meanwhile. Between logical CPUs a send hands the tensor over without copying it,
so here the overlap is counted, not timed: on GPUs the send runs on a stream of its own beside the product.
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
    flops = {op: _product_flops(op) for op in traced.ops if op not in traced.made}  # the backward pass's
    total = sum(flops.values())
    out = []
    for weight, grad in zip(weights, traced.gradients, strict=True):
        waits = graphs.feeding(grad, traced.made)  # the backward ops this gradient depends on
        nbytes = int(tf.size(weight)) * tf.as_dtype(weight.dtype).size
        out.append(Ready(weight.path if hasattr(weight, "path") else weight.name, nbytes,
                         total - sum(flops.get(op, 0) for op in waits)))
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


@dataclasses.dataclass(frozen=True)
class OpSpan:
    """One op as TensorFlow's own step trace saw it run: its device ("CPU:1"), name, type, and start and end in
    seconds from the first op's start."""

    device: str
    name: str
    op: str
    start: float
    end: float


def op_timeline(fn: Any, *inputs: Any, runs: int = 1) -> list[OpSpan]:
    """Run ``fn(*inputs)`` as a graph and return every op's span on every device, from TensorFlow's own trace.

    The graph is built with ``tf.compat.v1.wrap_function`` (which orders ops by their data only, lesson 01) and
    run as written (Grappler's rewrites off) in a session with ``RunOptions(trace_level=FULL_TRACE)``:
    TensorFlow records, per device, when each op started and ended (its ``RunMetadata.step_stats``). It runs
    ``runs`` times first, untraced, so that the traced run shows running, not start-up. Each input is placed on
    the device it is on; inputs, constants and those placements are left out. On logical devices the spans are
    real but the devices share this machine's cores: the order and the dependencies are what carries over to
    GPUs, not the durations.

    Example:
        >>> spans = op_timeline(lambda x: tf.matmul(x, x), tf.ones([64, 64]))  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.analysis import graphs

    def placed(*values: Any) -> Any:  # each input on the device it lives on now, as fn would find it eagerly
        on_devices = []
        for value, original in zip(values, inputs, strict=True):
            with tf.device(original.device):
                on_devices.append(tf.identity(value))
        return fn(*on_devices)

    wrapped = tf.compat.v1.wrap_function(placed, [tf.TensorSpec.from_tensor(x) for x in inputs])
    graph = wrapped.graph
    feeds = {placeholder.name: value.numpy() for placeholder, value in zip(wrapped.inputs, inputs, strict=True)}
    fetches = [t.name for t in wrapped.outputs]
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    from tensorflow.python.eager import context as eager_context  # the logical devices' configuration

    config = eager_context.context().config  # a copy: the same logical devices
    config.graph_options.rewrite_options.disable_meta_optimizer = True  # run as written: Grappler drops identities
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        for _ in range(runs):
            session.run(fetches, feeds)
        session.run(fetches, feeds, options=options, run_metadata=metadata)
    types = {op.name: op.type for op in graph.get_operations()}
    placements = {consumer.name for op in graph.get_operations() if op.type == "Placeholder"
                  for consumer in op.outputs[0].consumers()}
    spans = []
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            kind = types.get(node.node_name)
            if kind is None or kind in ("Placeholder", "Const", "NoOp") or node.node_name in placements:
                continue
            start = node.all_start_micros / 1e6
            spans.append(OpSpan(graphs.short_device(device.device), node.node_name, kind, start,
                                start + node.all_end_rel_micros / 1e6))
    first = min(s.start for s in spans)
    return sorted((dataclasses.replace(s, start=s.start - first, end=s.end - first) for s in spans),
                  key=lambda s: (s.start, s.device))
