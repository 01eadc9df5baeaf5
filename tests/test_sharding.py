"""ZeRO by hand (mgpu_edu.sharding) against plain data parallelism and one device, for N = 1 to 4.

Every stage must take exactly the one-device Adam step on the whole batch, with layer sizes that
don't divide by N, uneven shards and an empty one; send the bytes the formulas say; and keep the
bytes mgpu_edu.memory.model_states says.
"""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import memory, models, sharding

BATCHES = [10, 3, 10]  # uneven shards, and with 3 examples on 4 devices one shard is empty


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(b, 7)).astype("float32"), rng.integers(0, 5, b).astype("int32")) for b in BATCHES]


def _model():
    return models.mlp(7, 5, hidden=(6,), seed=0)  # layers of 48 and 35 weights: 35 divides by none of 2, 3, 4


def _one_device_adam():
    import keras
    import tensorflow as tf

    model, optimizer, loss_fn = _model(), keras.optimizers.Adam(0.05), models.per_example_loss()
    for x, y in _data():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                      strict=True))
    return model.get_weights()


@pytest.fixture(scope="module")
def reference(four_devices):
    return _one_device_adam()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_takes_the_one_device_adam_step(four_devices, reference, stage, n):
    import keras

    zero = sharding.ZeroDataParallel(_model(), keras.optimizers.Adam(0.05), four_devices[:n], stage)
    for x, y in _data():
        zero.step(x, y, models.per_example_loss())
    for got, want in zip(zero.full_weights(), reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_sent_and_held_match_the_formulas(four_devices, stage, n):
    import keras

    zero = sharding.ZeroDataParallel(_model(), keras.optimizers.Adam(0.05), four_devices[:n], stage)
    x, y = _data()[0]
    zero.step(x, y, models.per_example_loss())
    psi = zero.params * 4  # float32 bytes of the weights
    factor = 3 if stage == 3 else 2
    assert sum(zero.bytes_sent) == factor * (n - 1) * psi  # every chunk crosses N−1 links per phase
    for sent in zero.bytes_sent:  # each device within one element per layer and phase of (N−1)/N · factor · Ψ
        assert abs(sent - factor * (n - 1) / n * psi) <= factor * (n - 1) * 4 * len(zero.weighted)
    expected = memory.model_states(zero.params, n, stage, optimizer="adam", precision="fp32")
    for held in zero.resident_bytes():
        for key, want in (("params", expected.params), ("grads", expected.grads), ("optimizer", expected.optimizer)):
            assert abs(held[key] - want) <= 8 * len(zero.weighted), (stage, n, key, held[key], want)
        assert held["other"] == 12  # Adam's step counter (int64) and learning rate (float32)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_micro_batches_take_the_same_step_and_send_what_phases_says(four_devices, reference, stage):
    """Gradient accumulation over M micro-batches: the one-device step still, and per step stages 0-1 send two ring
    phases, stage 2 M + 1 and stage 3 3M (sharding.phases), measured from the ring's transfers."""
    import keras

    n, m = 3, 3
    zero = sharding.ZeroDataParallel(_model(), keras.optimizers.Adam(0.05), four_devices[:n], stage)
    sent = []
    for x, y in _data():  # 10 examples on 3 devices in 3 micro-batches: shares of 4, 3, 3 → uneven, some empty
        zero.step(x, y, models.per_example_loss(), micro_batches=m)
        sent.append(sum(zero.bytes_sent))
    for got, want in zip(zero.full_weights(), reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    psi = zero.params * 4
    assert sharding.phases(stage, m) == {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[stage]
    assert sent == [sharding.phases(stage, m) * (n - 1) * psi] * len(sent)
    assert sharding.bytes_per_device(stage, n, psi, m) == pytest.approx(sent[0] / n)


def test_comm_seconds_for_stage_0_is_the_ring_all_reduce():
    from mgpu_edu import allreduce

    for n in (2, 5, 8):
        assert sharding.comm_seconds(0, n, 1e9) == pytest.approx(allreduce.alpha_beta_time("ring", n, 1e9))
        assert sharding.comm_seconds(3, n, 1e9, micro_batches=2) == pytest.approx(
            3 * allreduce.alpha_beta_time("ring", n, 1e9))  # 6 phases = three all-reduces' worth


def _dropout_model():
    import keras

    return keras.Sequential([keras.Input((7,)), keras.layers.Dense(6), keras.layers.Dropout(0.5, name="drop"),
                             keras.layers.Dense(5)])


@pytest.mark.parametrize(("args", "message"), [
    ({"devices": ["/GPU:7"]}, r"'/GPU:7', which is not one of TensorFlow's logical devices"),
    ({"devices": ["banana"]}, "'banana'"),
    ({"model": "dropout"}, r"layer\(s\) 'drop'.*Dropout's random seed"),
    ({"optimizer": "clipnorm"}, "clipnorm=1.0.*clipvalue, element by element, is fine"),
    ({"optimizer": "global_clipnorm", "stage": 0}, "global_clipnorm=1.0"),

    ({"stage": 4}, "stage=4 must be a whole number from 0 to 3"),
    ({"devices": []}, "devices is empty"),
    ({"optimizer": "sgd"}, "keeps no state per weight"),
    ({"model": "unbuilt"}, "build it first"),
    ({"model": "functional"}, "keras.Sequential"),
])
def test_bad_inputs_say_what_to_do(four_devices, args, message):
    import keras

    model = _model()
    if args.get("model") == "unbuilt":
        model = keras.Sequential([keras.layers.Dense(3)])
    elif args.get("model") == "dropout":
        model = _dropout_model()
    elif args.get("model") == "functional":
        inputs = keras.Input((7,))
        model = keras.Model(inputs, keras.layers.Dense(5)(inputs))
    optimizer = {"sgd": keras.optimizers.SGD(0.1), "clipnorm": keras.optimizers.Adam(0.01, clipnorm=1.0),
                 "global_clipnorm": keras.optimizers.Adam(0.01, global_clipnorm=1.0)}.get(
        args.get("optimizer"), keras.optimizers.Adam(0.01))
    with pytest.raises(ValueError, match=message):
        sharding.ZeroDataParallel(model, optimizer, args.get("devices", four_devices), args.get("stage", 1))


def test_bad_step_inputs_say_what_to_do(four_devices):
    import keras
    import tensorflow as tf

    zero = sharding.ZeroDataParallel(_model(), keras.optimizers.Adam(0.01), four_devices[:2], 2)
    x, y = _data()[0]
    with pytest.raises(ValueError, match=r"shape \(\).*one loss per example.*per_example_loss"):
        zero.step(x, y, keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # reduces to a mean
    with pytest.raises(ValueError, match="x has 10 examples and y 9"):
        zero.step(x, y[:9], models.per_example_loss())
    with pytest.raises(ValueError, match="x has 0 examples"):
        zero.step(x[:0], y[:0], models.per_example_loss())
    with pytest.raises(ValueError, match="micro_batches=0"):
        zero.step(x, y, models.per_example_loss(), micro_batches=0)
    with pytest.raises(ValueError, match="one dtype.*float32.*float64"):
        from mgpu_edu import allreduce

        with tf.device(four_devices[0]):
            a = tf.zeros([2])
        with tf.device(four_devices[1]):
            b = tf.zeros([2], tf.float64)
        allreduce.ring_all_gather([a, b])


def test_stage_0_takes_plain_sgd_and_clipvalue(four_devices):
    """Plain SGD has no state for stages 1-3 to shard, but stage 0 (plain data parallelism) runs it; clipvalue works
    element by element, so sharding doesn't change it."""
    import keras
    import tensorflow as tf

    for optimizer, stage in ((keras.optimizers.SGD(0.1), 0), (keras.optimizers.Adam(0.05, clipvalue=0.01), 3)):
        model = _model()
        reference = keras.optimizers.SGD(0.1) if stage == 0 else keras.optimizers.Adam(0.05, clipvalue=0.01)
        zero = sharding.ZeroDataParallel(_model(), optimizer, four_devices[:3], stage)
        x, y = _data()[0]
        zero.step(x, y, models.per_example_loss())
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(models.per_example_loss()(y, model(x, training=True)))
        reference.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                      strict=True))
        for got, want in zip(zero.full_weights(), model.get_weights(), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_zero3_prefetch_is_the_same_step_holding_one_more_layer(four_devices, n):
    """Gathering the next layer's weights before this layer computes changes neither the result nor the bytes; it
    holds two gathered layers at once instead of one, as memory.gathered_bytes counts."""
    import keras
    import tensorflow as tf

    from mgpu_edu import data

    digits = data.digits()
    x, y = tf.constant(digits.x_train[:30]), tf.constant(digits.y_train[:30])
    runs = {}
    for prefetch in (False, True):
        model = models.mlp(64, 10, hidden=(32, 48, 16), seed=0)
        zero = sharding.ZeroDataParallel(model, keras.optimizers.Adam(0.01), four_devices[:n], stage=3,
                                         prefetch=prefetch)
        losses = [zero.step(x, y, models.per_example_loss(), micro_batches=2) for _ in range(2)]
        runs[prefetch] = (losses, zero.full_weights(), zero.bytes_sent, zero.gathered_peak)
        sizes = [w.size for w in zero.weighted]
    (plain_losses, plain_weights, plain_sent, plain_peak), (losses, weights, sent, peak) = runs[False], runs[True]
    assert losses == plain_losses and sent == plain_sent
    for a, b in zip(weights, plain_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert sizes == [64 * 32 + 32, 32 * 48 + 48, 48 * 16 + 16, 16 * 10 + 10]
    assert plain_peak == memory.gathered_bytes(sizes) == 4 * max(sizes)
    pairs = [a + b for a, b in zip(sizes, sizes[1:], strict=False)]  # consecutive layers
    assert peak == memory.gathered_bytes(sizes, prefetch=True) == 4 * max(pairs)
    with pytest.raises(ValueError, match="prefetch=True .* only ZeRO-3 gathers: got stage=2"):
        sharding.ZeroDataParallel(models.mlp(64, 10), keras.optimizers.Adam(0.01), four_devices, stage=2,
                                  prefetch=True)
