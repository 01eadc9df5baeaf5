"""MirroredStrategy helpers and the replicas × batch explorer, without a browser.

The tests marked "oracle" ask TensorFlow and Keras themselves: what the lessons say about how
a batch splits and how ``fit`` scales a step is compared with a real run beside one device.
"""

from __future__ import annotations

import gc
import math
import threading
import time

import numpy as np
import pytest

from mgpu_edu import data, mirrored, models, strategies


def test_cassava_tutorial_arithmetic():
    assert mirrored.steps_per_epoch(5656, 64) == 89
    assert mirrored.steps_per_epoch(5656, 128) == 45
    plan = mirrored.batch_plan(5656, 64, 2)
    assert (plan.per_replica, plan.global_batch, plan.steps_per_epoch, plan.last_batch) == (64, 128, 45, 24)


@pytest.mark.parametrize(("batch", "replicas", "mode", "per", "glob"), [
    (32, 4, "per_replica", 32, 128), (100, 3, "global", 34, 100), (4, 4, "global", 1, 4), (7, 1, "global", 7, 7),
    (30, 4, "global", 8, 30)])
def test_batch_plan_modes(batch, replicas, mode, per, glob):
    plan = mirrored.batch_plan(1000, batch, replicas, mode=mode, base_lr=0.1, base_batch=32)
    assert (plan.per_replica, plan.global_batch) == (per, glob)
    assert plan.steps_per_epoch == math.ceil(1000 / glob)
    assert plan.learning_rate == pytest.approx(0.1 * glob / 32)
    assert plan.uneven == (glob % replicas != 0)
    assert sum(plan.shares) == glob and plan.shares[0] == per
    assert (plan.fit_error is None) == (glob % replicas == 0)


def test_drop_remainder_plan():
    plan = mirrored.batch_plan(1438, 32, 4, drop_remainder=True)
    assert (plan.steps_per_epoch, plan.last_batch, plan.dropped) == (11, 128, 30)
    assert plan.last_step_weights == [1.0] * 4
    kept = mirrored.batch_plan(1438, 32, 4)
    assert (kept.steps_per_epoch, kept.last_shares) == (12, [8, 8, 8, 6])
    assert kept.last_step_weights == [0.9375, 0.9375, 0.9375, 1.25]
    with pytest.raises(ValueError, match="leaves no full batch in 100 examples"):
        mirrored.batch_plan(100, 64, 4, drop_remainder=True)


def test_fit_error_names_the_value_and_the_fix():
    assert "Choose a multiple of 4 (28 or 32)" in mirrored.batch_plan(1438, 30, 4, mode="global").fit_error
    too_big = mirrored.batch_plan(1438, 512, 4).fit_error  # one batch of 1,438: 360, 360, 360, 358
    assert "360, 360, 360, 358" in too_big and "at most 359 per replica" in too_big
    assert "validation_batch_size, e.g. 1,436" in too_big
    tiny = mirrored.batch_plan(2, 64, 4, mode="global").fit_error  # 2 examples on 4 replicas: 1, 1, 0, 0
    assert "Fewer examples than replicas" in tiny and "at most 0" not in tiny
    assert mirrored.batch_plan(1438, 512, 1).fit_error is None
    assert mirrored.batch_plan(1440, 512, 4).fit_error is None  # one batch of 1,440 splits 360 × 4


@pytest.mark.parametrize(("shares", "weights"), [
    ([16, 16, 16, 16], [1.0, 1.0, 1.0, 1.0]), ([2, 2, 2, 0], [0.75, 0.75, 0.75, None]), ([5], [1.0])])
def test_fit_example_weights(shares, weights):
    assert mirrored.fit_example_weights(shares) == weights


@pytest.mark.parametrize("bad", [[], [2, -1], [2, 1.5], [True], "22"])
def test_fit_example_weights_rejects_bad_shares(bad):
    with pytest.raises(ValueError, match="shares="):
        mirrored.fit_example_weights(bad)


# ----------------------------------------------------------------------------- oracles: TensorFlow itself


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_oracle_replica_shares_are_tensorflows_split(four_devices, replicas):
    """replica_shares (drawn by the explorer, stated by lesson 04) is exactly how TensorFlow splits."""
    import tensorflow as tf

    strategy = strategies.make_strategy(four_devices[:replicas])
    for examples, batch in [(70, 64), (60, 30), (10, 10), (13, 5), (7, 7), (3, 3), (5, 2), (33, 16)]:
        for drop in (False, True):
            dataset = tf.data.Dataset.range(examples).batch(batch, drop_remainder=drop)
            sizes = [batch] * (examples // batch) + ([] if drop or examples % batch == 0 else [examples % batch])
            assert mirrored.observed_shares(strategy, dataset) == [mirrored.replica_shares(b, replicas)
                                                                   for b in sizes], (examples, batch, drop)
    x, y = np.zeros((70, 3), "float32"), np.zeros(70, "int32")  # the lessons' pipeline splits the same way
    assert mirrored.observed_shares(strategy, mirrored.input_pipeline(x, y, 64)) == [
        mirrored.replica_shares(64, replicas), mirrored.replica_shares(6, replicas)]


def _linear(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])


def _xy(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def test_oracle_fit_scales_each_replica_mean_by_one_over_n(four_devices):
    """Keras 3 fit on 4 replicas: a short last batch split 2, 2, 2, 0 gets 0.75 × the one-device step."""
    x, y = _xy(70)
    uneven = mirrored.compare_fit(_linear, x, y, 64, four_devices)
    assert uneven.shares == [[16, 16, 16, 16], [2, 2, 2, 0]]
    assert uneven.step_ratios == pytest.approx([1.0, 0.75], abs=1e-4)
    assert uneven.step_ratios[1] == pytest.approx(mirrored.fit_example_weights([2, 2, 2, 0])[0], abs=1e-4)
    assert uneven.max_difference > 0.01
    dropped = mirrored.compare_fit(_linear, x, y, 64, four_devices, drop_remainder=True)
    assert dropped.shares == [[16, 16, 16, 16]] and dropped.max_difference < 1e-5
    one = mirrored.compare_fit(_linear, x, y, 64, four_devices[:1])  # one replica: fit's mean is the right one
    assert one.step_ratios == pytest.approx([1.0, 1.0], abs=1e-4)


def test_oracle_fit_weights_unequal_shares_as_fit_example_weights_says(four_devices):
    """A last batch split 8, 8, 8, 6: fit's step is the one-device step on examples weighted B/(N·n_k)."""
    import keras
    import tensorflow as tf

    x, y = _xy(62)  # batches of 32 ([8, 8, 8, 8]) and 30 ([8, 8, 8, 6])
    strategy = strategies.make_strategy(four_devices)
    with strategy.scope():
        model = _linear()
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=1, verbose=0)
    reference, optimizer = _linear(), keras.optimizers.SGD(0.5)
    loss_fn = models.per_example_loss()
    for start, end in [(0, 32), (32, 62)]:
        shares = mirrored.replica_shares(end - start, 4)
        weights = np.repeat([w or 0.0 for w in mirrored.fit_example_weights(shares)], shares)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y[start:end], reference(x[start:end])) * weights)
        optimizer.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                                      reference.trainable_variables, strict=True))
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_oracle_a_failed_fit_leaves_its_input_iterator_to_the_garbage_collector(four_devices):
    """Lessons 04, 08 and 11 collect the garbage right after a fit that raised: Keras 3 leaves that fit's
    distributed input iterator alive in a reference cycle once the except block has ended (an error kept in
    a variable keeps it alive even then), and only the garbage collector frees it; a fit that fails in its
    validation also leaves the validation iterator on the model. A fit that ends normally frees its
    iterators at once. (Freeing an old one can stall: CONTRIBUTING.md.)"""
    import keras
    import tensorflow as tf
    from tensorflow.python.distribute import input_lib

    def alive():
        return sum(isinstance(o, input_lib.DistributedIterator) for o in gc.get_objects())

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("simulated failure")

    x, y = _xy(64)
    strategy = strategies.make_strategy(four_devices)
    with strategy.scope():
        model = _linear()
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    gc.collect()
    gc.disable()  # no automatic collection in between: what is left is what reference counting leaves
    try:
        before = alive()
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)  # ends normally
        assert alive() == before
        try:
            model.fit(x[:60], y[:60], batch_size=30, epochs=1, verbose=0)  # lesson 04: fails in AddN
        except tf.errors.InvalidArgumentError:
            pass
        assert alive() == before + 1
        try:
            model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[Crash()])  # lesson 11: a crash
        except RuntimeError as error:
            kept = error
        assert alive() == before + 2
        gc.collect()
        assert alive() == before + 1  # the kept error still holds its fit's iterator (lesson 08 keeps the text)
        del kept
        gc.collect()
        assert alive() == before
        try:  # lesson 04: a first validation batch that splits unevenly fails after the epoch has trained
            model.fit(x, y, batch_size=64, epochs=1, verbose=0, validation_data=(x[:30], y[:30]))
        except tf.errors.InvalidArgumentError:
            pass
        gc.collect()
        assert alive() == before + 1 and model._eval_epoch_iterator is not None  # Keras keeps it on the model
        del model
        gc.collect()
        assert alive() == before  # so lesson 04 gives each attempt a model of its own and deletes it
    finally:
        gc.enable()


def test_oracle_fit_fails_when_its_first_batch_splits_unevenly(four_devices):
    """What BatchPlan.fit_error predicts: fit on 30 examples a batch over 4 replicas fails in AddN."""
    import keras
    import tensorflow as tf

    assert mirrored.batch_plan(60, 30, 4, mode="global").fit_error
    x, y = _xy(60)
    strategy = strategies.make_strategy(four_devices)
    with strategy.scope():
        model = _linear()
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="AddN"):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(30), epochs=1, verbose=0)
    gc.collect()  # free the failed fit's iterator while it is young (lesson 04)
    with pytest.raises(ValueError, match="Choose a multiple of 4"):
        mirrored.train_mirrored(lambda: models.small_cnn((8, 8, 1), 10), _small_split(), replicas=4,
                                global_batch=30, devices=four_devices)


def _custom_loop(strategy, x, y, batch, optimizer, **options):
    import tensorflow as tf

    with strategy.scope():
        model = _linear()
        opt = optimizer()
    step = mirrored.make_train_step(strategy, model, opt, models.per_example_loss(), **options)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))
    losses = [float(step(b)) for b in dataset]
    return model, losses


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_oracle_custom_step_is_the_one_device_step_with_uneven_batches(four_devices, optimizer):
    """make_train_step over 4 replicas, last batch split 2, 2, 2, 0, equals fit on one device."""
    import keras
    import tensorflow as tf

    make = {"sgd": lambda: keras.optimizers.SGD(0.5), "adam": lambda: keras.optimizers.Adam(0.05)}[optimizer]
    x, y = _xy(70)
    strategy = strategies.make_strategy(four_devices)
    assert mirrored.observed_shares(strategy, tf.data.Dataset.from_tensor_slices((x, y)).batch(64))[-1] == [2, 2, 2, 0]
    custom, losses = _custom_loop(strategy, x, y, 64, make)
    reference = _linear()
    reference.compile(optimizer=make(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    per_step = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: per_step.append(logs["loss"]))
    reference.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=1, verbose=0, callbacks=[record])
    for got, want in zip(custom.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # each step's returned loss is that batch's mean (fit's logged loss is a running mean over the epoch)
    assert losses[0] == pytest.approx(per_step[0], rel=1e-5)
    assert (losses[0] * 64 + losses[1] * 6) / 70 == pytest.approx(per_step[1], rel=1e-5)
    constant, _ = _custom_loop(strategies.make_strategy(four_devices), x, y, 64, make, divide_by=64)
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(constant.get_weights(), reference.get_weights(),
                                                                           strict=True))
    assert difference > 1e-3  # dividing the short batch by 64 instead of 6 takes a smaller, wrong step


def test_oracle_adam_needs_building_in_scope_before_strategy_run(four_devices):
    """Adam's slots made inside strategy.run under tf.function fail on two replicas as on four (lesson
    06 shows it on two), not on one; building first in the scope works."""
    import keras
    import tensorflow as tf

    x, y = _xy(64)
    for replicas in (2, 4):
        with pytest.raises(tf.errors.InvalidArgumentError, match="must feed a value for placeholder"):
            _custom_loop(strategies.make_strategy(four_devices[:replicas]), x, y, 64,
                         lambda: keras.optimizers.Adam(0.01), build_optimizer=False)
    _, alone = _custom_loop(strategies.make_strategy(four_devices[:1]), x, y, 64, lambda: keras.optimizers.Adam(0.01),
                            build_optimizer=False)
    assert len(alone) == 1 and math.isfinite(alone[0])  # one replica gets away with it
    two = strategies.make_strategy(four_devices[:2])  # and so does an eager step, on two replicas
    with two.scope():
        model, unbuilt = _linear(), keras.optimizers.Adam(0.01)
    step = mirrored.make_train_step(two, model, unbuilt, models.per_example_loss(), build_optimizer=False)
    eager = step.python_function
    eager(next(iter(two.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(64)))))
    assert type(unbuilt.variables[-1].value).__name__ == "MirroredVariable"  # its slots, made eagerly, mirrored
    _custom_loop(strategies.make_strategy(four_devices), x, y, 64, lambda: keras.optimizers.SGD(0.1),
                 build_optimizer=False)  # no slots, nothing to build: works either way
    model, losses = _custom_loop(strategies.make_strategy(four_devices), x, y, 64, lambda: keras.optimizers.Adam(0.01))
    assert len(losses) == 1 and math.isfinite(losses[0])


def test_make_train_step_rejects_a_bad_divisor(four_devices):
    with pytest.raises(ValueError, match="divide_by=0"):
        mirrored.make_train_step(None, None, None, None, divide_by=0)


def test_make_train_step_refuses_an_optimizer_made_outside_the_scope(four_devices):
    """Made outside strategy.scope(), an optimizer's step counter is one variable that every replica
    increments: 2 counts per step on 2 replicas (TensorFlow itself, below). make_train_step says so."""
    import keras
    import tensorflow as tf

    strategy = strategies.make_strategy(four_devices[:2])
    with strategy.scope():
        model = _linear()
    outside = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="outside strategy.scope"):
        mirrored.make_train_step(strategy, model, outside, models.per_example_loss())

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(models.per_example_loss()(y, model(x)))
            outside.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                        strict=True))
        strategy.run(replica, args=(x, y))

    x, y = _xy(8)
    step(tf.constant(x), tf.constant(y))
    assert int(outside.iterations.numpy()) == 2  # one step, counted once per replica


def test_invalid_combinations_are_explained():
    with pytest.raises(ValueError, match="global batch of 3 can't be split over 4 replicas"):
        mirrored.batch_plan(100, 3, 4, mode="global")
    with pytest.raises(ValueError, match="mode='both'"):
        mirrored.batch_plan(100, 3, 4, mode="both")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="replicas="):
            mirrored.batch_plan(100, 32, bad)
    with pytest.raises(ValueError, match="base_lr=0"):
        mirrored.scaled_learning_rate(0, 32, 64)


def test_linear_scaling():
    assert mirrored.scaled_learning_rate(0.05, 32, 1024) == pytest.approx(1.6)


def _small_split():
    split = data.digits(images=True)
    return split._replace(x_train=split.x_train[:256], y_train=split.y_train[:256])


def test_train_mirrored_really_trains(four_devices):
    result = mirrored.train_mirrored(lambda: models.small_cnn((8, 8, 1), 10), _small_split(), replicas=2,
                                     global_batch=64, epochs=2, learning_rate=0.05, devices=four_devices)
    assert (result.replicas, result.global_batch, result.per_replica, result.steps_per_epoch) == (2, 64, 32, 4)
    assert result.seconds_per_epoch > 0 and result.examples_per_second > 0
    assert math.isfinite(result.loss) and 0 <= result.accuracy <= 1
    assert set(result.row()) == {"replicas", "global batch", "per-replica batch", "steps/epoch", "s/epoch",
                                 "examples/s", "final loss", "accuracy"}
    with pytest.raises(ValueError, match="replicas=5 must be a whole number from 1 to 4. This kernel has 4 devices"):
        mirrored.train_mirrored(lambda: None, _small_split(), replicas=5, global_batch=64, devices=four_devices)


def test_train_mirrored_times_only_the_steps(four_devices):
    """Time outside the steps (here a slow progress callback) never counts towards s/epoch."""
    progress = []

    def slow_progress(done, total):
        progress.append((done, total))
        time.sleep(0.25)

    result = mirrored.train_mirrored(lambda: models.small_cnn((8, 8, 1), 10), _small_split(), replicas=2,
                                     global_batch=64, epochs=2, devices=four_devices, on_batch=slow_progress)
    assert progress == [(i, 8) for i in range(1, 9)]
    assert result.seconds_per_epoch < 0.25 * result.steps_per_epoch / 2  # 4 steps/epoch would add 1 s


@pytest.mark.widgets
def test_explorer_live_part_and_invalid_choice():
    from mgpu_edu.display.widgets import ReplicaBatchExplorer

    explorer = ReplicaBatchExplorer(None, _small_split(), devices=[f"/device:CPU:{i}" for i in range(4)],
                                    background=False)
    assert "mgpu-explorer" in explorer.root._dom_classes and "mgpu-results" in explorer.table._dom_classes
    assert explorer.replicas.max == 4  # more replicas than devices can't be chosen
    assert explorer.drop_remainder.value  # fit mis-scales the short last batch, so it is dropped by default
    explorer.replicas.value, explorer.batch.value = 4, 32
    assert "global batch <b>128</b>" in explorer.numbers.value and "<b>2</b> steps" in explorer.numbers.value
    assert "<b>0.2</b>" in explorer.numbers.value  # 0.05 × 128 / 32
    assert "its right weight" not in explorer.numbers.value  # 256 examples: two full batches of 128
    explorer.replicas.value, explorer.batch.value, explorer.drop_remainder.value = 3, 10, False
    # 256 = 8 × 30 + 16, and TensorFlow splits the last 16 as 6, 6, 4
    assert "(16, split 6, 6, 4) gets 0.889× and 1.333× its right weight" in explorer.numbers.value
    explorer.drop_remainder.value = True
    assert "<b>8</b> steps" in explorer.numbers.value and "(16 dropped)" in explorer.numbers.value
    explorer.replicas.value = 4
    explorer.mode.value = "global"
    explorer.batch.value = 3
    assert "can&#x27;t be split over 4 replicas" in explorer.numbers.value
    assert explorer.train_button.disabled
    assert explorer.train() is None and "⚠" in explorer.status.value  # explained, no exception
    explorer.batch.value = 30  # TensorFlow splits 8, 8, 8, 6: drawn as such, and fit can't train it
    assert "split 8, 8, 8, 6" in explorer.numbers.value and "replica 3 · 6" in explorer.diagram.value
    assert "Choose a multiple of 4 (28 or 32)" in explorer.numbers.value and explorer.train_button.disabled
    explorer.batch.value = 32
    assert not explorer.train_button.disabled


@pytest.mark.widgets
def test_explorer_trains_adds_rows_and_ignores_second_click(four_devices):
    from mgpu_edu.display.widgets import ReplicaBatchExplorer

    explorer = ReplicaBatchExplorer(lambda: models.small_cnn((8, 8, 1), 10), _small_split(), devices=four_devices,
                                    epochs=1)
    started = threading.Event()
    original = explorer._on_batch

    def slow_progress(done, total):
        started.set()
        original(done, total)

    explorer._on_batch = slow_progress
    explorer.replicas.value = 2
    explorer._clicked()  # background thread, as a real click
    assert started.wait(60)
    explorer._clicked()  # a second click while training: ignored
    assert explorer.train_button.disabled
    for _ in range(600):
        if not explorer.busy:
            break
        threading.Event().wait(0.1)
    assert len(explorer.results) == 1 and explorer.table.value.count("<tr>") == 2
    assert explorer.progress.value == explorer.progress.max
    assert not explorer.train_button.disabled
    explorer.background = False
    explorer.replicas.value = 1
    explorer.train()
    assert [r.replicas for r in explorer.results] == [2, 1]
    assert explorer.chart.value[:4] == b"\x89PNG"


def _regularized_loop(strategy, x, y, regularization):
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = models.mlp(64, 10, hidden=(32,), seed=0, l2=0.01)
        optimizer = keras.optimizers.SGD(0.5)
    step = mirrored.make_train_step(strategy, model, optimizer, models.per_example_loss(),
                                    regularization=regularization)
    losses = [float(step(b)) for b in strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(64))]
    return model.get_weights(), losses


@pytest.mark.parametrize("replicas", [2, 4])
def test_oracle_regularization_counts_once_only_when_scaled(four_devices, replicas):
    """Lesson 06: model.losses added to every replica's loss counts the penalty N times (the all-reduce adds
    N copies of its gradient); tf.nn.scale_regularization_loss divides it by N and takes the one-device step.
    The reference is Keras fit on one device, whose loss is the batch mean plus the penalty."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(70, 64)).astype("float32"), rng.integers(0, 10, 70).astype("int32")
    reference = models.mlp(64, 10, hidden=(32,), seed=0, l2=0.01)
    assert len(reference.losses) == 2  # one penalty per kernel
    reference.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    per_step = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: per_step.append(logs["loss"]))
    reference.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=1, verbose=0, callbacks=[record])
    gap = {}
    for way in mirrored.REGULARIZATION:
        weights, losses = _regularized_loop(strategies.make_strategy(four_devices[:replicas]), x, y, way)
        gap[way] = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference.get_weights(), strict=True))
        if way == "scaled":
            assert losses[0] == pytest.approx(per_step[0], rel=1e-5)  # batch mean + one penalty, as fit logs it
    assert gap["scaled"] < 1e-5
    assert gap["per_replica"] > 1e-3  # the penalty's gradient counted N times
    with pytest.raises(ValueError, match="regularization='twice'"):
        mirrored.make_train_step(None, None, None, None, regularization="twice")


def test_oracle_every_mean_loss_divides_by_the_replicas_in_a_strategys_scope(four_devices):
    """Lesson 04: the ÷N is the loss object's, not fit's: a Keras loss with a mean reduction called in a
    strategy's scope (or inside strategy.run) divides by num_replicas_in_sync; reduction=None and "sum" don't."""
    import keras
    import tensorflow as tf

    x, y = _xy(8)
    logits = tf.constant(np.random.default_rng(0).normal(size=(8, 10)), tf.float32)
    mean = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    total = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    outside = [float(mean(y, logits)), float(tf.reduce_sum(per_example(y, logits))), float(total(y, logits))]
    for replicas in (1, 2, 4):
        strategy = strategies.make_strategy(four_devices[:replicas])
        with strategy.scope():
            inside = [float(mean(y, logits)), float(tf.reduce_sum(per_example(y, logits))), float(total(y, logits))]
        in_run = strategy.experimental_local_results(strategy.run(tf.function(lambda: mean(y, logits))))
        assert inside[0] == pytest.approx(outside[0] / replicas, rel=1e-6)
        assert [float(v) for v in in_run] == pytest.approx([outside[0] / replicas] * replicas, rel=1e-6)
        assert inside[1:] == pytest.approx(outside[1:], rel=1e-6)  # per-example and sum: not scaled


def test_oracle_fit_fails_when_the_first_validation_batch_splits_unevenly(four_devices):
    """Lesson 04: the AddN failure comes from the first batch of the training *or* validation data: 30
    validation examples at batch 64 on 4 replicas fail, and so does fit(batch_size=30) on arrays; predict
    (and a validation set that splits evenly) work."""
    import keras
    import tensorflow as tf

    x, y = _xy(128)
    strategy = strategies.make_strategy(four_devices)

    def compiled():
        with strategy.scope():
            model = _linear()
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = compiled()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, validation_data=(x[:32], y[:32]))  # 32 = 8 × 4: fine
    with pytest.raises(tf.errors.InvalidArgumentError, match="AddN"):
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, validation_data=(x[:30], y[:30]))
    # Free the failed fit's iterators while they are young, as lesson 04 does: the model keeps the validation
    # one, so it goes first (test_oracle_a_failed_fit_leaves_its_input_iterator_to_the_garbage_collector).
    del model
    gc.collect()
    model = compiled()
    with pytest.raises(tf.errors.InvalidArgumentError, match="AddN"):
        model.fit(x[:60], y[:60], batch_size=30, epochs=1, verbose=0)
    gc.collect()
    assert model.predict(x[:30], batch_size=30, verbose=0).shape == (30, 3)
