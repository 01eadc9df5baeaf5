"""The collectives: the few ways devices exchange data, from which every parallelism is built.

Each function takes one tensor per device (tensor i placed on device i) and returns one result
per device, placed there, the way NCCL and MPI define them:

- :func:`broadcast`: every device ends with the root's tensor.
- :func:`reduce`: the root ends with the sum of every device's tensor; the others keep theirs.
- :func:`all_reduce`: every device ends with the sum (the ring of lesson 03).
- :func:`reduce_scatter`: device i ends with chunk i of the sum.
- :func:`all_gather`: every device ends with all the shards, concatenated in device order.
- :func:`all_to_all`: device i ends with chunk i of every device's tensor, in device order.
- :func:`send_receive`: every device sends its tensor ``offset`` places round the ring (one
  step of ring attention, or of a pipeline without the wrap-around).

Chunks follow ``numpy.array_split`` along axis 0 (sizes differ by at most one row, larger first),
and device i ends with chunk i. ``trace=True`` returns ``(results, trace)``: an
:class:`mgpu_edu.allreduce.Trace` whose ``bytes_sent`` and ``bytes_received`` list each device's
bytes. Every schedule runs on lesson 03's executor (:mod:`mgpu_edu.allreduce`): a send is a copy
to the receiving device. :func:`simulate` runs the same schedules on NumPy arrays for any N, and
:func:`formula_bytes` gives what each device sends and receives, for comparison.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, whole_number
from mgpu_edu.parallelism import allreduce
from mgpu_edu.parallelism.allreduce import Send, Trace
from mgpu_edu.parallelism.parallel import shard_sizes

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_receive")

Schedule = list[tuple[str, list[Send]]]


# ----------------------------------------------------------------------------- schedules


def broadcast_schedule(n: int, root: int = 0) -> Schedule:
    """One step: the root sends its whole tensor to every other device.

    Example:
        >>> [(s.src, s.dst) for s in broadcast_schedule(3, root=1)[0][1]]
        [(1, 0), (1, 2)]
    """
    others = [i for i in range(n) if i != root]
    return [("broadcast", [Send(root, i, 0, "copy") for i in others])] if others else []


def reduce_schedule(n: int, root: int = 0) -> Schedule:
    """One step: every other device sends its whole tensor to the root, which adds them.

    Example:
        >>> [(s.src, s.dst, s.op) for s in reduce_schedule(3)[0][1]]
        [(1, 0, 'add'), (2, 0, 'add')]
    """
    others = [i for i in range(n) if i != root]
    return [("reduce", [Send(i, root, 0, "add") for i in others])] if others else []


def pairings(n: int) -> list[list[tuple[int, int]]]:
    """Rounds in which every pair of devices meets once, each device in at most one pair per round.

    The round-robin of a tournament (the "circle method"): N − 1 rounds for even N, N rounds
    for odd N, where one device sits each round out.

    Example:
        >>> pairings(4)
        [[(0, 3), (1, 2)], [(0, 2), (3, 1)], [(0, 1), (2, 3)]]
    """
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = [(players[k], players[m - 1 - k]) for k in range(m // 2)]
        real = [(a, b) for a, b in pairs if a is not None and b is not None]
        if real:
            rounds.append(real)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def all_to_all_schedule(n: int) -> Schedule:
    """Pairwise exchanges: in each round of :func:`pairings`, devices i and j swap what each holds for the other.

    Device d's chunk slot j starts with chunk j of its own tensor (the part meant for device j)
    and ends with chunk d of device j's tensor: a send reads slot ``chunk`` = j of device i and
    writes slot ``into`` = i of device j. Each device sends and receives N − 1 chunks. (NCCL posts
    all of them at once; the rounds keep each device to one partner at a time.)

    Example:
        >>> [(s.src, s.dst, s.chunk, s.into) for s in all_to_all_schedule(2)[0][1]]
        [(0, 1, 1, 0), (1, 0, 0, 1)]
    """
    return [("all-to-all", [send for i, j in pairs for send in (Send(i, j, j, "copy", into=i),
                                                                 Send(j, i, i, "copy", into=j))])
            for pairs in pairings(n)]


def send_receive_schedule(n: int, offset: int = 1) -> Schedule:
    """One step: device i sends its tensor to device (i + offset) mod N and receives from (i − offset) mod N.

    Example:
        >>> [(s.src, s.dst) for s in send_receive_schedule(3)[0][1]]
        [(0, 1), (1, 2), (2, 0)]
    """
    if offset % n == 0:
        return []
    return [("send/receive", [Send(i, (i + offset) % n, 0, "copy") for i in range(n)])]


# ----------------------------------------------------------------------------- on any backend


def _run(name: str, values: list[Any], ops: allreduce.ChunkOps, itemsize: int, root: int = 0,
         offset: int = 1) -> tuple[list[Any], Trace]:
    """Run collective ``name`` (not all_reduce: lesson 03's ring) on one value per device with ``ops``."""
    n = len(values)
    if name == "reduce_scatter":
        return allreduce.reduce_scatter_rows(values, ops, itemsize, label="reduce_scatter")
    if name == "all_gather":
        return allreduce.all_gather_rows(values, ops, itemsize, label="all_gather")
    if name == "all_to_all":
        sizes = shard_sizes(int(values[0].shape[0]), n)
        slots = [ops.split(d, value, sizes) for d, value in enumerate(values)]
        slots, record = allreduce.execute(slots, all_to_all_schedule(n), itemsize, ops, name,
                                          labels=[f"for/from {j}" for j in range(n)])
        return [ops.concat(d, chunks) for d, chunks in enumerate(slots)], record
    schedule = {"broadcast": lambda: broadcast_schedule(n, root), "reduce": lambda: reduce_schedule(n, root),
                "send_receive": lambda: send_receive_schedule(n, offset)}[name]()
    whole, record = allreduce.execute([[value] for value in values], schedule, itemsize, ops, name)
    return [chunks[0] for chunks in whole], record


# ----------------------------------------------------------------------------- on TensorFlow devices


def _one_per_device(tensors: list[Any], name: str) -> None:
    devices = [t.device for t in tensors]
    for i, device in enumerate(devices):
        first = devices.index(device)
        if first != i:
            raise BadArgument(f"{name}: tensors {first} and {i} are both on {device}. A collective takes one "
                              "tensor per device: place tensor i on device i, e.g. "
                              "`with tf.device(layout[i]): t = tf.identity(t)`.")


REDUCING = ("reduce", "all_reduce", "reduce_scatter")


def _tensors(tensors: Sequence[Any], name: str) -> list[Any]:
    """A list of TensorFlow tensors (or variables), or a BadArgument naming what came instead."""
    from mgpu_edu.runtime import quiet

    tf = quiet.import_tensorflow()
    tensors = list(tensors)
    for i, tensor in enumerate(tensors):
        if not tf.is_tensor(tensor):
            raise BadArgument(f"{name}: item {i} is {type(tensor).__name__}, not a TensorFlow tensor. A collective "
                              "takes one tensor per device: create each with `with tf.device(layout[i]): "
                              "tf.constant(...)`.")
    return tensors


def _check(tensors: Sequence[Any], name: str, rows: bool = False) -> list[Any]:
    """One tensor per device, same shape and dtype (rows: at least one axis to split)."""
    tensors = allreduce.check_tensors(_tensors(tensors, name), name)
    _one_per_device(tensors, name)
    dtype = tensors[0].dtype
    if name in REDUCING and not (dtype.is_floating or dtype.is_integer or dtype.is_complex):
        raise BadArgument(f"{name} adds the tensors, and {dtype.name} tensors can't be added. Cast them to a number "
                          "type first, e.g. tf.cast(t, tf.float32).")
    if rows and not tensors[0].shape.rank:
        raise BadArgument(f"{name} splits each tensor into chunks along axis 0, so the tensors need at least one "
                          f"axis; got scalars. Reshape them first, e.g. tf.reshape(t, [1]).")
    return tensors


def _on_devices(name: str, tensors: list[Any], trace: bool, **options: Any) -> Any:
    ops = allreduce.TensorFlowOps([t.device for t in tensors])
    results, record = _run(name, tensors, ops, tensors[0].dtype.size, **options)
    return (results, record) if trace else results


def _root(root: Any, tensors: Sequence[Any], name: str) -> int:
    count = len(list(tensors))
    whole_number("root", root, minimum=0, maximum=max(count - 1, 0), where=name,
                 hint=f"It is the index of one of the {count} devices.")
    return root


def broadcast(tensors: Sequence[Any], root: int = 0, trace: bool = False) -> Any:
    """Every device ends with a copy of the root's tensor (the others' tensors are overwritten).

    The root sends its whole tensor S to each of the other N − 1 devices: (N − 1)·S from the root,
    S into every other device. Data parallelism uses it to start every replica from the same weights.

    Example:
        >>> [t.numpy().tolist() for t in broadcast([tf.fill([2], 1.0), tf.zeros([2])])]  # doctest: +SKIP
        [[1.0, 1.0], [1.0, 1.0]]
    """
    tensors = _check(tensors, "broadcast")
    return _on_devices("broadcast", tensors, trace, root=_root(root, tensors, "broadcast"))


def reduce(tensors: Sequence[Any], root: int = 0, trace: bool = False) -> Any:
    """The root ends with the sum of every device's tensor; every other device keeps its own.

    Each other device sends its tensor S to the root: S from each, (N − 1)·S into the root.
    """
    tensors = _check(tensors, "reduce")
    return _on_devices("reduce", tensors, trace, root=_root(root, tensors, "reduce"))


def all_reduce(tensors: Sequence[Any], trace: bool = False) -> Any:
    """Every device ends with the sum: lesson 03's ring (reduce-scatter, then all-gather).

    Each device sends and receives 2(N − 1)/N·S. Data parallelism sums gradients this way, and
    tensor parallelism the partial outputs of a row-split layer.
    """
    return allreduce.ring_allreduce(_check(tensors, "all_reduce"), trace=trace)


def reduce_scatter(tensors: Sequence[Any], trace: bool = False) -> Any:
    """Device i ends with chunk i (``numpy.array_split`` along axis 0) of the sum of every device's tensor.

    The ring's first half: each device sends and receives (N − 1)/N·S, where S is one device's
    tensor. ZeRO sums gradients this way, each device keeping the shard it updates; sequence
    parallelism uses it in place of tensor parallelism's all-reduce.

    Example:
        >>> [t.numpy().tolist() for t in reduce_scatter([tf.ones([3]), tf.ones([3])])]  # doctest: +SKIP
        [[2.0, 2.0], [2.0]]
    """
    tensors = _check(tensors, "reduce_scatter", rows=True)
    return _on_devices("reduce_scatter", tensors, trace)


def all_gather(shards: Sequence[Any], trace: bool = False) -> Any:
    """Every device ends with every device's shard, concatenated along axis 0 in device order.

    Shards may differ in length along axis 0 (as :func:`reduce_scatter` leaves them) but must
    agree on every other axis and on dtype. The ring's second half: each device sends and receives
    (N − 1)/N·S, where S is the gathered result. ZeRO-3 gathers weights this way before using them.
    """
    shards = _tensors(shards, "all_gather")
    if not shards:
        raise BadArgument("all_gather needs one shard per device, got an empty list.")
    if any(not s.shape.rank for s in shards):
        raise BadArgument(f"all_gather concatenates shards along axis 0, so each needs at least one axis; got shapes "
                          f"{[tuple(s.shape) for s in shards]}. Reshape scalars first, e.g. tf.reshape(s, [1]).")
    trailing = {tuple(s.shape[1:]) for s in shards}
    if len(trailing) > 1:
        raise BadArgument(f"all_gather: the shards must agree on every axis but the first; got shapes "
                          f"{[tuple(s.shape) for s in shards]}.")
    dtypes = [s.dtype.name for s in shards]
    if len(set(dtypes)) > 1:
        raise BadArgument(f"all_gather: the shards must share one dtype; got {dtypes}. Cast them first, "
                          "e.g. tf.cast(s, tf.float32).")
    _one_per_device(shards, "all_gather")
    return _on_devices("all_gather", shards, trace)


def all_to_all(tensors: Sequence[Any], trace: bool = False) -> Any:
    """Device i ends with chunk i of every device's tensor, concatenated in device order.

    Chunks follow ``numpy.array_split`` along axis 0: device j sends its chunk i to device i. Each
    device sends and receives (N − 1)/N·S. Expert parallelism sends tokens to their experts' devices
    and back this way; Ulysses-style sequence parallelism swaps a sequence split for a head split.
    """
    tensors = _check(tensors, "all_to_all", rows=True)
    return _on_devices("all_to_all", tensors, trace)


def send_receive(tensors: Sequence[Any], offset: int = 1, trace: bool = False) -> Any:
    """Device i sends its tensor to device (i + offset) mod N, and ends with device (i − offset) mod N's.

    Point-to-point: each device sends S and receives S (nothing moves when offset is a multiple of
    N). Ring attention passes key/value blocks round the ring this way; a pipeline passes
    activations to the next stage the same way, without the wrap-around.
    """
    tensors = _check(tensors, "send_receive")
    if not isinstance(offset, numbers.Integral) or isinstance(offset, bool):
        raise BadArgument(f"send_receive: offset must be a whole number of places round the ring, got {offset!r}; "
                          "offset=1 sends to the next device, offset=-1 to the previous one.")
    return _on_devices("send_receive", tensors, trace, offset=int(offset))


# ----------------------------------------------------------------------------- NumPy and formulas


def simulate(collective: str, n: int, rows: int | None = None, itemsize: int = 4, root: int = 0,
             offset: int = 1) -> Trace:
    """Run a collective's schedule on NumPy arrays for any N (no TensorFlow); return its trace.

    Each device's input is ``rows`` values (default N; for all_gather, the gathered length); the
    step-through widget draws the trace.

    Example:
        >>> simulate("all_to_all", 4, rows=8).bytes_sent
        [24, 24, 24, 24]
    """
    import numpy as np

    one_of("collective", collective, COLLECTIVES)
    whole_number("n", n, minimum=1, maximum=64, hint="It is the number of devices.")
    rows = n if rows is None else rows
    whole_number("rows", rows, minimum=0, hint="It is the length of each device's tensor.")
    if collective == "all_reduce":
        return allreduce.simulate("ring", n, length=rows, itemsize=itemsize)
    if collective == "all_gather":
        values = [np.full(size, float(d)) for d, size in enumerate(shard_sizes(rows, n))]
    else:
        values = [np.full(rows, float(d)) for d in range(n)]
    whole_number("root", root, minimum=0, maximum=n - 1, hint=f"It is the index of one of the {n} devices.")
    results, record = _run(collective, values, allreduce.NumPyOps(), itemsize, root=root, offset=offset)
    assert all(np.array_equal(got, want) for got, want in zip(results, _expected(collective, values, root, offset),
                                                                strict=True)), f"{collective}: wrong results"
    return record


def _expected(collective: str, values: list[Any], root: int, offset: int) -> list[Any]:
    """What each device must end with, from NumPy seeing every device's data at once (simulate's own check)."""
    import numpy as np

    n = len(values)
    if collective == "all_gather":
        return [np.concatenate(values)] * n
    total = np.sum(values, axis=0)
    chunks = [np.array_split(v, n) for v in values]
    return {"broadcast": [values[root]] * n, "reduce": [total if d == root else values[d] for d in range(n)],
            "reduce_scatter": np.array_split(total, n),
            "all_to_all": [np.concatenate([chunks[j][i] for j in range(n)]) for i in range(n)],
            "send_receive": [values[(d - offset) % n] for d in range(n)]}[collective]


def formula_bytes(collective: str, n: int, nbytes: float, root: int = 0) -> tuple[list[float], list[float]]:
    """What each device sends and receives, by formula, for a tensor of ``nbytes`` (S).

    S is one device's tensor, except for all_gather, where it is the gathered result. Where S
    divides evenly into N chunks, :func:`simulate` and the functions above move exactly this.

    Example:
        >>> formula_bytes("reduce_scatter", 4, 1000)
        ([750.0, 750.0, 750.0, 750.0], [750.0, 750.0, 750.0, 750.0])
    """
    one_of("collective", collective, COLLECTIVES)
    whole_number("n", n, minimum=1, maximum=1024, hint="It is the number of devices.")
    whole_number("root", root, minimum=0, maximum=n - 1, hint=f"It is the index of one of the {n} devices.")
    if n == 1:
        return [0.0], [0.0]
    s = float(nbytes)
    if collective == "broadcast":
        return [(n - 1) * s if d == root else 0.0 for d in range(n)], [0.0 if d == root else s for d in range(n)]
    if collective == "reduce":
        return [0.0 if d == root else s for d in range(n)], [(n - 1) * s if d == root else 0.0 for d in range(n)]
    share = {"all_reduce": 2 * (n - 1) / n, "send_receive": 1.0}.get(collective, (n - 1) / n) * s
    return [share] * n, [share] * n
