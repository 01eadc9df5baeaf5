"""Data × tensor × pipeline parallelism on one model, with 1F1B and ZeRO-1: the capstone (lesson 16).

The tiny GPT trains on d·t·p devices. Device (k, s, m) = s·d·t + k·t + m: tensor rank m innermost
(tensor parallelism sends the most, so its devices sit closest, as Megatron-LM places them), then the
data replica k, then the pipeline stage s. Each piece is a building block of the earlier lessons:

- **tensor** (lessons 13 and 15): each (replica k, stage s) group of t devices is a DTensor mesh
  ``{"model": t}``; the stage's weights carry Megatron's layouts, and DTensor inserts the all-reduces;
- **pipeline** (lesson 07): stage s holds its blocks (the embeddings on the first stage, the final
  LayerNorm and head on the last) and runs :func:`pipeline.stage_order`'s 1F1B order; a stage's output
  goes to the next stage's devices device by device, and its input gradient comes back the same way.
  The backward pass recomputes the stage's forward from its kept input (full recomputation), so a
  stage keeps one input per micro-batch in flight;
- **data + ZeRO-1** (lessons 03 and 10): each device flattens its share of every gradient of its
  stage, the d devices holding the same share reduce-scatter it (lesson 03's ring), each updates its
  1/d with Keras's own Adam (so Adam's moments are split d ways), and the pieces are all-gathered back.

DTensor does the tensor axis because a layout is all tensor parallelism needs; the pipeline and the
optimizer step are written by hand because DTensor has no pipeline schedule and no sharded optimizer.
No GPU: the devices are logical CPUs, and the bytes and arithmetic are real, the time is not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, whole_number
from mgpu_edu.parallelism import meshes
from mgpu_edu.parallelism import tensor as tensor_parallel
from mgpu_edu.parallelism.allreduce import ring_all_gather, ring_reduce_scatter
from mgpu_edu.parallelism.parallel import shard_sizes
from mgpu_edu.parallelism.pipeline import stage_order
from mgpu_edu.runtime import quiet


@dataclasses.dataclass(frozen=True)
class Grid:
    """How many ways each axis splits: data replicas, tensor ranks, pipeline stages, and micro-batches per step."""

    data: int
    tensor: int
    pipeline: int
    micro_batches: int

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline

    def device(self, replica: int, stage: int, rank: int) -> int:
        """The number of the device that holds tensor rank ``rank`` of stage ``stage`` in replica ``replica``."""
        return stage * self.data * self.tensor + replica * self.tensor + rank


def stage_weights(names: Sequence[str], layers: int, stages: int) -> list[list[str]]:
    """Which weights each pipeline stage holds: an equal share of the blocks, the embeddings on the first stage,
    the final LayerNorm and the head on the last.

    Example:
        >>> names = ["token_embedding", "position_embedding", "block0/wq", "block1/wq", "final_gamma", "lm_head"]
        >>> stage_weights(names, layers=2, stages=2)
        [['token_embedding', 'position_embedding', 'block0/wq'], ['block1/wq', 'final_gamma', 'lm_head']]
    """
    whole_number("stages", stages, minimum=1)
    if layers % stages:
        raise BadArgument(f"{stages} pipeline stages can't share {layers} blocks equally: pick a divisor of {layers}.")
    per = layers // stages
    owner = {}
    for name in names:
        if name.startswith("block"):
            owner[name] = int(name.split("/")[0][5:]) // per
        else:
            owner[name] = 0 if name in ("token_embedding", "position_embedding") else stages - 1
    return [[n for n in names if owner[n] == s] for s in range(stages)]


def stage_output(weights: dict[str, Any], inputs: Any, targets: Any, heads: int, first: bool, last: bool) -> Any:
    """One stage's forward pass: token ids or the previous stage's output in; its output, or the loss, out."""
    from mgpu_edu.workloads import gpt

    x = gpt.embed(inputs, weights["token_embedding"], weights["position_embedding"]) if first else inputs
    x = gpt.run_blocks(weights, x, heads)
    if not last:
        return x
    return gpt.next_token_loss(gpt.head_logits(x, weights["final_gamma"], weights["final_beta"],
                                               weights["lm_head"]), targets)


def stage_gradients(weights: dict[str, Any], inputs: Any, targets: Any, upstream: Any, heads: int, first: bool,
                    last: bool) -> tuple[Any, dict[str, Any]]:
    """One stage's backward pass, recomputing its forward from the kept input: (input gradient, weight gradients).

    ``upstream`` is the gradient of the step's loss with respect to this stage's output (for the last
    stage, the loss's weight in the step: 1 / (d · M)). The first stage's input is token ids: no gradient.
    """
    tf = quiet.import_tensorflow()
    names = list(weights)
    with tf.GradientTape() as tape:
        if not first:
            tape.watch(inputs)
        out = stage_output(weights, inputs, targets, heads, first, last)
    sources = [weights[n] for n in names] + ([] if first else [inputs])
    grads = tape.gradient(out, sources, output_gradients=upstream)
    weight_grads = {n: tf.convert_to_tensor(g) for n, g in zip(names, grads, strict=False)}
    return (None if first else grads[-1]), weight_grads


@dataclasses.dataclass
class Run:
    """What a 3-D training run did: each step's loss, and per device what it sent and held."""

    grid: Grid
    losses: list[float]
    #: bytes each device sent in the last step, by axis: "tensor", "pipeline", "data"
    sent: list[dict[str, float]]
    #: bytes each device held at the end, by kind: "weights", "gradients", "optimizer" (Adam's moments for its
    #: 1/d), "activations" (the peak of the stage inputs it kept for the backward pass), and "update copy" (its
    #: 1/d of the weights as a variable for Keras's Adam to update: a copy a production ZeRO-1 doesn't need)
    held: list[dict[str, int]]
    #: each device's share of every weight of its stage, by name (NumPy)
    shares: list[dict[str, Any]]
    #: the most micro-batches each stage kept in flight
    in_flight: list[int]
    #: the tensor-parallel programs DTensor compiled for stage s (forward, backward), replica 0
    programs: list[tuple[Any, Any]]


def _move(x: Any, target: Any, sent: list[float], sources: list[int]) -> Any:
    """A DTensor from one mesh to another of the same shape, each share to the same rank; counts the bytes."""
    tf = quiet.import_tensorflow()
    from tensorflow.experimental import dtensor

    layout = dtensor.fetch_layout(x)
    parts = dtensor.unpack(x)
    moved = []
    for part, device, source in zip(parts, target.local_devices(), sources, strict=True):
        with tf.device(device):
            moved.append(tf.identity(part))
        sent[source] += int(part.shape.num_elements()) * part.dtype.size
    return dtensor.pack(moved, dtensor.Layout(layout.sharding_specs, target))


def train(model: Any, tokens: Any, targets: Any, grid: Grid, devices: Sequence[str], steps: int,
          learning_rate: float) -> Run:
    """Train ``model``'s weights (a TinyGPT; the model itself is not changed) for ``steps`` Adam steps on the grid.

    The global batch (``tokens``, ``targets``: [batch, sequence]) is split over the d replicas, each
    replica's share into M micro-batches. Returns the losses, the bytes each device sent (last step)
    and holds, and each device's shares of the weights, to compare with one device's training.
    """
    tf = quiet.import_tensorflow()
    import keras
    import numpy as np
    from tensorflow.experimental import dtensor

    d, t, p, m_count = grid.data, grid.tensor, grid.pipeline, grid.micro_batches
    devices = list(devices)
    if len(devices) != grid.devices:
        raise BadArgument(f"a {d} × {t} × {p} grid needs {grid.devices} devices, got {len(devices)}.")
    batch = int(tokens.shape[0])
    if batch % (d * m_count):
        raise BadArgument(f"the global batch of {batch} sequences doesn't split into {d} replicas × {m_count} "
                          f"micro-batches: use a multiple of {d * m_count}.")
    tensor_parallel.check_degree(t, model.hidden, model.heads)
    start = model.weights_by_name()
    per_stage = stage_weights(list(start), len(model.blocks), p)
    micro = batch // (d * m_count)

    # the meshes, the weights on them, and the compiled stage programs
    grid_meshes = [[meshes.make_mesh({"model": t}, devices=[devices[grid.device(k, s, r)] for r in range(t)])
                    for s in range(p)] for k in range(d)]
    weights, forward, backward, programs = {}, {}, {}, []
    for k in range(d):
        for s in range(p):
            mesh = grid_meshes[k][s]
            own = {n: start[n] for n in per_stage[s]}
            weights[k, s] = meshes.variables(own, meshes.gpt_layouts(mesh, own, tensor_axis="model"))
    whole = [meshes.layout(grid_meshes[k][0], None, None) for k in range(d)]
    labels = [meshes.layout(grid_meshes[k][p - 1], None, None) for k in range(d)]

    def tokens_on(k: int, i: int) -> tuple[Any, Any]:
        rows = slice((k * m_count + i) * micro, (k * m_count + i + 1) * micro)
        return meshes.put(tokens[rows], whole[k]), meshes.put(targets[rows], labels[k])

    upstream_loss = [meshes.put(np.float32(1.0 / (d * m_count)), meshes.layout(grid_meshes[k][p - 1]))
                     for k in range(d)]

    # compile each stage's forward and backward once per replica, reading replica 0's programs
    example_inputs: dict[tuple[int, int], Any] = {}
    for k in range(d):
        x, y = tokens_on(k, 0)
        for s in range(p):
            first, last = s == 0, s == p - 1
            inputs = x if first else example_inputs[k, s]
            target = y if last else None
            fwd = meshes.compiled_collectives(
                lambda w, a, b, first=first, last=last: stage_output(w, a, b, model.heads, first, last),
                weights[k, s], inputs, target)
            out = fwd.result
            up = upstream_loss[k] if last else out  # any tensor of the output's layout, to compile with
            bwd = meshes.compiled_collectives(
                lambda w, a, b, u, first=first, last=last: stage_gradients(w, a, b, u, model.heads, first, last),
                weights[k, s], inputs, target, up)
            forward[k, s], backward[k, s] = fwd.function, bwd.function
            if k == 0:
                programs.append((fwd, bwd))
            if not last:
                example_inputs[k, s + 1] = _move(out, grid_meshes[k][s + 1], [0.0] * grid.devices,
                                                 [grid.device(k, s, r) for r in range(t)])

    # ZeRO-1: per device, its share of the stage's weights as one flat vector; it owns 1/d of it
    def flat_share(values: dict[str, Any], k: int, s: int, r: int) -> Any:
        parts = [dtensor.unpack(values[n])[r] for n in per_stage[s]]
        with tf.device(devices[grid.device(k, s, r)]):
            return tf.concat([tf.reshape(v, [-1]) for v in parts], axis=0)

    shapes = {(s, r): [tuple(dtensor.unpack(weights[0, s][n].read_value())[r].shape) for n in per_stage[s]]
              for s in range(p) for r in range(t)}
    owned, optimizers = {}, {}
    for s in range(p):
        for r in range(t):
            size = sum(math.prod(shape) for shape in shapes[s, r])
            sizes = shard_sizes(size, d)
            for k in range(d):
                lo = sum(sizes[:k])
                device = devices[grid.device(k, s, r)]
                with tf.device(device):
                    vector = flat_share({n: weights[k, s][n].read_value() for n in per_stage[s]}, k, s, r)
                    owned[k, s, r] = tf.Variable(vector[lo:lo + sizes[k]])
                    optimizer = keras.optimizers.Adam(learning_rate)
                    optimizer.build([owned[k, s, r]])
                    optimizers[k, s, r] = optimizer

    losses, in_flight_peak = [], [0] * p
    kept_peak, grad_bytes = [0] * grid.devices, [0] * grid.devices
    for _ in range(steps):
        flat_grads, gathered = {}, {}  # per (replica, stage, rank): its flat gradient share, its new flat weights
        sent = [{"tensor": 0.0, "pipeline": 0.0, "data": 0.0} for _ in range(grid.devices)]
        pipeline_sent = [0.0] * grid.devices
        step_loss = 0.0
        for k in range(d):
            accumulated: dict[int, dict[str, Any]] = {}
            kept: dict[tuple[int, int], Any] = {}
            outputs: dict[tuple[int, int], Any] = {}
            grads_in: dict[tuple[int, int], Any] = {}
            micro_inputs = [tokens_on(k, i) for i in range(m_count)]
            orders = [stage_order("1f1b", s, p, m_count) for s in range(p)]
            position = [0] * p
            held = [0] * p
            while any(position[s] < len(orders[s]) for s in range(p)):
                progressed = False
                for s in range(p):
                    while position[s] < len(orders[s]):
                        phase, i = orders[s][position[s]]
                        first, last = s == 0, s == p - 1
                        if phase == "F":
                            if not first and (s, i) not in outputs:
                                break
                            inputs = micro_inputs[i][0] if first else outputs.pop((s, i))
                            target = micro_inputs[i][1] if last else None
                            out = forward[k, s](weights[k, s], inputs, target)
                            kept[s, i] = inputs
                            held[s] += 1
                            in_flight_peak[s] = max(in_flight_peak[s], held[s])
                            for r in range(t):
                                dev = grid.device(k, s, r)
                                now = sum(int(dtensor.unpack(v)[r].shape.num_elements()) * v.dtype.size
                                          for (ss, _), v in kept.items() if ss == s)
                                kept_peak[dev] = max(kept_peak[dev], now)
                            if last:
                                step_loss += float(dtensor.unpack(out)[0]) / (d * m_count)
                            else:
                                outputs[s + 1, i] = _move(out, grid_meshes[k][s + 1], pipeline_sent,
                                                          [grid.device(k, s, r) for r in range(t)])
                        else:
                            if not last and (s, i) not in grads_in:
                                break
                            upstream = upstream_loss[k] if last else grads_in.pop((s, i))
                            target = micro_inputs[i][1] if last else None
                            input_grad, weight_grads = backward[k, s](weights[k, s], kept.pop((s, i)), target,
                                                                      upstream)
                            held[s] -= 1
                            total = accumulated.setdefault(s, {})
                            for n, g in weight_grads.items():
                                total[n] = g if n not in total else total[n] + g
                            if not first:
                                grads_in[s - 1, i] = _move(input_grad, grid_meshes[k][s - 1], pipeline_sent,
                                                           [grid.device(k, s, r) for r in range(t)])
                        position[s] += 1
                        progressed = True
                if not progressed:
                    raise RuntimeError("the 1F1B schedule stalled: a stage waits for an input no stage produces")
            for s in range(p):
                for r in range(t):
                    dev = grid.device(k, s, r)
                    sent[dev]["tensor"] += m_count * (programs[s][0].sent + programs[s][1].sent)
            for s in range(p):
                for r in range(t):
                    grad_bytes[grid.device(k, s, r)] = sum(
                        int(dtensor.unpack(g)[r].shape.num_elements()) * g.dtype.size for g in accumulated[s].values())
                    flat_grads[k, s, r] = flat_share(accumulated[s], k, s, r)
        # data parallel + ZeRO-1: reduce-scatter the flat gradients, Adam on the owned piece, all-gather
        for s in range(p):
            for r in range(t):
                group = [grid.device(k, s, r) for k in range(d)]
                flats = [flat_grads[k, s, r] for k in range(d)]
                pieces, trace = ring_reduce_scatter(flats, trace=True)
                for k, dev in enumerate(group):
                    sent[dev]["data"] += trace.bytes_sent[k]
                    with tf.device(devices[dev]):
                        optimizers[k, s, r].apply_gradients([(pieces[k], owned[k, s, r])])
                full, trace = ring_all_gather([tf.convert_to_tensor(owned[k, s, r]) for k in range(d)], trace=True)
                for k, dev in enumerate(group):
                    sent[dev]["data"] += trace.bytes_sent[k]
                    gathered[k, s, r] = full[k]
        for k in range(d):
            for s in range(p):
                for n_index, n in enumerate(per_stage[s]):
                    parts = []
                    for r in range(t):
                        vector = gathered[k, s, r]
                        sizes = [math.prod(shape) for shape in shapes[s, r]]
                        lo = sum(sizes[:n_index])
                        with tf.device(devices[grid.device(k, s, r)]):
                            parts.append(tf.reshape(vector[lo:lo + sizes[n_index]], shapes[s, r][n_index]))
                    variable = weights[k, s][n]
                    variable.assign(dtensor.pack(parts, dtensor.fetch_layout(variable.read_value())))
        for dev in range(grid.devices):
            sent[dev]["pipeline"] = pipeline_sent[dev]
        losses.append(step_loss)

    shares, held_bytes = [], []
    for dev in range(grid.devices):
        s, rest = divmod(dev, d * t)
        k, r = divmod(rest, t)
        values = {n: dtensor.unpack(weights[k, s][n].read_value())[r].numpy() for n in per_stage[s]}
        shares.append(values)
        weight_bytes = sum(v.nbytes for v in values.values())
        optimizer_bytes = sum(int(np.prod(v.shape)) * 4 for v in optimizers[k, s, r].variables
                              if len(v.shape) > 0)
        held_bytes.append({"weights": weight_bytes, "gradients": grad_bytes[dev], "optimizer": optimizer_bytes,
                           "activations": kept_peak[dev],
                           "update copy": int(owned[k, s, r].shape.num_elements()) * owned[k, s, r].dtype.size})
    return Run(grid, losses, sent, held_bytes, shares, in_flight_peak, programs)
