"""The collectives on logical devices: results against NumPy and TensorFlow's own, bytes against the formulas."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import allreduce, collectives, quiet, strategies

tf = quiet.import_tensorflow()


def placed(values, devices, dtype=tf.float32):
    out = []
    for value, device in zip(values, devices, strict=True):
        with tf.device(device):
            out.append(tf.constant(value, dtype))
    return out


def inputs(n, shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-9, 10, size=shape).astype(np.float64) for _ in range(n)]


def expected(name, values, root=0, offset=1):
    """What each device must end with, from NumPy alone."""
    n = len(values)
    if name == "all_gather":  # shards of different lengths: no sum to take
        return [np.concatenate(values, axis=0)] * n
    total = np.sum(values, axis=0)
    if name == "broadcast":
        return [values[root]] * n
    if name == "reduce":
        return [total if d == root else values[d] for d in range(n)]
    if name == "all_reduce":
        return [total] * n
    if name == "reduce_scatter":
        return np.array_split(total, n, axis=0)
    if name == "all_to_all":
        chunks = [np.array_split(v, n, axis=0) for v in values]
        return [np.concatenate([chunks[j][i] for j in range(n)], axis=0) for i in range(n)]
    return [values[(d - offset) % n] for d in range(n)]  # send_receive


@pytest.mark.parametrize("name", collectives.COLLECTIVES)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(8, 3), (7,), (2, 5)])  # divides by N or not; fewer rows than devices
def test_results_and_placement(four_devices, name, n, shape):
    devices = four_devices[:n]
    values = inputs(n, shape)
    if name == "all_gather":
        values = [np.ones((size, *shape[1:])) * d for d, size in enumerate([3, 0, 2, 1][:n])]
    tensors = placed(values, devices)
    results, trace = getattr(collectives, name)(tensors, trace=True)
    for got, want, tensor in zip(results, expected(name, values), tensors, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
        assert got.device == tensor.device  # each result stays on its device
    assert len(trace.bytes_sent) == n and len(trace.bytes_received) == n


@pytest.mark.parametrize("dtype", [tf.float64, tf.int32, tf.bfloat16])
def test_dtypes(four_devices, dtype):
    values = inputs(4, (6, 2))
    for name in collectives.COLLECTIVES:
        results = getattr(collectives, name)(placed(values, four_devices, dtype))
        assert all(r.dtype == dtype for r in results)
        for got, want in zip(results, expected(name, values), strict=True):
            np.testing.assert_array_equal(tf.cast(got, tf.float64).numpy(), want)


def test_root_and_offset(four_devices):
    values = inputs(4, (5,))
    for root in range(4):
        for name in ("broadcast", "reduce"):
            got = getattr(collectives, name)(placed(values, four_devices), root=root)
            for g, w in zip(got, expected(name, values, root=root), strict=True):
                np.testing.assert_array_equal(g.numpy(), w)
    for offset in (-1, 0, 2, 5):
        got, trace = collectives.send_receive(placed(values, four_devices), offset=offset, trace=True)
        for g, w in zip(got, expected("send_receive", values, offset=offset), strict=True):
            np.testing.assert_array_equal(g.numpy(), w)
        assert trace.bytes_sent == ([0] * 4 if offset % 4 == 0 else [5 * 4] * 4)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_bytes_equal_the_formula_when_sizes_divide(four_devices, n):
    rows = 12  # divides by 2, 3 and 4
    values = placed(inputs(n, (rows, 2)), four_devices[:n])
    nbytes = rows * 2 * 4
    for name in collectives.COLLECTIVES:
        root_args = {"root": n - 1} if name in ("broadcast", "reduce") else {}
        tensors = values
        if name == "all_gather":  # S is the gathered result: each device holds 1/N of it
            tensors = [t[: rows // n] for t in values]
            tensors = [tf.identity(t) for t in tensors]
            tensors = placed([t.numpy() for t in tensors], four_devices[:n])
        _, trace = getattr(collectives, name)(tensors, trace=True, **root_args)
        sent, received = collectives.formula_bytes(name, n, nbytes, **root_args)
        assert trace.bytes_sent == sent, name
        assert trace.bytes_received == received, name


def test_uneven_sizes_move_the_same_total(four_devices):
    values = placed(inputs(4, (7, 3)), four_devices)  # 7 rows on 4 devices: chunks of 2, 2, 2, 1 rows
    nbytes = 7 * 3 * 4
    for name in ("reduce_scatter", "all_to_all"):
        _, trace = getattr(collectives, name)(values, trace=True)
        assert sum(trace.bytes_sent) == sum(collectives.formula_bytes(name, 4, nbytes)[0])
        assert max(trace.bytes_sent) > min(trace.bytes_sent)  # the devices differ by a row


@pytest.mark.parametrize("length", [12, 10])  # 12 divides by 4; 10 gives chunks of 3, 3, 2, 2
def test_all_reduce_is_reduce_scatter_then_all_gather(four_devices, length):
    values = placed(inputs(4, (length,)), four_devices)
    whole, whole_trace = collectives.all_reduce(values, trace=True)
    shards, first = collectives.reduce_scatter(values, trace=True)
    gathered, second = collectives.all_gather(shards, trace=True)
    for a, b in zip(whole, gathered, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    both = [x + y for x, y in zip(first.bytes_sent, second.bytes_sent, strict=True)]
    assert sum(both) == sum(whole_trace.bytes_sent)  # the same bytes in all
    if length % 4 == 0:
        assert both == whole_trace.bytes_sent  # and, where chunks are equal, on every device


def test_agree_with_tensorflows_replica_context(four_devices):
    strategy = strategies.make_strategy(four_devices)  # beside the other tests' strategies in this process
    values = placed(inputs(4, (3, 2)), four_devices)
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda context: values[context.replica_id_in_sync_group])

    @tf.function
    def both(v):
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", v), context.all_gather(v, axis=0)

    summed, gathered = strategy.run(both, args=(per_replica,))
    for ours, theirs in zip(collectives.all_reduce(values), strategy.experimental_local_results(summed), strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    for ours, theirs in zip(collectives.all_gather(values), strategy.experimental_local_results(gathered),
                            strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.processes
def test_up_to_eight_devices_in_a_fresh_process():
    out = run_fresh("""
        import numpy as np
        import tensorflow as tf
        from mgpu_edu import collectives, setup_devices
        layout = setup_devices(8, verbose=False)
        rng = np.random.default_rng(1)
        wrong = []
        for n in range(1, 9):
            values = [rng.standard_normal((9, 2)) for _ in range(n)]  # 9 rows: uneven for every n > 1 but 3
            tensors = []
            for v, d in zip(values, list(layout)[:n]):
                with tf.device(d):
                    tensors.append(tf.constant(v, tf.float64))
            total = np.sum(values, axis=0)
            chunks = [np.array_split(v, n) for v in values]
            want = {"broadcast": [values[0]] * n, "reduce": [total] + values[1:], "all_reduce": [total] * n,
                    "reduce_scatter": np.array_split(total, n), "all_gather": [np.concatenate(values)] * n,
                    "all_to_all": [np.concatenate([chunks[j][i] for j in range(n)]) for i in range(n)],
                    "send_receive": [values[(d - 1) % n] for d in range(n)]}
            for name in collectives.COLLECTIVES:
                got, trace = getattr(collectives, name)(tensors, trace=True)
                if not all(np.allclose(g.numpy(), w, rtol=0, atol=1e-12) for g, w in zip(got, want[name])):
                    wrong.append((name, n))
                if sum(trace.bytes_sent) != sum(trace.bytes_received):
                    wrong.append((name, n, "bytes"))
        result = wrong
    """)
    assert out["result"] == []


@pytest.mark.parametrize("name", collectives.COLLECTIVES)
@pytest.mark.parametrize("n", range(1, 9))
def test_simulated_bytes_match_the_formula(name, n):
    rows = 840  # divides by 1 … 8
    trace = collectives.simulate(name, n, rows=rows, itemsize=8)
    sent, received = collectives.formula_bytes(name, n, rows * 8)
    assert trace.bytes_sent == sent and trace.bytes_received == received


def test_all_to_all_pairs_each_device_once_per_round():
    for n in range(1, 9):
        rounds = collectives.pairings(n)
        met = [tuple(sorted(p)) for pairs in rounds for p in pairs]
        assert sorted(met) == [(i, j) for i in range(n) for j in range(i + 1, n)]  # every pair once
        assert all(len({d for p in pairs for d in p}) == 2 * len(pairs) for pairs in rounds)  # nobody twice
        assert len(rounds) == (n - 1 if n % 2 == 0 else n) if n > 1 else rounds == []


def test_clear_errors(four_devices):
    a, b = four_devices[:2]
    with tf.device(a):
        x, scalar = tf.ones([4]), tf.constant(1.0)
    with tf.device(b):
        y, y3, y4, y64 = tf.ones([3]), tf.ones([4, 3]), tf.ones([4]), tf.ones([4], tf.float64)
        scalar_b = tf.constant(2.0)
    with pytest.raises(ValueError, match=r"same shape, got shapes \[\(4,\), \(3,\)\]"):
        collectives.all_reduce([x, y])
    with pytest.raises(ValueError, match="same dtype.*float32.*float64.*tf.cast"):
        collectives.broadcast([x, y64])
    with pytest.raises(ValueError, match=r"tensors 0 and 1 are both on .*CPU:0.*tf.device\(layout\[i\]\)"):
        collectives.reduce([x, tf.identity(x)])
    with pytest.raises(ValueError, match="at least one axis; got scalars"):
        collectives.reduce_scatter([scalar, scalar_b])
    with pytest.raises(ValueError, match=r"every axis but the first; got shapes \[\(4,\), \(4, 3\)\]"):
        collectives.all_gather([x, y3])
    with pytest.raises(ValueError, match="root=2 .*one of the 2 devices"):
        collectives.broadcast([x, y4], root=2)
    with pytest.raises(ValueError, match="offset must be a whole number.*got 1.5"):
        collectives.send_receive([x], offset=1.5)
    with pytest.raises(ValueError, match="empty list"):
        collectives.all_to_all([])
    with pytest.raises(ValueError, match="collective='allreduce'"):
        collectives.simulate("allreduce", 4)


def test_module_is_reachable_from_the_top():
    import mgpu_edu

    assert mgpu_edu.collectives is collectives
    assert allreduce.Send(0, 1, 2, "copy", into=3).target == 3


def test_only_the_sends_cross_devices(four_devices, monkeypatch):
    """Every cut, join and empty buffer happens on its own device; each add or copy takes one chunk from elsewhere."""
    seen = []

    class Recording(allreduce.TensorFlowOps):
        def _record(self, kind, d, inputs, output):
            outputs = output if isinstance(output, list) else [output]
            seen.append((kind, self.devices[d], [t.device for t in inputs], [t.device for t in outputs]))
            return output

        def split(self, d, value, sizes):
            return self._record("split", d, [value], super().split(d, value, sizes))

        def concat(self, d, chunks):
            return self._record("concat", d, list(chunks), super().concat(d, chunks))

        def zeros(self, d, like):
            return self._record("zeros", d, [], super().zeros(d, like))

        def add(self, d, mine, incoming):
            return self._record("add", d, [mine, incoming], super().add(d, mine, incoming))

        def copy(self, d, incoming):
            return self._record("copy", d, [incoming], super().copy(d, incoming))

    monkeypatch.setattr(allreduce, "TensorFlowOps", Recording)
    values = placed(inputs(4, (7, 2)), four_devices)
    for name in collectives.COLLECTIVES:
        getattr(collectives, name)(values)
    assert {kind for kind, *_ in seen} == {"split", "concat", "zeros", "add", "copy"}
    for kind, device, ins, outs in seen:
        assert all(out == device for out in outs), (kind, device, outs)  # every result on the device it runs for
        if kind in ("split", "concat"):
            assert all(i == device for i in ins), (kind, device, ins)  # no hidden copies
        if kind == "add":
            assert ins[0] == device and ins[1] != device  # one chunk arrives: the send


@pytest.mark.processes
def test_dtensor_relayout_runs_tensorflows_all_to_all():
    """Lesson 12's stand-in: the relayout from rows to columns compiles to one CollectiveAllToAllV2 (read from the
    program DTensor compiled, as lesson 15 reads it; deterministic, unlike a profile of an asynchronous run)."""
    out = run_fresh("""
        from mgpu_edu import meshes
        meshes.record_collectives()
        import numpy as np
        from mgpu_edu import setup_devices
        layout = setup_devices(4, verbose=False)
        from tensorflow.experimental import dtensor
        mesh = meshes.make_mesh({"x": 4}, devices=list(layout))
        rows = meshes.put(np.arange(48, dtype=np.float32).reshape(4, 12), meshes.layout(mesh, "x", None))
        run = meshes.compiled_collectives(lambda t: dtensor.relayout(t, meshes.layout(mesh, None, "x")), rows)
        result = {"physical": [c.op for c in run.physical], "logical": [c.op for c in run.logical],
                  "equal": bool(np.array_equal(meshes.whole(run.result), np.arange(48).reshape(4, 12)))}
    """)
    assert out["result"] == {"physical": ["CollectiveAllToAllV2"], "logical": ["DTensorAllToAll"], "equal": True}


def test_inputs_that_are_not_numeric_tensors(four_devices):
    with pytest.raises(ValueError, match="item 0 is ndarray, not a TensorFlow tensor"):
        collectives.broadcast([np.ones(3), np.ones(3)])
    with pytest.raises(ValueError, match="item 1 is list"):
        collectives.all_gather([tf.ones([2]), [1.0, 2.0]])
    flags = placed([np.ones(3), np.zeros(3)], four_devices[:2], tf.bool)
    with pytest.raises(ValueError, match="bool tensors can't be added.*tf.cast"):
        collectives.all_reduce(flags)
    assert [t.numpy().tolist() for t in collectives.all_gather(flags)][1] == [True] * 3 + [False] * 3  # no adding
    got = collectives.send_receive(placed(inputs(2, (3,)), four_devices[:2]), offset=np.int64(1))
    assert len(got) == 2
