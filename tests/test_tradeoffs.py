"""Trading compute for memory, checked against TensorFlow and Keras: tf.recompute_grad gives the same
gradients, by-hand accumulation takes the whole batch's step, and Keras 3's gradient_accumulation_steps
averages the micro-batches' means (a different step when they differ in size)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import memory, models, recovery, tradeoffs


def _data(n, seed=0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    return tf.constant(rng.normal(size=(n, 64)), tf.float32), tf.constant(rng.integers(0, 10, n), tf.int32)


@pytest.mark.parametrize("segment", [1, 2, 3, 9])
def test_recomputed_gradients_equal_plain_ones_and_the_forward_runs_again(segment):
    model = models.mlp(64, 10, hidden=(32,) * 8, seed=0)
    x, y = _data(40)
    loss_fn = models.per_example_loss()
    plain_loss, plain = tradeoffs.checkpointed_step(model, loss_fn, x, y)
    runs = []
    loss, recomputed = tradeoffs.checkpointed_step(model, loss_fn, x, y, segment=segment, forward_runs=runs)
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    for a, b in zip(plain, recomputed, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    groups = len(tradeoffs.segments(model, segment))
    assert runs == list(range(groups)) + list(reversed(range(groups)))  # every segment, forward again in reverse


def test_kept_activations_counts():
    model = models.mlp(64, 10, hidden=(256,) * 8, seed=0)
    rows = [n for _, n in memory.layer_activations(model, 512)]
    assert tradeoffs.kept_activations(model, 512) == sum(rows)
    # segments of 3 over 9 layers: inputs of each segment (rows 0, 3, 6) and the logits (row 9) stay,
    # plus the two hidden outputs inside the segment being recomputed
    assert tradeoffs.kept_activations(model, 512, segment=3) == sum(rows[i] for i in (0, 3, 6, 9)) + 2 * rows[1]
    assert tradeoffs.kept_activations(model, 512, segment=9) == rows[0] + rows[9] + sum(rows[1:9])
    with pytest.raises(ValueError, match="segment=10"):
        tradeoffs.kept_activations(model, 512, segment=10)


def _fit(x, y, batch_size, accumulate=None):
    import keras

    net = models.mlp(64, 10, hidden=(32,), seed=0)
    net.compile(optimizer=keras.optimizers.SGD(0.5, gradient_accumulation_steps=accumulate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    net.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return net.get_weights()


def _by_hand(x, y, micro_batch, divide_by):
    import keras

    net = models.mlp(64, 10, hidden=(32,), seed=0)
    grads = tradeoffs.accumulated_gradients(net, models.per_example_loss(), x, y, micro_batch, divide_by)
    keras.optimizers.SGD(0.5).apply_gradients(zip(grads, net.trainable_variables, strict=True))
    return net.get_weights()


def _gap(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize(("n", "even"), [(96, True), (80, False)])
def test_keras_gradient_accumulation_averages_the_micro_batches_means(n, even):
    x, y = _data(n)
    whole = _fit(x.numpy(), y.numpy(), n)
    keras_acc = _fit(x.numpy(), y.numpy(), 32, accumulate=3)
    assert _gap(_by_hand(x, y, 32, "examples"), whole) < 1e-6  # by hand: the whole batch's step, always
    assert _gap(keras_acc, _by_hand(x, y, 32, "micro_batches")) < 1e-6  # Keras: (g1 + g2 + g3) / 3
    if even:
        assert _gap(keras_acc, whole) < 1e-6
    else:  # [32, 32, 16]: the short micro-batch's examples count double
        assert _gap(keras_acc, whole) > 1e-3


def test_accumulation_arguments():
    x, y = _data(10)
    model = models.mlp(64, 10, hidden=(8,), seed=0)
    loss_fn = models.per_example_loss()
    with pytest.raises(ValueError, match="micro_batch=11"):
        tradeoffs.accumulated_gradients(model, loss_fn, x, y, 11)
    with pytest.raises(ValueError, match="divide_by='mean'"):
        tradeoffs.accumulated_gradients(model, loss_fn, x, y, 5, divide_by="mean")
    with pytest.raises(ValueError, match="x has 10 examples and y 9"):
        tradeoffs.accumulated_gradients(model, loss_fn, x, y[:9], 5)
    assert tradeoffs.micro_batch_sizes(80, 32) == [32, 32, 16] and tradeoffs.micro_batch_sizes(96, 32) == [32] * 3


def test_recovery_arithmetic():
    assert recovery.last_checkpoint(137, 50) == 100 and recovery.last_checkpoint(150, 50) == 150
    assert recovery.last_checkpoint(49, 50) == 0
    assert recovery.checkpoint_interval(30, 28_800) == pytest.approx(1314.53, abs=0.01)
    assert recovery.machines_mtbf(3.6e6, 1000) == 3600
    with pytest.raises(ValueError, match="every=0"):
        recovery.last_checkpoint(10, 0)
    with pytest.raises(ValueError, match="save_seconds=0"):
        recovery.checkpoint_interval(0, 100)


def test_recomputation_halves_what_the_forward_pass_keeps_but_not_the_steps_peak():
    """Lesson 10: measured by TensorFlow's own CPU allocator (TF_CPU_ALLOCATOR_USE_BFC makes
    get_memory_info work on a CPU). With segments of 3 layers, what the forward pass keeps for the
    backward pass (held while the tape is alive) falls to a fraction, and the plain run keeps what
    kept_activations counts; the peak of the whole step falls far less, because the backward pass
    holds a recomputed segment, the gradients flowing back and the weight gradients at once."""
    out = run_fresh("""
        import gc, os
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        from mgpu_edu import data, devices, models, tradeoffs
        devices.setup_devices(4, verbose=False)
        import tensorflow as tf
        digits = data.digits()
        deep = models.mlp(64, 10, hidden=(256,) * 8, seed=0)
        loss_fn = models.per_example_loss()
        x, y = tf.constant(digits.x_train[:512]), tf.constant(digits.y_train[:512])
        current = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]

        def measure(segment):
            groups = tradeoffs.segments(deep, segment) if segment else [tradeoffs._layers(deep)]
            def run(group):
                def forward(h):
                    for layer in group:
                        h = layer(h, training=True)
                    return h
                return tf.recompute_grad(forward) if segment else forward
            gc.collect()
            base = current()
            tf.config.experimental.reset_memory_stats("CPU:0")
            with tf.GradientTape() as tape:
                h = x
                for group in groups:
                    h = run(group)(h)
                loss = tf.reduce_mean(loss_fn(y, h))
            held = current() - base
            grads = tape.gradient(loss, deep.trainable_variables)
            peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
            del grads, tape, h, loss
            gc.collect()
            return held, peak

        for _ in range(2):  # the second round, once every kernel has run
            result = {str(s): measure(s) for s in (None, 3)}
        result["counted"] = tradeoffs.kept_activations(deep, 512)
    """)["result"]
    (plain_held, plain_peak), (recomputed_held, recomputed_peak) = out["None"], out["3"]
    assert abs(plain_held - out["counted"]) < 0.1 * out["counted"]  # the count is what TensorFlow keeps
    assert recomputed_held < 0.35 * plain_held  # the forward pass keeps a fraction
    assert recomputed_peak > 0.7 * plain_peak  # the step's peak falls far less
