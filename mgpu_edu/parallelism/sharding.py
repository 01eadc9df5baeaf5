"""Sharded data parallelism (ZeRO stages 0 to 3) written out by hand on the logical devices.

Every device trains on its share of each batch, as in lesson 02. What differs between the stages
is what each device *keeps* between steps, and so what it must send:

- stage 0 (plain data parallelism): every device keeps all the weights, all the gradients and
  all the optimizer state; the gradients are all-reduced (lesson 03's ring);
- stage 1: the optimizer state is sharded: device d keeps Adam's moments for shard d of every
  layer only. Gradients are reduce-scattered (the ring's first half), each device updates its
  own shard of the weights, and the shards are all-gathered back (the ring's second half);
- stage 2: the gradients are sharded too: device d keeps only shard d of the reduced gradients;
- stage 3: the weights are sharded too: before each layer runs, forward and again backward,
  its weights are all-gathered, and dropped after.

Stages 0 to 2 send 2(N−1)/N of the weights' bytes per device per step, stage 3 3(N−1)/N; with
gradient accumulation over M micro-batches, stage 2 sends (M+1)(N−1)/N and stage 3 3M(N−1)/N
(:func:`phases`).

TensorFlow has no production ZeRO (Keras 3's ``keras.distribution`` shards on the JAX backend;
DTensor is TensorFlow's experimental path); this module exists to show the idea, and is checked
against Keras's own one-device Adam step (tests/test_sharding.py). With no
GPU the devices are logical CPUs: the bytes and the arithmetic are real, the memory is one RAM.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, real_number, whole_number
from mgpu_edu.parallelism.allreduce import ring_all_gather, ring_allreduce, ring_reduce_scatter
from mgpu_edu.parallelism.parallel import shard_sizes, split_batch
from mgpu_edu.runtime import quiet

STAGES = (0, 1, 2, 3)


@dataclasses.dataclass
class _Layer:
    """One layer with weights: its Keras layer, its variables' shapes, and how its flat vector is sharded."""

    layer: Any
    shapes: list[tuple[int, ...]]
    size: int
    shards: list[int]  # elements of shard d, for each device d

    def unflatten(self, flat: Any) -> list[Any]:
        tf = quiet.import_tensorflow()
        sizes = [math.prod(shape) for shape in self.shapes]
        return [tf.reshape(part, shape) for part, shape in zip(tf.split(flat, sizes), self.shapes, strict=True)]

    def bounds(self, d: int) -> tuple[int, int]:
        start = sum(self.shards[:d])
        return start, start + self.shards[d]


def _check_model(model: Any) -> list[Any]:
    import keras

    if not isinstance(model, keras.Sequential):
        raise BadArgument(f"model is a {type(model).__name__}: ZeroDataParallel runs a keras.Sequential model layer "
                          "by layer. Build your model as keras.Sequential([...]).")
    if not model.built or not model.trainable_variables:
        raise BadArgument("model has no weights yet: build it first (start it with keras.Input(shape), or call "
                          "model.build((None, features))), then pass it to ZeroDataParallel.")
    frozen = [layer.name for layer in model.layers if layer.non_trainable_variables]
    if frozen:
        raise BadArgument(f"model has non-trainable state in layer(s) {', '.join(map(repr, frozen))} (such as "
                          "BatchNormalization's statistics or Dropout's random seed): this by-hand ZeRO shards "
                          "trainable weights only. Use a model of Dense or Conv layers, e.g. models.mlp(64, 10).")
    return list(model.layers)


def _check_devices(devices: Sequence[str]) -> list[str]:
    """The device names, each checked against the logical devices TensorFlow has."""
    tf = quiet.import_tensorflow()
    devices = list(devices)
    if not devices:
        raise BadArgument("devices is empty: pass the devices to shard over, e.g. mgpu_edu.logical_devices(4).")
    known = {(spec.device_type, spec.device_index) for spec in
             (tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices())}
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device)
        except (ValueError, TypeError):
            spec = None
        if spec is None or (spec.device_type, spec.device_index) not in known:
            names = [d.name for d in tf.config.list_logical_devices()]
            raise BadArgument(f"devices contains {device!r}, which is not one of TensorFlow's logical devices "
                              f"({', '.join(names)}). Pass names from mgpu_edu.logical_devices() or "
                              "mgpu_edu.setup_devices(n).")
    return devices


def _check_per_example(losses: Any, logits: Any) -> None:
    """loss_fn must return one loss per example: the step divides their sum by the global batch."""
    if len(losses.shape) != 1 or (losses.shape[0] is not None and losses.shape[0] != logits.shape[0]):
        raise BadArgument(f"loss_fn returned a tensor of shape {tuple(losses.shape)}, where ZeroDataParallel needs "
                          f"one loss per example (shape ({logits.shape[0]},)): the step divides their sum by the "
                          "global batch. Use models.per_example_loss(), or a Keras loss with reduction=None.")


#: Optimizer options that look at more than one weight at a time: sharding would change what they compute.
_WHOLE_MODEL_OPTIONS = {"clipnorm": "clips each variable's gradient by its norm",
                        "global_clipnorm": "clips by the norm of all the gradients together",
                        "use_ema": "keeps a moving average of the whole model",
                        "gradient_accumulation_steps": "accumulates inside the optimizer"}


def _check_optimizer(optimizer: Any, stage: int, device: str) -> None:
    """BadArgument if the optimizer has no per-weight state to shard (stages 1–3), or an option sharding would break."""
    tf = quiet.import_tensorflow()
    config = optimizer.get_config()
    for option, what in _WHOLE_MODEL_OPTIONS.items():
        if config.get(option) not in (None, False):
            raise BadArgument(f"optimizer has {option}={config[option]!r}: it {what}, and this by-hand ZeRO updates "
                              "each device's flat shards on their own, so the step would differ from one device's. "
                              f"Build the optimizer without {option} (clipvalue, element by element, is fine).")
    if stage == 0:
        return
    with tf.device(device):
        copy = optimizer.__class__.from_config(config)
        probe = tf.Variable(tf.zeros([3]))
        copy.build([probe])
    if not any(tuple(v.shape) == (3,) for v in copy.variables):
        raise BadArgument(f"optimizer={type(optimizer).__name__} keeps no state per weight, and ZeRO's stages 1–3 "
                          f"all shard the optimizer state (stage={stage}). Use an optimizer with slots, e.g. "
                          "keras.optimizers.Adam(0.01) or SGD(0.1, momentum=0.9); stage 0 takes any optimizer.")


class ZeroDataParallel:
    """Train a keras.Sequential model with ZeRO ``stage`` (0–3) over ``devices``; see the module docstring.

    ``step(x, y, loss_fn, micro_batches=1)`` takes one step on the batch (x, y) split over the
    devices (shards that differ by at most one example; empty shards are fine), where
    ``loss_fn(y, logits)`` returns per-example losses; with ``micro_batches`` > 1 each device
    accumulates its share's gradients over that many micro-batches. After it:

    - ``bytes_sent``: the bytes each device sent in that step, counted from the ring's real
      transfers (:func:`mgpu_edu.allreduce.ring_reduce_scatter` and friends);
    - ``resident_bytes()``: per device, what it keeps between steps, read from the tensors
      and variables placed on it: ``params``, ``grads``, ``optimizer`` (the per-weight state)
      and ``other`` (the optimizer's step counter and learning rate);
    - ``full_weights()``: the whole model's weights, gathered, in ``model.get_weights()`` order;
    - ``gathered_peak``: with stage 3, the most bytes of gathered whole-layer weights a device held at once:
      the largest layer's, or with ``prefetch=True``, which gathers the next layer's weights before this layer
      computes (so that, on GPUs, the gather runs behind the computation, as FSDP prefetches), the largest
      two consecutive layers' (:func:`mgpu_edu.memory.gathered_bytes`). Prefetching changes when, not what:
      the same bytes, the same step.

    The optimizer must keep per-weight state (Adam, RMSprop, SGD with momentum); it is copied
    per device from its config. The model is left unchanged. With no GPU the devices are
    logical CPUs.

    Example:
        >>> zero = ZeroDataParallel(models.mlp(64, 10), keras.optimizers.Adam(0.01), devices, stage=3)  # doctest: +SKIP
        >>> zero.step(x, y, models.per_example_loss())  # doctest: +SKIP
    """

    def __init__(self, model: Any, optimizer: Any, devices: Sequence[str], stage: int, prefetch: bool = False) -> None:
        tf = quiet.import_tensorflow()
        whole_number("stage", stage, minimum=0, maximum=3, hint="ZeRO has stages 0 (plain data parallelism) to 3.")
        if prefetch and stage != 3:
            raise BadArgument(f"prefetch=True gathers the next layer's weights early, which only ZeRO-3 gathers: got "
                              f"stage={stage}. Use stage=3, or prefetch=False.")
        self.prefetch = bool(prefetch)
        self._held: dict[int, list[Any]] = {}  # ZeRO-3: the layers whose whole weights are gathered now
        self.gathered_peak = 0  # ZeRO-3: the most bytes of gathered weights a device held at once in the last step
        self.devices = _check_devices(devices)
        self.stage, self.n = stage, len(self.devices)
        self.layers = _check_model(model)
        self.weighted: list[_Layer] = []
        for layer in self.layers:
            if layer.trainable_variables:
                shapes = [tuple(v.shape) for v in layer.trainable_variables]
                size = sum(int(v.numpy().size) for v in layer.trainable_variables)
                self.weighted.append(_Layer(layer, shapes, size, shard_sizes(size, self.n)))
        self.params = sum(w.size for w in self.weighted)
        flat = [tf.concat([tf.reshape(v, [-1]) for v in w.layer.trainable_variables], 0) for w in self.weighted]
        _check_optimizer(optimizer, stage, self.devices[0])
        # what each device keeps between steps, per weighted layer
        self._weights: list[list[Any]] = []  # stage 0: the full vector; 1-2: N pieces; 3: its own shard
        self._grads: list[list[Any]] = []  # stages 0-1: the full gradient; 2-3: its own shard
        self._optimizers: list[Any] = []
        for d, device in enumerate(self.devices):
            with tf.device(device):
                weights, grads = [], []
                for w, vector in zip(self.weighted, flat, strict=True):
                    start, end = w.bounds(d)
                    if stage == 0:
                        weights.append(tf.Variable(vector))
                    elif stage in (1, 2):  # own shard as a variable, the others as plain copies
                        weights.append([tf.Variable(vector[start:end]) if j == d else
                                        tf.identity(vector[slice(*w.bounds(j))]) for j in range(self.n)])
                    else:
                        weights.append(tf.Variable(vector[start:end]))
                    grads.append(tf.Variable(tf.zeros([w.size if stage <= 1 else end - start])))
                optimizer_copy = optimizer.__class__.from_config(optimizer.get_config())
                optimizer_copy.build(self._owned(weights, d))
            self._weights.append(weights)
            self._grads.append(grads)
            self._optimizers.append(optimizer_copy)
        self.bytes_sent = [0] * self.n

    # ------------------------------------------------------------------ what each device holds

    def _owned(self, weights: list[Any], d: int) -> list[Any]:
        """The variables device d's optimizer updates: the full vectors (stage 0), else its own shards."""
        if self.stage == 0:
            return list(weights)
        if self.stage in (1, 2):
            return [pieces[d] for pieces in weights]
        return list(weights)

    def _full(self, d: int, i: int) -> Any:
        """Layer i's whole flat weight vector as device d holds it (stages 0-2 only)."""
        tf = quiet.import_tensorflow()
        held = self._weights[d][i]
        if self.stage == 0:
            return tf.convert_to_tensor(held)
        with tf.device(self.devices[d]):
            return tf.concat([tf.convert_to_tensor(piece) for piece in held], axis=0)

    def _gather(self, i: int) -> list[Any]:
        """Layer i's whole weights on every device: stage 3 all-gathers the shards (and counts the bytes), unless
        they are held already (prefetched), and holds them until :meth:`_release`."""
        if self.stage < 3:
            return [self._full(d, i) for d in range(self.n)]
        if i not in self._held:
            quiet.import_tensorflow()
            full, trace = ring_all_gather([self._weights[d][i].value() for d in range(self.n)], trace=True)
            self._count(trace)
            self._held[i] = full
            held = sum(self.weighted[j].size for j in self._held) * full[0].dtype.size
            self.gathered_peak = max(self.gathered_peak, held)
        return self._held[i]

    def _release(self, i: int | None) -> None:
        """Drop layer i's gathered weights (ZeRO-3): each device keeps only its shard again."""
        self._held.pop(i, None)

    def _use(self, order: list[int], position: int) -> list[Any] | None:
        """The whole weights of the weighted layer at ``position`` of ``order``; with ``prefetch``, also gather the
        next one in ``order`` now, so that its all-gather can run while this layer computes."""
        full = self._gather(order[position])
        if self.prefetch and position + 1 < len(order):
            self._gather(order[position + 1])
        return full

    def _count(self, trace: Any) -> None:
        self.bytes_sent = [a + b for a, b in zip(self.bytes_sent, trace.bytes_sent, strict=True)]

    def resident_bytes(self) -> list[dict[str, int]]:
        """Per device: bytes of weights, gradients, per-weight optimizer state, and other optimizer state it holds."""
        tf = quiet.import_tensorflow()

        def nbytes(tensors: Sequence[Any]) -> int:
            return sum(int(tf.size(t)) * t.dtype.size for t in tensors)

        rows = []
        for d in range(self.n):
            weights = self._weights[d]
            if self.stage in (1, 2):
                weights = [piece for pieces in weights for piece in pieces]
            owned = {id(v) for v in self._owned(self._weights[d], d)}
            shapes = {tuple(v.shape) for v in self._owned(self._weights[d], d)}
            state = [v for v in self._optimizers[d].variables if tuple(v.shape) in shapes and id(v) not in owned]
            other = [v for v in self._optimizers[d].variables if tuple(v.shape) not in shapes]
            rows.append({"params": nbytes(weights), "grads": nbytes(self._grads[d]),
                         "optimizer": nbytes([v.value for v in state]), "other": nbytes([v.value for v in other])})
        return rows

    def full_weights(self) -> list[Any]:
        """The model's weights as arrays, in ``model.get_weights()`` order, gathered from the devices."""
        tf = quiet.import_tensorflow()
        weights = []
        for i, w in enumerate(self.weighted):
            if self.stage < 3:
                flat = self._full(0, i)
            else:
                flat = tf.concat([self._weights[d][i].value() for d in range(self.n)], axis=0)
            weights += [t.numpy() for t in w.unflatten(flat)]
        return weights

    # ------------------------------------------------------------------ one step

    def step(self, x: Any, y: Any, loss_fn: Callable[[Any, Any], Any], micro_batches: int = 1) -> float:
        """One training step on (x, y) split over the devices; returns the batch's mean loss.

        With ``micro_batches`` = M > 1 each device runs its share as M micro-batches, one after
        another, and the step updates once (gradient accumulation): the same step, with one
        micro-batch's activations in flight. Stages 0–1 add each micro-batch's gradients into
        their full local buffer and combine once; stage 2 keeps only a shard of the gradients,
        so it reduce-scatters every micro-batch's; stage 3 also gathers every layer's weights
        twice per micro-batch.
        """
        tf = quiet.import_tensorflow()
        whole_number("micro_batches", micro_batches, example=2,
                     hint="It is how many micro-batches each device's share runs as (gradient accumulation).")
        if len(x) != len(y) or len(x) == 0:
            raise BadArgument(f"x has {len(x)} examples and y {len(y)}: a step needs at least one example, and one "
                              "label per example. Pass matching slices, e.g. x[:64] and y[:64].")
        self.bytes_sent = [0] * self.n
        self.gathered_peak = 0
        total = tf.cast(tf.shape(x)[0], tf.float32)
        shares = [(split_batch(xd, micro_batches), split_batch(yd, micro_batches))
                  for xd, yd in zip(split_batch(x, self.n), split_batch(y, self.n), strict=True)]
        losses = []
        for m in range(micro_batches):
            losses += self._forward_backward([xs[m] for xs, _ in shares], [ys[m] for _, ys in shares], loss_fn,
                                             total, first=m == 0, last=m == micro_batches - 1)
        self._update()
        return float(tf.add_n([tf.identity(loss) for loss in losses]))

    def _forward_backward(self, xs: list[Any], ys: list[Any], loss_fn: Callable[[Any, Any], Any], total: Any,
                          first: bool, last: bool) -> list[Any]:
        """Forward and backward for one micro-batch (xs[d], ys[d] on device d); returns each device's loss part."""
        tf = quiet.import_tensorflow()
        # forward, layer by layer on every device, keeping each layer's input for the backward pass
        inputs: list[list[Any]] = []
        activations = []
        for d in range(self.n):
            with tf.device(self.devices[d]):
                activations.append(tf.identity(xs[d]))
        index = {id(w.layer): i for i, w in enumerate(self.weighted)}
        order = [index[id(layer)] for layer in self.layers if id(layer) in index]  # the weighted layers, in use order
        for layer in self.layers:
            inputs.append(activations)
            i = index.get(id(layer))
            full = self._use(order, order.index(i)) if i is not None else None
            outputs = []
            for d in range(self.n):
                with tf.device(self.devices[d]):
                    weights = self.weighted[index[id(layer)]].unflatten(full[d]) if full is not None else []
                    outputs.append(layer.stateless_call(weights, [], activations[d], training=True)[0])
            activations = outputs
            self._release(i)  # the gathered weights (stage 3) are dropped here
        upstream, losses = [], []
        for d in range(self.n):
            with tf.device(self.devices[d]), tf.GradientTape() as tape:
                tape.watch(activations[d])
                per_example = loss_fn(ys[d], activations[d])
                _check_per_example(per_example, activations[d])
                loss = tf.reduce_sum(per_example) / total  # this share's part of the batch's mean
            upstream.append(tape.gradient(loss, activations[d]))
            losses.append(loss)
        # backward, last layer first; each weighted layer's gradients are combined as the stage says
        for layer, layer_inputs in zip(reversed(self.layers), reversed(inputs), strict=True):
            i = index.get(id(layer))
            backward_order = order[::-1]  # stage 3 gathers again: it dropped them
            full = self._use(backward_order, backward_order.index(i)) if i is not None else None
            local, downstream = [], []
            for d in range(self.n):
                with tf.device(self.devices[d]), tf.GradientTape() as tape:
                    a = layer_inputs[d]
                    tape.watch(a)
                    weights = self.weighted[i].unflatten(full[d]) if i is not None else []
                    tape.watch(weights)
                    out = layer.stateless_call(weights, [], a, training=True)[0]
                grads = tape.gradient(out, [a, *weights], output_gradients=upstream[d])
                downstream.append(grads[0])
                if i is not None:
                    with tf.device(self.devices[d]):
                        local.append(tf.concat([tf.reshape(g, [-1]) for g in grads[1:]], axis=0))
            upstream = downstream
            self._release(i)
            if i is not None:
                self._combine(i, local, first, last)
        return losses

    def _combine(self, i: int, local: list[Any], first: bool = True, last: bool = True) -> None:
        """Combine layer i's gradients from every device, keeping what this stage keeps.

        ``first`` and ``last`` say whether this is the step's first and last micro-batch:
        stages 0–1 add into their full local buffer and combine after the last; stages 2–3
        reduce-scatter every micro-batch's gradients and add them into their shard.
        """
        def keep(target: Any, value: Any) -> None:
            target.assign(value) if first else target.assign_add(value)

        if self.stage <= 1:  # a full gradient buffer per device: accumulate locally, combine once
            for d in range(self.n):
                keep(self._grads[d][i], local[d])
            if not last:
                return
            local = [self._grads[d][i].value() for d in range(self.n)]
            first = True  # what the ring returns replaces the buffer's contents
        if self.stage == 0:
            reduced, trace = ring_allreduce(local, trace=True)
            for d in range(self.n):
                keep(self._grads[d][i], reduced[d])
        else:
            reduced, trace = ring_reduce_scatter(local, trace=True)
            for d in range(self.n):
                if self.stage == 1:  # only shard d of the full buffer is summed; keep it there
                    keep(self._grads[d][i][slice(*self.weighted[i].bounds(d))], reduced[d])
                else:
                    keep(self._grads[d][i], reduced[d])
        self._count(trace)

    def _update(self) -> None:
        """Each device's optimizer updates what it owns; stages 1-2 then all-gather the new shards."""
        tf = quiet.import_tensorflow()
        for d in range(self.n):
            with tf.device(self.devices[d]):
                owned = self._owned(self._weights[d], d)
                if self.stage == 1:
                    grads = [g.value()[slice(*w.bounds(d))] for g, w in zip(self._grads[d], self.weighted,
                                                                            strict=True)]
                else:
                    grads = [g.value() for g in self._grads[d]]
                self._optimizers[d].apply_gradients(zip(grads, owned, strict=True))
        if self.stage in (1, 2):
            for i in range(len(self.weighted)):
                full, trace = ring_all_gather([self._weights[d][i][d].value() for d in range(self.n)], trace=True)
                self._count(trace)
                for d in range(self.n):
                    with tf.device(self.devices[d]):
                        for j in range(self.n):
                            if j != d:
                                self._weights[d][i][j] = full[d][slice(*self.weighted[i].bounds(j))]


def phases(stage: int, micro_batches: int = 1, reshard: bool = True) -> int:
    """Ring phases (a reduce-scatter or an all-gather of the whole model) per step under ZeRO ``stage``.

    Stages 0–1: 2 (the gradients' reduce-scatter and the weights' all-gather, or one all-reduce,
    which is both), however many micro-batches, as they add gradients into a full local buffer.
    Stage 2 keeps only a shard of the gradients, so it reduce-scatters each of the M
    micro-batches': M + 1. Stage 3 gathers the weights forward and backward, and reduce-scatters,
    for every micro-batch: 3M. With ``reshard=False`` (PyTorch FSDP's ``reshard_after_forward=False``,
    as Llama 3 trained) stage 3 keeps the gathered weights from the forward pass for the backward, and
    with micro-batches in flight they stay gathered through the step: one gather, and a reduce-scatter
    per micro-batch, M + 1, as stage 2.

    Example:
        >>> [phases(stage, micro_batches=4) for stage in (0, 1, 2, 3)], phases(3, 4, reshard=False)
        ([2, 2, 5, 12], 5)
    """
    whole_number("stage", stage, minimum=0, maximum=3, hint="ZeRO has stages 0 to 3.")
    m = whole_number("micro_batches", micro_batches, hint="It is the number of micro-batches per step.")
    return 2 if stage <= 1 else m + 1 if stage == 2 or not reshard else 3 * m


def bytes_per_device(stage: int, n: int, param_bytes: float, micro_batches: int = 1, reshard: bool = True) -> float:
    """Bytes each device sends per step under ZeRO ``stage`` over n devices: 2(N−1)/N·S (stages 0–2) or 3(N−1)/N·S.

    Each ring phase sends (N−1)/N of the weights' bytes S per device; :func:`phases` counts
    them, so with ``micro_batches`` M > 1 stage 2 sends (M+1)(N−1)/N·S and stage 3 3M(N−1)/N·S.
    Stage 3's third phase is the second all-gather of every layer's weights, for the backward pass
    (none with ``reshard=False``).

    Example:
        >>> bytes_per_device(3, 4, 1000) / bytes_per_device(0, 4, 1000)
        1.5
    """
    whole_number("n", n, hint="It is the number of data-parallel devices.")
    real_number("param_bytes", param_bytes, minimum=0)
    return phases(stage, micro_batches, reshard) * (n - 1) / n * param_bytes


def comm_seconds(stage: int, n: int, param_bytes: float, alpha_s: float = 1e-5,
                 beta_s_per_byte: float = 1 / 10e9, micro_batches: int = 1) -> float:
    """Lesson 03's α + β·bytes model for one ZeRO step: :func:`phases` ring phases of N−1 steps, each a chunk S/N.

    Stage 0 gives :func:`mgpu_edu.allreduce.alpha_beta_time` for the ring. Each phase is one
    collective over the whole model; real ZeRO-3 runs one per layer, so its latency (α) term is
    about L times larger for L layers, which matters only for small messages.

    Example:
        >>> round(comm_seconds(3, 8, 1e9, alpha_s=0, beta_s_per_byte=1e-9), 3)
        2.625
    """
    whole_number("n", n, hint="It is the number of data-parallel devices.")
    real_number("param_bytes", param_bytes, minimum=0)
    count = phases(stage, micro_batches)
    return count * (n - 1) * (alpha_s + beta_s_per_byte * param_bytes / n) if n > 1 else 0.0
