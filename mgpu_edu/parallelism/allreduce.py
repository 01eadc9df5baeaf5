"""All-reduce step by step: every device ends with the sum of every device's tensor.

Three algorithms, each written as a *schedule* (who sends which chunk to whom at each step)
and run by one executor:

- :func:`reduce_to_one_allreduce`: everyone sends to a root, the root adds and sends the sum
  back. Simple; the root's link carries (N−1)·S each way.
- :func:`ring_allreduce`: the tensor is cut into N chunks that travel round a ring,
  first adding (reduce-scatter, N−1 steps) then copying (all-gather, N−1 steps). Every
  device sends 2(N−1)/N·S, whatever N is.
- :func:`tree_allreduce`: pairs add up a binary tree to device 0 and the sum comes back down:
  2·⌈log2 N⌉ steps.

On TensorFlow tensors placed on logical devices, a "send" is a real copy to the receiving
device (``tf.device`` on the receiver). :func:`simulate` runs the same schedules on NumPy
arrays for any N, which is what the step-through widget draws. No GPU needed for either.
The other collectives (:mod:`mgpu_edu.collectives`) run their schedules on the same executor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from mgpu_edu._validate import BadArgument, one_of, whole_number
from mgpu_edu.parallelism.parallel import shard_sizes
from mgpu_edu.runtime import quiet
from mgpu_edu.runtime.strategies import make_strategy

ALGORITHMS = ("ring", "reduce_to_one", "tree")


@dataclasses.dataclass(frozen=True)
class Send:
    """One message: src sends its chunk ``chunk`` to dst, which adds it ("add") or stores it ("copy").

    The receiver puts it in its own chunk ``into`` (default: the same chunk number).
    """

    src: int
    dst: int
    chunk: int
    op: str
    nbytes: int = 0
    into: int | None = None

    @property
    def target(self) -> int:
        """The receiver's chunk that the message lands in."""
        return self.chunk if self.into is None else self.into


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a schedule, and each device's chunk states after it.

    ``state[d][c]`` is the tuple of devices whose data chunk c on device d holds the sum of.
    """

    index: int
    phase: str
    sends: tuple[Send, ...]
    state: tuple[tuple[tuple[int, ...], ...], ...]


@dataclasses.dataclass(frozen=True)
class Trace:
    """Everything that moved in one all-reduce."""

    algorithm: str
    n: int
    chunk_bytes: tuple[int, ...]
    initial: tuple[tuple[tuple[int, ...], ...], ...]
    steps: tuple[Step, ...]
    #: What each chunk column is, where "chunk c" would mislead (the ring's halves carry shard c − 1 in chunk c).
    labels: tuple[str, ...] | None = None

    @property
    def total_bytes(self) -> int:
        """Size S of one device's tensor, in bytes."""
        return sum(self.chunk_bytes)

    def _bytes_by(self, side: str, steps: int | None = None) -> list[int]:
        totals = [0] * self.n
        for step in self.steps[:steps]:
            for send in step.sends:
                totals[getattr(send, side)] += send.nbytes
        return totals

    @property
    def bytes_sent(self) -> list[int]:
        """Bytes each device sent in total."""
        return self._bytes_by("src")

    @property
    def bytes_received(self) -> list[int]:
        """Bytes each device received in total."""
        return self._bytes_by("dst")

    def bytes_sent_until(self, k: int) -> list[int]:
        """Bytes each device had sent after the first k steps."""
        return self._bytes_by("src", k)

    def state_at(self, k: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Chunk states after step k (k=0: before any step)."""
        return self.initial if k == 0 else self.steps[k - 1].state


# ----------------------------------------------------------------------------- schedules


def ring_schedule(n: int) -> tuple[int, list[tuple[str, list[Send]]]]:
    """The ring's (chunks, steps): reduce-scatter then all-gather, N−1 steps each.

    At reduce-scatter step s, device i sends chunk (i − s) mod N to device i + 1, which adds
    it. Afterwards device i holds the full sum of chunk (i + 1) mod N, and the all-gather
    passes the finished chunks round the same ring.

    Example:
        >>> chunks, steps = ring_schedule(3)
        >>> chunks, len(steps), [(s.src, s.dst, s.chunk) for s in steps[0][1]]
        (3, 4, [(0, 1, 0), (1, 2, 1), (2, 0, 2)])
    """
    steps = []
    for s in range(n - 1):
        steps.append(("reduce-scatter", [Send(i, (i + 1) % n, (i - s) % n, "add") for i in range(n)]))
    for s in range(n - 1):
        steps.append(("all-gather", [Send(i, (i + 1) % n, (i + 1 - s) % n, "copy") for i in range(n)]))
    return n, steps


def reduce_to_one_schedule(n: int, root: int = 0) -> tuple[int, list[tuple[str, list[Send]]]]:
    """Reduce to the root in one step (everyone sends its whole tensor), then broadcast back.

    Example:
        >>> chunks, steps = reduce_to_one_schedule(3, root=1)
        >>> [(phase, [(s.src, s.dst) for s in sends]) for phase, sends in steps]
        [('reduce', [(0, 1), (2, 1)]), ('broadcast', [(1, 0), (1, 2)])]
    """
    others = [i for i in range(n) if i != root]
    if not others:
        return 1, []
    return 1, [("reduce", [Send(i, root, 0, "add") for i in others]),
               ("broadcast", [Send(root, i, 0, "copy") for i in others])]


def tree_schedule(n: int) -> tuple[int, list[tuple[str, list[Send]]]]:
    """Binary tree: at stride 1, 2, 4 … device i + stride adds into device i; then back down.

    Works for any N (devices without a partner wait that step out).

    Example:
        >>> chunks, steps = tree_schedule(4)
        >>> [(phase, [(s.src, s.dst) for s in sends]) for phase, sends in steps]
        [('reduce', [(1, 0), (3, 2)]), ('reduce', [(2, 0)]), ('broadcast', [(0, 2)]), ('broadcast', [(0, 1), (2, 3)])]
    """
    up = []
    stride = 1
    while stride < n:
        up.append([Send(i + stride, i, 0, "add") for i in range(0, n, 2 * stride) if i + stride < n])
        stride *= 2
    down = [[Send(s.dst, s.src, 0, "copy") for s in sends] for sends in reversed(up)]
    return 1, [("reduce", sends) for sends in up] + [("broadcast", sends) for sends in down]


_SCHEDULES: dict[str, Callable[..., tuple[int, list[tuple[str, list[Send]]]]]] = {
    "ring": ring_schedule, "reduce_to_one": reduce_to_one_schedule, "tree": tree_schedule}


# ----------------------------------------------------------------------------- executor


class ChunkOps:
    """How the executor cuts, joins, adds and moves one device's chunks: on NumPy arrays (this class) or
    on TensorFlow devices (:class:`TensorFlowOps`). Every method gets d, the device it runs for."""

    def split(self, d: int, value: Any, sizes: Sequence[int]) -> list[Any]:
        import numpy as np

        return list(np.split(value, np.cumsum(sizes)[:-1].astype(int), axis=0))

    def concat(self, d: int, chunks: Sequence[Any]) -> Any:
        import numpy as np

        return np.concatenate(chunks, axis=0)

    def zeros(self, d: int, like: Any) -> Any:
        import numpy as np

        return np.zeros_like(like)

    def add(self, d: int, mine: Any, incoming: Any) -> Any:
        return mine + incoming

    def copy(self, d: int, incoming: Any) -> Any:
        return incoming.copy()


NumPyOps = ChunkOps  # the NumPy version, for simulate (one process, no devices)


class TensorFlowOps(ChunkOps):
    """The same on TensorFlow tensors, each op on device d: an add or copy there receives the incoming chunk."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.tf, self.devices = quiet.import_tensorflow(), list(devices)

    def split(self, d: int, value: Any, sizes: Sequence[int]) -> list[Any]:
        with self.tf.device(self.devices[d]):
            return list(self.tf.split(value, list(sizes), axis=0))

    def concat(self, d: int, chunks: Sequence[Any]) -> Any:
        with self.tf.device(self.devices[d]):
            return self.tf.concat(list(chunks), axis=0)

    def zeros(self, d: int, like: Any) -> Any:
        with self.tf.device(self.devices[d]):
            return self.tf.zeros(like.shape, like.dtype)

    def add(self, d: int, mine: Any, incoming: Any) -> Any:
        with self.tf.device(self.devices[d]):
            return mine + incoming  # runs on d, so incoming is copied there: the send

    def copy(self, d: int, incoming: Any) -> Any:
        with self.tf.device(self.devices[d]):
            return self.tf.identity(incoming)


def execute(values: list[list[Any]], schedule: list[tuple[str, list[Send]]], itemsize: int, ops: ChunkOps,
            algorithm: str, initial: Sequence[Sequence[tuple[int, ...]]] | None = None,
            labels: Sequence[str] | None = None) -> tuple[list[list[Any]], Trace]:
    """Run a schedule on per-device chunk lists (``values[d][c]``); every step reads the values from before it.

    ``initial[d][c]`` says whose data chunk c on device d starts with (default: device d's own;
    ``()`` for an empty buffer that a send will fill). Each send's bytes are the size of the chunk
    it carries. ``labels`` name the chunk columns in drawings. Returns the chunk lists after the last
    step and the :class:`Trace`.
    """
    n = len(values)
    sizes = [_elements(v) for v in values[0]]
    state = [list(chunks) for chunks in initial] if initial is not None else [[(d,) for _ in values[d]]
                                                                               for d in range(n)]
    first = tuple(tuple(chunks) for chunks in state)
    steps = []
    for index, (phase, sends) in enumerate(schedule, start=1):
        old_values = [list(chunks) for chunks in values]
        old_state = [list(chunks) for chunks in state]
        recorded = []
        for send in sends:  # several adds into one chunk in a step accumulate (reduce-to-one's root)
            incoming, target = old_values[send.src][send.chunk], send.target
            if send.op == "add":
                values[send.dst][target] = ops.add(send.dst, values[send.dst][target], incoming)
                state[send.dst][target] = tuple(sorted(state[send.dst][target] + old_state[send.src][send.chunk]))
            else:
                values[send.dst][target] = ops.copy(send.dst, incoming)
                state[send.dst][target] = old_state[send.src][send.chunk]
            recorded.append(dataclasses.replace(send, nbytes=_elements(incoming) * itemsize))
        steps.append(Step(index, phase, tuple(recorded), tuple(tuple(chunks) for chunks in state)))
    trace = Trace(algorithm, n, tuple(s * itemsize for s in sizes), first, tuple(steps),
                  tuple(labels) if labels is not None else None)
    return values, trace


def _elements(value: Any) -> int:
    """How many numbers a chunk holds (a TensorFlow tensor or a NumPy array)."""
    return math.prod(int(size) for size in value.shape)


def check_tensors(tensors: Sequence[Any], name: str) -> list[Any]:
    """One tensor per device, all of one shape and dtype, or a BadArgument that says what differs."""
    tensors = list(tensors)
    if not tensors:
        raise BadArgument(f"{name} needs at least one tensor (one per device), got an empty list.")
    shapes = [tuple(t.shape) for t in tensors]
    dtypes = [getattr(t.dtype, "name", str(t.dtype)) for t in tensors]
    if len(set(shapes)) > 1:
        raise BadArgument(f"{name}: every tensor must have the same shape, got shapes {shapes}. "
                          "Each device must hold a tensor of the same shape: one piece of the same collective each.")
    if len(set(dtypes)) > 1:
        raise BadArgument(f"{name}: every tensor must have the same dtype, got dtypes {dtypes}. "
                          "Cast them to one dtype (e.g. tf.cast(t, tf.float32)) first.")
    return tensors


def _allreduce_tf(tensors: Sequence[Any], algorithm: str, trace: bool, **options: Any) -> Any:
    tf = quiet.import_tensorflow()
    tensors = check_tensors(tensors, f"{algorithm}_allreduce")
    ops = TensorFlowOps([t.device for t in tensors])
    chunks, schedule = _SCHEDULES[algorithm](len(tensors), **options)
    sizes = shard_sizes(tensors[0].shape.num_elements(), chunks)  # static: runs eagerly and traced
    values = []
    for d, tensor in enumerate(tensors):
        with tf.device(ops.devices[d]):  # everything but the sends stays on each tensor's own device
            values.append(ops.split(d, tf.reshape(tensor, [-1]), sizes))
    values, record = execute(values, schedule, tensors[0].dtype.size, ops, algorithm)
    results = []
    for d, chunks_ in enumerate(values):
        with tf.device(ops.devices[d]):
            results.append(tf.reshape(ops.concat(d, chunks_), tensors[0].shape))
    return (results, record) if trace else results


def _shard_order(n: int) -> list[int]:
    """The ring leaves chunk (d + 1) mod N finished on device d; chunk c carries shard (c − 1) mod N, so
    device d ends up owning shard d."""
    return [(c - 1) % n for c in range(n)]


def reduce_scatter_rows(values: Sequence[Any], ops: ChunkOps, itemsize: int,
                        label: str = "ring reduce-scatter") -> tuple[list[Any], Trace]:
    """The ring's reduce-scatter on one value per device, cut along axis 0: device d ends with the sum of shard d.

    The shards are :func:`mgpu_edu.parallel.shard_sizes` of the first axis (``numpy.array_split``'s
    sizes). It runs the N−1 reduce-scatter steps of :func:`ring_schedule`.
    """
    n = len(values)
    sizes, order = shard_sizes(int(values[0].shape[0]), n), _shard_order(n)
    chunks = []
    for d, value in enumerate(values):
        shards = ops.split(d, value, sizes)
        chunks.append([shards[order[c]] for c in range(n)])
    chunks, record = execute(chunks, ring_schedule(n)[1][: n - 1], itemsize, ops, label,
                             labels=[f"shard {order[c]}" for c in range(n)])
    return [chunks[d][(d + 1) % n] for d in range(n)], record


def all_gather_rows(shards: Sequence[Any], ops: ChunkOps, itemsize: int,
                    label: str = "ring all-gather") -> tuple[list[Any], Trace]:
    """The ring's all-gather: every device ends with the shards concatenated along axis 0, in device order.

    Shard d starts on device d; the other chunks start as empty buffers (zeros of their size) and
    fill as the shards travel round the ring, in the N−1 all-gather steps of :func:`ring_schedule`.
    """
    n = len(shards)
    order = _shard_order(n)
    chunks = [[shards[d] if c == (d + 1) % n else ops.zeros(d, shards[order[c]]) for c in range(n)]
              for d in range(n)]
    empty = [[(d,) if c == (d + 1) % n else () for c in range(n)] for d in range(n)]
    chunks, record = execute(chunks, ring_schedule(n)[1][n - 1:], itemsize, ops, label, initial=empty,
                             labels=[f"shard {order[c]}" for c in range(n)])
    return [ops.concat(d, [chunks[d][order.index(j)] for j in range(n)]) for d in range(n)], record


def ring_reduce_scatter(tensors: Sequence[Any], trace: bool = False) -> Any:
    """The ring's first half on its own: device d ends with the sum, over every device, of shard d.

    Each tensor (one per device, same shape) is flattened and cut into N shards as
    :func:`mgpu_edu.parallel.shard_sizes` cuts it (sizes differ by at most one); the result
    is N flat tensors, shard d summed, on device d. It runs the N−1 reduce-scatter steps of
    :func:`ring_schedule`, so each device sends (N−1)/N of the tensor. ZeRO's gradients go
    this way. With trace=True returns ``(shards, trace)``.

    Example:
        >>> [t.numpy().tolist() for t in ring_reduce_scatter([tf.ones(5), tf.ones(5)])]  # doctest: +SKIP
        [[2.0, 2.0, 2.0], [2.0, 2.0]]
    """
    tf = quiet.import_tensorflow()
    tensors = check_tensors(tensors, "ring_reduce_scatter")
    ops = TensorFlowOps([t.device for t in tensors])
    flat = []
    for d, tensor in enumerate(tensors):
        with tf.device(ops.devices[d]):
            flat.append(tf.reshape(tensor, [-1]))
    owned, record = reduce_scatter_rows(flat, ops, tensors[0].dtype.size)
    return (owned, record) if trace else owned


def ring_all_gather(shards: Sequence[Any], trace: bool = False) -> Any:
    """The ring's second half on its own: every device ends with all the shards, in order, as one flat tensor.

    ``shards[d]`` is a flat tensor on device d (sizes may differ, as :func:`ring_reduce_scatter`
    leaves them); the result is N copies of their concatenation, copy d on device d. It runs
    the N−1 all-gather steps of :func:`ring_schedule`, so each device sends (N−1)/N of the
    whole. ZeRO's parameters go this way. With trace=True returns ``(tensors, trace)``.
    """
    shards = list(shards)
    if not shards:
        raise BadArgument("ring_all_gather needs one shard per device, got an empty list.")
    if any(len(s.shape) != 1 for s in shards):
        raise BadArgument("ring_all_gather: every shard must be a flat (1-D) tensor; got shapes "
                          f"{[tuple(s.shape) for s in shards]}. Reshape them with tf.reshape(s, [-1]).")
    if len({s.dtype for s in shards}) > 1:
        raise BadArgument(f"ring_all_gather: the shards must share one dtype; got {[s.dtype.name for s in shards]}. "
                          "Cast them first, e.g. tf.cast(s, tf.float32).")
    gathered, record = all_gather_rows(shards, TensorFlowOps([s.device for s in shards]), shards[0].dtype.size)
    return (gathered, record) if trace else gathered


def ring_allreduce(tensors: Sequence[Any], trace: bool = False) -> Any:
    """Ring all-reduce of N tensors (tensor i on device i); returns N sums, each on its input's device.

    Any shape and length (a length not divisible by N gives chunks that differ by one
    element), float32 or float64, N = 1 included. With trace=True returns
    ``(results, trace)``; ``trace.steps`` lists every send and ``trace.bytes_sent`` the bytes
    each device sent. No GPU: the devices are logical CPUs and the sends are memory copies.

    Example:
        >>> tensors = [tf.fill([6], float(i)) for i in range(3)]  # one per device  # doctest: +SKIP
        >>> [t.numpy().tolist() for t in ring_allreduce(tensors)]  # doctest: +SKIP
        [[3.0, 3.0, 3.0, 3.0, 3.0, 3.0], [3.0, ...], [3.0, ...]]
    """
    return _allreduce_tf(tensors, "ring", trace)


def reduce_to_one_allreduce(tensors: Sequence[Any], root: int = 0, trace: bool = False) -> Any:
    """Reduce-to-one-then-broadcast all-reduce; same contract as :func:`ring_allreduce`.

    Every other device sends its whole tensor to ``root``, which adds them and sends the
    sum back: the root sends (N−1)·S bytes. TensorFlow's version is ``ReductionToOneDevice``:
    older TensorFlow fell back to it on logical GPUs; today MirroredStrategy runs a collective
    ring there (see :func:`tf_allreduce`) and uses it for reductions to the host.
    """
    tensors = list(tensors)
    whole_number("root", root, minimum=0, maximum=max(len(tensors) - 1, 0),
                 hint=f"It is the index of one of the {len(tensors)} devices.")
    return _allreduce_tf(tensors, "reduce_to_one", trace, root=root)


def tree_allreduce(tensors: Sequence[Any], trace: bool = False) -> Any:
    """Binary-tree all-reduce (sum up a tree to device 0, then back down); same contract as the ring."""
    return _allreduce_tf(tensors, "tree", trace)


def simulate(algorithm: str, n: int, length: int | None = None, itemsize: int = 4) -> Trace:
    """Run an algorithm's schedule on NumPy arrays for any n (no TensorFlow); return its trace.

    This is what the step-through widget draws, for an N larger than your device count.

    Example:
        >>> simulate("ring", 4, length=8).bytes_sent
        [48, 48, 48, 48]
    """
    import numpy as np

    one_of("algorithm", algorithm, ALGORITHMS)
    whole_number("n", n, minimum=1, maximum=64, hint="It is the number of devices.")
    length = n if length is None else length
    chunks, schedule = _SCHEDULES[algorithm](n)
    sizes, ops = shard_sizes(length, chunks), NumPyOps()
    values = [ops.split(d, np.full(length, float(d)), sizes) for d in range(n)]
    values, record = execute(values, schedule, itemsize, ops, algorithm)
    expected = n * (n - 1) / 2
    assert all(np.all(np.concatenate(v) == expected) for v in values), "schedule did not all-reduce"
    return record


# ----------------------------------------------------------------------------- cost


def bytes_per_device(algorithm: str, n: int, nbytes: float) -> float:
    """Formula: the most bytes any one device sends in one all-reduce of nbytes per device.

    ring: 2(N−1)/N · S; reduce_to_one: (N−1) · S (the root); tree: ⌈log2 N⌉ · S (the root
    sends the sum to one child per level on the way down).

    Example:
        >>> bytes_per_device("ring", 4, 1000)
        1500.0
    """
    one_of("algorithm", algorithm, ALGORITHMS)
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) / n * nbytes
    if algorithm == "reduce_to_one":
        return float((n - 1) * nbytes)
    return float(_tree_max_sends(n) * nbytes)


def _tree_max_sends(n: int) -> int:
    sends_by_device = [0] * n
    for _, sends in tree_schedule(n)[1]:
        for s in sends:
            sends_by_device[s.src] += 1
    return max(sends_by_device)


def alpha_beta_time(algorithm: str, n: int, nbytes: float, alpha_s: float = 1e-5,
                    beta_s_per_byte: float = 1 / 10e9) -> float:
    """Time model: each step costs α (latency) + β · (bytes one link carries in that step).

    A device sends one message at a time, so the root of reduce-to-one pays N−1 messages
    each way. ring: 2(N−1)·(α + β·S/N); reduce_to_one: 2(N−1)·(α + β·S);
    tree: 2⌈log2 N⌉·(α + β·S). Defaults: 10 µs per message, 10 GB/s links.

    Example:
        >>> round(alpha_beta_time("ring", 2, 1e9, alpha_s=0, beta_s_per_byte=1e-9), 3)
        1.0
    """
    one_of("algorithm", algorithm, ALGORITHMS)
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * (alpha_s + beta_s_per_byte * nbytes / n)
    if algorithm == "reduce_to_one":
        return 2 * (n - 1) * (alpha_s + beta_s_per_byte * nbytes)
    return 2 * math.ceil(math.log2(n)) * (alpha_s + beta_s_per_byte * nbytes)


def traced_ops(fn: Any, *args: Any) -> dict[str, int]:
    """Count the operations, by type, in the graph that the ``tf.function`` ``fn`` traces for ``args``.

    Functions nested in the graph are counted too. Tracing runs nothing, so this shows what
    TensorFlow *would* run, read from TensorFlow itself: which all-reduce, how many of them.

    Example:
        >>> traced_ops(tf.function(lambda x: x + 1), tf.constant(1.0))["AddV2"]  # doctest: +SKIP
        1
    """
    graph = fn.get_concrete_function(*args).graph.as_graph_def()
    counts: dict[str, int] = {}
    for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
        counts[node.op] = counts.get(node.op, 0) + 1
        if node.op == "CollectiveReduceV2":
            key = f"CollectiveReduceV2:{node.attr['communication_hint'].s.decode()}"
            counts[key] = counts.get(key, 0) + 1
    return counts


class TfAllReduce(NamedTuple):
    """TensorFlow's all-reduce of some tensors: the sums, what MirroredStrategy chose, what its graph runs."""

    sums: list[Any]
    implementation: str
    graph_ops: dict[str, int]


_REDUCTION_OPS = ("CollectiveReduceV2", "NcclAllReduce", "AddN")


def tf_allreduce(tensors: Sequence[Any], cross_device_ops: Any = None) -> TfAllReduce:
    """TensorFlow's own all-reduce of the same tensors, the way gradients take it; returns a TfAllReduce.

    Each tensor is one replica's value; inside ``strategy.run`` under ``tf.function`` every
    replica calls ``all_reduce(SUM, ...)``, as Keras does for gradients. ``implementation`` is
    what ran, read from the traced graph: ``CollectiveAllReduce (ring)`` when it holds
    ``CollectiveReduceV2`` ops with the ring hint (TensorFlow's pick for CPUs and logical
    GPUs; ``nccl`` on physical GPUs), else the class of ``cross_device_ops`` passed
    (``ReductionToOneDevice``, ``HierarchicalCopyAllReduce``: copies and ``AddN``).
    ``graph_ops`` counts the reduction ops. Works on logical CPUs.
    """
    tf = quiet.import_tensorflow()
    tensors = check_tensors(tensors, "tf_allreduce")
    strategy = make_strategy([t.device for t in tensors], cross_device_ops=cross_device_ops)
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda context: tensors[context.replica_id_in_sync_group])

    @tf.function
    def all_reduce(values: Any) -> Any:
        return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce("sum", v), args=(values,))

    summed = strategy.experimental_local_results(all_reduce(per_replica))
    ops = traced_ops(all_reduce, per_replica)
    hints = sorted(k.split(":")[1] for k in ops if k.startswith("CollectiveReduceV2:"))
    if hints:
        implementation = f"CollectiveAllReduce ({', '.join(hints)})"
    else:
        implementation = type(strategy.extended._cross_device_ops).__name__
    graph_ops = {k: v for k, v in ops.items() if k in _REDUCTION_OPS or k.startswith("CollectiveReduceV2:")}
    return TfAllReduce(list(summed), implementation, graph_ops)


def gradient_allreduces(strategy: Any, model: Any, bytes_per_pack: int | None = None) -> int:
    """How many all-reduces one replica launches for ``model``'s gradients in one step, counted in the graph.

    ``bytes_per_pack=None`` traces the step Keras 3 runs: ``optimizer.apply_gradients`` inside
    ``strategy.run`` all-reduces every gradient with the strategy's own communication options:
    under MirroredStrategy, which has none to set, in one pack (one all-reduce that waits for
    the last gradient); under MultiWorkerMirroredStrategy, in the packs its
    ``communication_options`` ask for. An integer traces a custom step that all-reduces the
    gradients itself with ``tf.distribute.experimental.CommunicationOptions(bytes_per_pack=…)``,
    which packs them into groups of about that many bytes, one all-reduce each. Only the
    collective all-reduce (MirroredStrategy's default) packs. Nothing runs: the graph is only
    traced. Counted per replica of this process.
    """
    tf = quiet.import_tensorflow()
    import keras

    if bytes_per_pack is not None:
        whole_number("bytes_per_pack", bytes_per_pack, minimum=0,
                     hint="It is bytes per pack (0 = one pack), or None for Keras's own step.")
    inputs = tf.zeros([2, *model.inputs[0].shape[1:]])
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.0)

    def replica_step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        if bytes_per_pack is None:
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss
        options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)
        return tf.distribute.get_replica_context().all_reduce("sum", grads, options=options)

    step = tf.function(lambda: strategy.run(replica_step))
    local_replicas = len(strategy.extended.worker_devices)  # this process's replicas (all of them, on one machine)
    return traced_ops(step).get("CollectiveReduceV2", 0) // local_replicas
