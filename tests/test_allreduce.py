"""All-reduce algorithms on real tensors placed on 4 logical devices, and their schedules for any N."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import allreduce, strategies

FUNCTIONS = {
    "ring": allreduce.ring_allreduce,
    "reduce_to_one": allreduce.reduce_to_one_allreduce,
    "tree": allreduce.tree_allreduce,
}


def _placed(devices, arrays, dtype):
    import tensorflow as tf

    tensors = []
    for device, array in zip(devices, arrays, strict=False):
        with tf.device(device):
            tensors.append(tf.constant(array, dtype))
    return tensors


@pytest.mark.parametrize("algorithm", list(FUNCTIONS))
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(7,), (2, 5), (12,), (2,), ()])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sums_land_on_every_device(four_devices, algorithm, n, shape, dtype):
    rng = np.random.default_rng(n)
    arrays = [rng.normal(size=shape).astype(dtype) for _ in range(n)]
    tensors = _placed(four_devices, arrays, dtype)
    results, trace = FUNCTIONS[algorithm](tensors, trace=True)
    assert len(results) == n
    for result, tensor in zip(results, tensors, strict=True):
        assert result.device == tensor.device and result.dtype == tensor.dtype
        assert tuple(result.shape) == shape
        np.testing.assert_allclose(result.numpy(), sum(arrays), rtol=1e-5)
    assert len(trace.bytes_sent) == n
    assert trace.total_bytes == int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n == 1:
        assert trace.steps == () and trace.bytes_sent == [0]


def test_ring_trace_matches_formula_and_states(four_devices):
    import tensorflow as tf

    tensors = _placed(four_devices, [np.full(1000, i) for i in range(4)], "float32")
    results, trace = allreduce.ring_allreduce(tensors, trace=True)
    assert len(trace.steps) == 2 * (4 - 1)
    assert trace.bytes_sent == [2 * 3 / 4 * 4000] * 4 == [6000] * 4
    first = trace.steps[0]
    assert [(s.src, s.dst, s.chunk, s.op) for s in first.sends] == [(0, 1, 0, "add"), (1, 2, 1, "add"),
                                                                     (2, 3, 2, "add"), (3, 0, 3, "add")]
    assert first.state[1][0] == (0, 1)
    after_reduce_scatter = trace.steps[2].state
    assert [after_reduce_scatter[d][(d + 1) % 4] for d in range(4)] == [(0, 1, 2, 3)] * 4
    assert all(chunk == (0, 1, 2, 3) for device in trace.steps[-1].state for chunk in device)
    assert all(float(tf.reduce_min(r)) == 6.0 for r in results)


def test_reduce_to_one_root_sends_n_minus_one_copies(four_devices):
    tensors = _placed(four_devices, [np.ones(10) * i for i in range(4)], "float64")
    results, trace = allreduce.reduce_to_one_allreduce(tensors, root=2, trace=True)
    assert trace.bytes_sent == [80, 80, 3 * 80, 80]
    assert trace.bytes_received == [80, 80, 3 * 80, 80]
    np.testing.assert_array_equal(results[0].numpy(), np.full(10, 6.0))


@pytest.mark.parametrize("root", [-1, 4, 1.0, True])
def test_bad_root(four_devices, root):
    tensors = _placed(four_devices, [np.ones(3)] * 4, "float32")
    with pytest.raises(ValueError, match=r"root=.*0 to 3"):
        allreduce.reduce_to_one_allreduce(tensors, root=root)


@pytest.mark.parametrize("algorithm", list(FUNCTIONS))
def test_mismatches_are_named(four_devices, algorithm):
    import tensorflow as tf

    with pytest.raises(ValueError, match=r"same shape.*\(3,\).*\(4,\)"):
        FUNCTIONS[algorithm](_placed(four_devices, [np.ones(3), np.ones(4)], "float32"))
    mixed = _placed(four_devices[:1], [np.ones(3)], "float32") + _placed(four_devices[1:], [np.ones(3)], "float64")
    with pytest.raises(ValueError, match=r"same dtype.*float32.*float64"):
        FUNCTIONS[algorithm](mixed)
    with pytest.raises(ValueError, match="empty list"):
        FUNCTIONS[algorithm]([])
    del tf


@pytest.mark.parametrize("algorithm", allreduce.ALGORITHMS)
@pytest.mark.parametrize("n", range(1, 17))
def test_simulated_schedules_reduce_and_match_formulas(algorithm, n):
    trace = allreduce.simulate(algorithm, n, length=2 * n)
    final = trace.state_at(len(trace.steps))
    assert all(chunk == tuple(range(n)) for device in final for chunk in device)
    assert max(trace.bytes_sent) == allreduce.bytes_per_device(algorithm, n, trace.total_bytes)
    if algorithm == "ring":
        assert len(trace.steps) == 2 * (n - 1)
        assert trace.bytes_sent == [2 * (n - 1) * trace.total_bytes // n] * n
        assert sum(allreduce.simulate("ring", n, length=2 * n + 1).bytes_sent) == 2 * (n - 1) * (2 * n + 1) * 4


def test_alpha_beta_model():
    s = 4e8
    assert allreduce.alpha_beta_time("ring", 1, s) == 0.0
    ring = [allreduce.alpha_beta_time("ring", n, s, alpha_s=0) for n in (2, 4, 16)]
    assert ring == sorted(ring) and ring[-1] < 2 * s / 10e9  # bandwidth term bounded by 2·S·β
    assert allreduce.alpha_beta_time("reduce_to_one", 8, s) > allreduce.alpha_beta_time("ring", 8, s)
    with pytest.raises(ValueError, match="'butterfly'"):
        allreduce.alpha_beta_time("butterfly", 4, s)
    with pytest.raises(ValueError, match="n=0"):
        allreduce.simulate("ring", 0)


def test_oracle_agrees_with_tensorflow_reductions_and_names_what_ran(four_devices):
    """Our ring gives TensorFlow's sums, and the graph shows which all-reduce MirroredStrategy runs."""
    import tensorflow as tf

    arrays = [np.random.default_rng(i).normal(size=(3, 5)).astype("float32") for i in range(4)]
    tensors = _placed(four_devices, arrays, "float32")
    ours = allreduce.ring_allreduce(tensors)
    expected = {
        None: ("CollectiveAllReduce (ring)", {"CollectiveReduceV2": 4, "CollectiveReduceV2:ring": 4}),
        "one": ("ReductionToOneDevice", {"AddN": 1}),
        "hierarchical": ("HierarchicalCopyAllReduce", {"AddN": 3}),
    }
    choices = {None: None, "one": tf.distribute.ReductionToOneDevice(),
               "hierarchical": tf.distribute.HierarchicalCopyAllReduce()}
    for key, ops in choices.items():
        result = allreduce.tf_allreduce(tensors, ops)
        assert (result.implementation, result.graph_ops) == expected[key]
        for a, b in zip(ours, result.sums, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def test_oracle_mirrored_strategy_picks_collective_ring_on_logical_cpus(four_devices):
    """MirroredStrategy's default on logical CPUs: CollectiveAllReduce with the ring implementation.

    (On logical GPUs TensorFlow's source picks the ring too, NCCL only on physical GPUs: that needs a
    GPU to check, see docs/gpu-runs.md.)
    """
    strategy = strategies.make_strategy(four_devices)
    assert type(strategy.extended._cross_device_ops).__name__ == "CollectiveAllReduce"
    assert strategy.extended._communication_options.implementation.name == "RING"


def test_oracle_keras_all_reduces_every_gradient_in_one_pack(four_devices):
    """Keras 3's apply_gradients launches one all-reduce per replica; bytes_per_pack splits it."""
    from mgpu_edu import models

    strategy = strategies.make_strategy(four_devices)
    with strategy.scope():
        model = models.mlp(64, 10, hidden=(64, 64))  # gradients of 16,384, 256, 16,384, 256, 2,560 and 40 bytes
    assert allreduce.gradient_allreduces(strategy, model) == 1
    assert allreduce.gradient_allreduces(strategy, model, bytes_per_pack=0) == 1
    assert allreduce.gradient_allreduces(strategy, model, bytes_per_pack=1000) == 3
    assert allreduce.gradient_allreduces(strategy, model, bytes_per_pack=20_000) == 1
    with pytest.raises(ValueError, match="bytes_per_pack=-1"):
        allreduce.gradient_allreduces(strategy, model, bytes_per_pack=-1)


@pytest.mark.slow  # two TensorFlow worker processes, twice: make test runs it, make check doesn't
def test_oracle_keras_packs_under_multi_worker_strategy_with_communication_options():
    """Lessons 02 and 08: under MultiWorkerMirroredStrategy, the strategy's communication_options apply to
    Keras's own apply_gradients too (it all-reduces through the replica context, which merges the
    strategy's defaults): bytes_per_pack=1,000 splits this model's gradients into 2 all-reduces, as a
    custom step passing the same options does; 0 keeps one. Two worker processes on this machine."""
    from mgpu_edu import cluster

    worker = Path(__file__).parent / "workers" / "packs.py"
    for pack, packs in ((0, 1), (1000, 2)):
        with cluster.LocalCluster(worker, workers=2, args=[str(pack)]) as job:
            logs = job.wait(timeout=240)
        for log in logs:
            result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
            assert result == {"replicas": 2, "keras": packs, "custom": packs}, (pack, result)


@pytest.mark.widgets
def test_stepper_widget_builds_and_steps():
    from mgpu_edu.display.widgets import AllReduceStepper

    stepper = AllReduceStepper(n=5, algorithm="ring")
    assert stepper.step.max == 8 and stepper.play.max == 8
    first = stepper.image.value
    stepper.step.value = 3
    assert stepper.image.value != first and stepper.image.value[:4] == b"\x89PNG"
    assert "mgpu-allreduce" in stepper.root._dom_classes
    stepper.algorithm.value = "tree"
    assert stepper.step.value == 0 and stepper.step.max == 6
    with pytest.raises(ValueError, match="n=1"):
        AllReduceStepper(n=1)


@pytest.mark.processes
def test_only_the_collective_all_reduce_honours_bytes_per_pack():
    """Lesson 08 §4: bytes_per_pack splits the gradients into several all-reduces with
    MirroredStrategy's default (CollectiveAllReduce); HierarchicalCopyAllReduce (the same class as
    NcclAllReduce, AllReduceCrossDeviceOps) ignores the option: the traced step is the same."""
    out = run_fresh("""
        from mgpu_edu import allreduce, devices, models
        layout = list(devices.setup_devices(2, verbose=False))
        import tensorflow as tf
        result = {}
        for name in ("collective", "hierarchical"):
            ops = None if name == "collective" else tf.distribute.HierarchicalCopyAllReduce()
            strategy = tf.distribute.MirroredStrategy(layout, cross_device_ops=ops)
            with strategy.scope():
                model = models.small_cnn((8, 8, 1), 10)
            inputs = tf.zeros([2, 8, 8, 1])
            for pack in (0, 1000):
                def replica_step(pack=pack):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_sum(model(inputs, training=True))
                    grads = tape.gradient(loss, model.trainable_variables)
                    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=pack)
                    return tf.distribute.get_replica_context().all_reduce("sum", grads, options=options)
                counted = allreduce.traced_ops(tf.function(lambda: strategy.run(replica_step)))
                result[f"{name} {pack}"] = {k: counted.get(k, 0) for k in ("CollectiveReduceV2", "AddN")}
    """)["result"]
    assert out["collective 0"]["CollectiveReduceV2"] < out["collective 1000"]["CollectiveReduceV2"]  # it packs
    assert out["hierarchical 0"] == out["hierarchical 1000"]  # the option changes nothing
    assert out["hierarchical 0"]["CollectiveReduceV2"] == 0 and out["hierarchical 0"]["AddN"] > 0


@pytest.mark.processes
def test_hierarchical_copy_and_nccl_pack_by_num_packs_even_for_keras():
    """Lesson 08 §4: the other cross-device ops pack too, by their own num_packs (default 1): Keras's own
    apply_gradients under MirroredStrategy(cross_device_ops=HierarchicalCopyAllReduce(num_packs=k)) all-reduces
    the small CNN's 6 gradient tensors as 1 pack (k = 1), k packs, or one per tensor (k = 0). NcclAllReduce is
    the same class (AllReduceCrossDeviceOps) and needs physical GPUs."""
    out = run_fresh("""
        from mgpu_edu import allreduce, devices, models
        layout = list(devices.setup_devices(2, verbose=False))
        import keras
        import tensorflow as tf
        result = {"nccl_class": tf.distribute.NcclAllReduce.__mro__[1].__name__,
                  "hierarchical_class": tf.distribute.HierarchicalCopyAllReduce.__mro__[1].__name__}
        inputs = tf.zeros([2, 8, 8, 1])
        for packs in (0, 1, 3):
            strategy = tf.distribute.MirroredStrategy(
                layout, cross_device_ops=tf.distribute.HierarchicalCopyAllReduce(num_packs=packs))
            with strategy.scope():
                model = models.small_cnn((8, 8, 1), 10)
                optimizer = keras.optimizers.SGD(0.0)
            def replica_step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(model(inputs, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
            result[str(packs)] = allreduce.traced_ops(tf.function(lambda: strategy.run(replica_step))).get("AddN", 0)
        result["tensors"] = len(model.trainable_variables)
    """)["result"]
    assert out["nccl_class"] == out["hierarchical_class"] == "AllReduceCrossDeviceOps"
    assert out["tensors"] == 6
    assert (out["1"], out["3"], out["0"]) == (1, 3, 6)  # one AddN per pack: 1, 3, or one per tensor
