"""Data parallelism by hand, on real TensorFlow with 4 logical devices in this process."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import models, parallel, quiet
from mgpu_edu.parallelism.parallel import shard_sizes, split_batch


@pytest.mark.parametrize(("batch", "n"), [(10, 4), (8, 4), (3, 4), (0, 3), (1, 1), (17, 5), (64, 64)])
def test_split_batch_numpy(batch, n):
    x = np.arange(batch * 2).reshape(batch, 2)
    shards = split_batch(x, n)
    sizes = [len(s) for s in shards]
    assert len(shards) == n
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert sizes == shard_sizes(batch, n)
    np.testing.assert_array_equal(np.concatenate(shards), x)


def test_split_batch_tensor_eager_and_graph(four_devices):
    import tensorflow as tf

    x = tf.reshape(tf.range(14.0), (7, 2))
    shards = split_batch(x, 4)
    assert [int(s.shape[0]) for s in shards] == [2, 2, 2, 1]
    np.testing.assert_array_equal(tf.concat(shards, 0).numpy(), x.numpy())

    @tf.function(input_signature=[tf.TensorSpec([None, 2])])
    def sizes(batch):
        return tf.stack([tf.shape(s)[0] for s in split_batch(batch, 4)])

    assert sizes(x[:2]).numpy().tolist() == [1, 1, 0, 0]
    assert sizes(x).numpy().tolist() == [2, 2, 2, 1]


@pytest.mark.parametrize(("n", "error"), [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_split_batch_bad_n(n, error):
    with pytest.raises(error, match=repr(n) if error is TypeError else f"n={n}"):
        split_batch(np.zeros(4), n)


def test_split_batch_scalar_is_refused():
    with pytest.raises(ValueError, match="scalar"):
        split_batch(np.float32(3.0), 2)


def _reference(model, loss_fn, x, y):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("batch", [13, 3, 16, 1])
def test_data_parallel_gradients_equal_single_device(four_devices, batch):
    import tensorflow as tf

    model, loss_fn = models.mlp(64, 10, hidden=(16,)), models.per_example_loss()
    rng = np.random.default_rng(batch)
    x = tf.constant(rng.normal(size=(batch, 64)), tf.float32)
    y = tf.constant(rng.integers(0, 10, batch), tf.int32)
    expected = _reference(model, loss_fn, x, y)
    got = parallel.data_parallel_gradients(model, loss_fn, x, y, four_devices)
    assert len(got) == len(model.trainable_variables)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    if batch % 4:  # uneven shards: averaging each tower's mean gradient is wrong
        towers = parallel.tower_gradients(model, loss_fn, x, y, four_devices)
        wrong = parallel.combine_towers(towers, weighting="mean_of_means")
        errors = [float(tf.reduce_max(tf.abs(w - e))) for w, e in zip(wrong, expected, strict=True)]
        if batch < 4:  # an empty tower's mean is 0/0: the mistake gives NaN
            assert any(np.isnan(errors))
        else:
            assert max(errors) > 1e-4


def test_towers_run_on_their_devices(four_devices):
    import tensorflow as tf

    model, loss_fn = models.mlp(64, 10, hidden=(8,)), models.per_example_loss()
    towers = parallel.tower_gradients(model, loss_fn, tf.zeros((6, 64)), tf.zeros(6, tf.int32), four_devices)
    assert [t.device for t in towers] == four_devices
    assert [int(t.examples) for t in towers] == [2, 2, 1, 1]
    assert [t.outputs.device.split("device:")[-1] for t in towers] == [d.split("device:")[-1] for d in four_devices]


def test_step_matches_single_device_training_and_keeps_order(four_devices):
    import keras
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(1).normal(size=(11, 64)), tf.float32)
    y = tf.constant(np.arange(11) % 10, tf.int32)
    loss_fn = models.per_example_loss()
    a, b = models.mlp(64, 10, hidden=(16,), seed=3), models.mlp(64, 10, hidden=(16,), seed=3)
    opt_a, opt_b = keras.optimizers.SGD(0.5), keras.optimizers.SGD(0.5)
    for _ in range(3):
        loss, outputs = parallel.data_parallel_step(a, opt_a, loss_fn, x, y, four_devices)
        with tf.GradientTape() as tape:
            predictions = b(x, training=True)
            ref_loss = tf.reduce_mean(loss_fn(y, predictions))
        opt_b.apply_gradients(zip(tape.gradient(ref_loss, b.trainable_variables), b.trainable_variables,
                                  strict=True))
        np.testing.assert_allclose(loss.numpy(), ref_loss.numpy(), rtol=1e-5)
        np.testing.assert_allclose(outputs.numpy(), predictions.numpy(), rtol=1e-5, atol=1e-6)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)
    one = parallel.data_parallel_predict(a, x, four_devices[:1])
    np.testing.assert_allclose(parallel.data_parallel_predict(a, x, four_devices).numpy(), one.numpy(), atol=1e-6)


def test_empty_batch_and_no_devices_are_refused(four_devices):
    import tensorflow as tf

    model, loss_fn = models.mlp(64, 10, hidden=(8,)), models.per_example_loss()
    with pytest.raises(ValueError, match="empty batch"):
        parallel.data_parallel_gradients(model, loss_fn, tf.zeros((0, 64)), tf.zeros(0, tf.int32), four_devices)
    with pytest.raises(ValueError, match="devices is empty"):
        parallel.data_parallel_gradients(model, loss_fn, tf.zeros((2, 64)), tf.zeros(2, tf.int32), [])
    with pytest.raises(ValueError, match="'median'"):
        parallel.combine_towers([], weighting="median")


def test_timeline_eager_is_sequential_graph_overlaps(four_devices):
    import tensorflow as tf

    shards = [tf.random.normal((300, 300)) for _ in four_devices]
    work = lambda s: tf.reduce_sum(tf.matmul(tf.matmul(s, s), s))  # noqa: E731
    outputs, eager = parallel.timed_on_devices(work, shards, four_devices)
    assert [s.device for s in eager] == four_devices
    assert parallel.overlap_fraction(eager) == 0.0  # eager: one device after another
    _, graph = parallel.timed_on_devices(work, shards, four_devices, graph=True)
    np.testing.assert_allclose([float(o) for o in outputs], [float(work(s)) for s in shards], rtol=1e-4)
    assert all(s.end >= s.start for s in graph)
    with pytest.raises(ValueError, match="3 shards for 4 devices"):
        parallel.timed_on_devices(work, shards[:3], four_devices)


def test_errors_name_the_callers_own_arguments(four_devices):
    import tensorflow as tf

    from mgpu_edu import models

    model = models.mlp(4, 2, hidden=(3,))
    with pytest.raises(ValueError, match="devices is empty"):
        parallel.data_parallel_predict(model, tf.zeros((2, 4)), [])
    with pytest.raises(ValueError, match="towers is empty"):
        parallel.combine_towers([])
    with pytest.raises(ValueError, match="weighting='median' is not one of"):
        parallel.combine_towers([], weighting="median")


def test_the_timed_graph_orders_the_devices_by_data_only(four_devices):
    """Lesson 01 §2: traced with tf.function, each device's first timestamp waits for the previous device's work
    (stateful ops kept in program order): N − 1 waits; with wrap_function, as timed_on_devices builds it, none."""
    tf = quiet.import_tensorflow()
    shards = []
    for i, device in enumerate(four_devices):
        with tf.device(device):
            shards.append(tf.random.stateless_normal((8, 8), seed=(i, 0)))
    work = lambda m: tf.reduce_sum(tf.matmul(m, m))  # noqa: E731
    for n in (1, 2, 4):
        assert parallel.waits_between_devices(work, shards[:n], four_devices[:n], "tf.function") == n - 1
        assert parallel.waits_between_devices(work, shards[:n], four_devices[:n]) == 0
    with pytest.raises(ValueError, match="builder='jit'"):
        parallel.waits_between_devices(work, shards, four_devices, "jit")
