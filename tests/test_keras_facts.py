"""What the lessons say Keras and TensorFlow do, asked of Keras and TensorFlow themselves.

Each test is an oracle for one sentence in a lesson: it runs the real thing on the logical
devices of this process (see conftest.four_devices) and checks the claim, not our arithmetic.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import mirrored, models, strategies


def test_softmax_output_keeps_its_logits_for_keras_losses(four_devices):
    """Lesson 05 §2: a from_logits=True loss uses the logits behind a softmax output tensor; plain
    arrays (what predict returns) hit the softmax-twice floor."""
    import keras
    import tensorflow as tf

    buggy, fixed = models.text_cnn(50, 12, 4, softmax_output=True), models.text_cnn(50, 12, 4)
    x = np.random.default_rng(0).integers(0, 50, (64, 12)).astype("int32")
    y = np.random.default_rng(1).integers(0, 4, 64).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    output = buggy(x)
    assert hasattr(output, "_keras_logits")
    assert float(loss(y, output)) == pytest.approx(float(loss(y, fixed(x))), rel=1e-5)
    probabilities = np.asarray(output)  # what predict returns: plain numbers, the logits are gone
    twice = -np.log(np.exp(probabilities) / np.exp(probabilities).sum(axis=1, keepdims=True))[np.arange(64), y]
    assert float(loss(y, probabilities)) == pytest.approx(float(twice.mean()), rel=1e-5)  # softmax applied again
    floor = math.log(1 + (4 - 1) / math.e)  # even a perfect prediction costs this
    assert float(loss(np.zeros(1, "int32"), np.array([[1.0, 0, 0, 0]], "float32"))) == pytest.approx(floor, rel=1e-5)
    assert float(loss(y, probabilities)) >= floor
    # inside fit too: the buggy model trains exactly like the fixed one
    for model in (buggy, fixed):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=1, verbose=0)
    for a, b in zip(buggy.get_weights(), fixed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compute_average_loss_default_is_local_size_times_replicas(four_devices):
    """Lesson 06 §2: without global_batch_size, tf.nn.compute_average_loss divides by this
    replica's size × the replicas: 2 × 4 = 8 on a batch of 6 split 2, 2, 2, 0."""
    import tensorflow as tf

    strategy = strategies.make_strategy(four_devices)
    losses = np.arange(1, 7, dtype="float32")
    batch = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(losses).batch(6))))

    @tf.function
    def average(values):
        default = strategy.run(tf.nn.compute_average_loss, args=(values,))
        exact = strategy.run(lambda v: tf.nn.compute_average_loss(v, global_batch_size=6), args=(values,))
        return (strategy.reduce("SUM", default, axis=None), strategy.reduce("SUM", exact, axis=None))

    default, exact = average(batch)
    assert float(exact) == pytest.approx(losses.mean())
    assert float(default) == pytest.approx(losses.sum() / 8)  # the 0.75 × of fit, once more


def test_tf_device_names(four_devices):
    """Lesson 01 §1: a physical name raises; a logical device that doesn't exist is silently replaced."""
    import tensorflow as tf

    with pytest.raises(ValueError, match="physical_device"):
        with tf.device("/physical_device:CPU:0"):
            tf.ones(2)
    with tf.device("/device:CPU:9"):
        z = tf.ones(2) + 1
    assert z.device.endswith("CPU:0")
    assert tf.config.list_physical_devices("gpu") == [] and tf.config.list_logical_devices("cpu") == []


def test_a_new_batch_shape_traces_the_step_again(four_devices):
    """Lesson 06 §2: the short last batch traces the replica step once more (2 traces × 4 replicas)."""
    import keras
    import tensorflow as tf

    strategy = strategies.make_strategy(four_devices)
    with strategy.scope():
        model = models.mlp(8, 3, hidden=(4,))
        optimizer = keras.optimizers.SGD(0.1)
    runs = []
    loss = models.per_example_loss()

    def counted(y, logits):
        runs.append(1)
        return loss(y, logits)

    step = mirrored.make_train_step(strategy, model, optimizer, counted)
    x, y = np.zeros((70, 8), "float32"), np.zeros(70, "int32")
    for batch in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16)):
        step(batch)  # four batches of 16 (4 each), then 6 (2, 2, 2, 0)
    assert len(runs) == 2 * 4


def test_mixed_precision_keeps_float32_variables_and_gradients(four_devices):
    """Lesson 08 and the scaling simulator: under Keras mixed precision the weights, and so the
    gradients that are all-reduced, stay float32 (only the computation is 16-bit)."""
    import keras
    import tensorflow as tf

    strategy = strategies.make_strategy(four_devices)
    for policy in ("mixed_bfloat16", "mixed_float16"):
        keras.mixed_precision.set_dtype_policy(policy)
        try:
            with strategy.scope():
                model = models.mlp(8, 3, hidden=(4,))
            assert all(v.dtype == "float32" for v in model.trainable_variables)

            @tf.function
            def grads(x, model=model):
                def replica(x):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_sum(tf.cast(model(x), tf.float32))
                    return tape.gradient(loss, model.trainable_variables)[0]
                return strategy.run(replica, args=(x,))

            assert grads(tf.ones((2, 8))).values[0].dtype == tf.float32
        finally:
            keras.mixed_precision.set_dtype_policy("float32")


def test_all_reducing_gradients_yourself_then_apply_gradients_adds_them_twice(four_devices):
    """Lesson 02 §6: Keras 3's apply_gradients always all-reduces, so pre-reduced gradients are summed
    again: an N times too big step."""
    import keras
    import tensorflow as tf

    strategy = strategies.make_strategy(four_devices)
    with strategy.scope():
        variable = keras.Variable(0.0)
        optimizer = keras.optimizers.SGD(1.0)

    @tf.function
    def step(reduce_first):
        def replica():
            grads = [tf.constant(1.0)]  # every replica's gradient is 1: the right sum is 4
            if reduce_first:
                grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
            optimizer.apply_gradients(zip(grads, [variable], strict=True))
        strategy.run(replica)

    step(False)
    assert float(variable.numpy()) == -4.0  # one all-reduce: the sum of 4 gradients of 1
    step(True)
    assert float(variable.numpy()) == -4.0 - 16.0  # reduced twice: 4 × 4



@pytest.mark.processes
def test_fit_steps_per_execution_fails_with_replicas_and_steps_per_call_matches_one_step_per_call():
    """Lesson 08 §4: `fit` with steps_per_execution > 1 fails under MirroredStrategy with more than one
    replica (the error of keras-team/keras#19246) and runs with one; `mirrored.steps_per_call` runs
    several steps per call and takes exactly the steps one step per call takes. In a process of its
    own: strategies of different sizes in one process collide in TensorFlow's collective groups."""
    out = run_fresh("""
        import numpy as np
        from mgpu_edu import devices, mirrored, models
        layout = list(devices.setup_devices(2, verbose=False))
        import keras
        import tensorflow as tf

        x = np.random.default_rng(0).normal(size=(256, 64)).astype("float32")
        y = np.random.default_rng(1).integers(0, 10, 256).astype("int32")
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        result = {"fit": {}}
        for replicas in (2, 1):
            strategy = tf.distribute.MirroredStrategy(layout[:replicas])
            with strategy.scope():
                model = models.mlp(64, 10, seed=0)
                model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, steps_per_execution=4)
            try:
                model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
                result["fit"][replicas] = "ran"
            except tf.errors.InvalidArgumentError as error:
                result["fit"][replicas] = str(error)
        strategy = tf.distribute.MirroredStrategy(layout)
        weights = []
        for k in (1, 4):
            with strategy.scope():
                model = models.mlp(64, 10, seed=0)
                optimizer = keras.optimizers.SGD(0.1)
            step = mirrored.make_train_step(strategy, model, optimizer, models.per_example_loss())
            batches = iter(strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)))
            call = mirrored.steps_per_call(step, k)
            for _ in range(8 // k):
                call(batches)
            weights.append(model.get_weights())
        result["gap"] = max(float(np.max(np.abs(a - b))) for a, b in zip(*weights))
    """)["result"]
    assert "must feed a value for placeholder" in out["fit"]["2"]  # two replicas: fails
    assert out["fit"]["1"] == "ran"  # one replica: runs
    assert out["gap"] < 1e-6  # 4 steps per call take the same 8 steps as 1 per call


def test_backup_and_restore_with_save_freq_records_the_batch_but_restarts_the_epoch(four_devices, tmp_path):
    """Lesson 11 §1: with save_freq=N, BackupAndRestore's metadata records the batch of the last
    backup, yet a restarted `fit` starts that epoch again from its first batch (only the epoch is
    restored), so the batches before the backup are trained on twice: the weights differ from an
    unbroken run's. With the default save_freq="epoch" nothing is trained twice (the lesson's run)."""
    import json

    import keras

    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = np.random.default_rng(1).integers(0, 3, 64).astype("int32")

    def model():
        keras.utils.set_random_seed(0)
        built = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        built.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return built

    class Batches(keras.callbacks.Callback):  # (epoch, batch) of every batch fit runs
        def __init__(self, crash_at=None):
            super().__init__()
            self.seen, self.epoch, self.crash_at = [], None, crash_at

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.seen.append((self.epoch, batch))

        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch) == self.crash_at:
                raise RuntimeError("simulated failure")

    unbroken = model()
    unbroken.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)  # 8 batches per epoch
    backup = tmp_path / "backup"
    first, second = Batches(crash_at=(1, 5)), Batches()
    with pytest.raises(RuntimeError, match="simulated failure"):
        model().fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(str(backup), save_freq=3), first])
    gc.collect()  # free the failed fit's iterator while it is young (lesson 04; CONTRIBUTING.md: the stall)
    metadata = json.loads((backup / "training_metadata.json").read_text())
    assert metadata["epoch"] == 1 and metadata["batch"] > 0  # a backup taken during epoch 1, after batch 0
    resumed = model()
    resumed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(str(backup), save_freq=3), second])
    assert second.seen == [(1, b) for b in range(8)]  # epoch 1 again, from batch 0, not after metadata["batch"]
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(resumed.get_weights(), unbroken.get_weights(), strict=True))
    assert gap > 1e-4  # batches 0..metadata["batch"] of epoch 1 were trained on twice


def test_backup_and_restore_with_save_freq_records_epoch_0_after_a_restart(four_devices, tmp_path):
    """Lesson 11 §1: in Keras 3.15, batch backups written by a resumed `fit` record epoch 0 (the
    callback's epoch counter starts at 0 and restoring doesn't set it), so a second crash restarts
    training from epoch 0 with trained weights. The lesson says not to rely on save_freq=N."""
    import json

    import keras

    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = np.random.default_rng(1).integers(0, 3, 64).astype("int32")

    class Epochs(keras.callbacks.Callback):
        def __init__(self, crash_at=None):
            super().__init__()
            self.seen, self.crash_at = [], crash_at

        def on_epoch_begin(self, epoch, logs=None):
            self.seen.append(epoch)

        def on_train_batch_end(self, batch, logs=None):
            if (self.seen[-1], batch) == self.crash_at:
                raise RuntimeError("simulated failure")

    backup, begun = tmp_path / "backup", []
    for crash_at in [(2, 5), (2, 6), None]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        epochs = Epochs(crash_at)
        try:
            model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0,
                      callbacks=[keras.callbacks.BackupAndRestore(str(backup), save_freq=3), epochs])
        except RuntimeError:
            pass
        gc.collect()  # free the failed fit's iterator while it is young (lesson 04)
        begun.append(epochs.seen)
        if crash_at == (2, 6):
            assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 0
    assert begun == [[0, 1, 2], [2], [0, 1, 2, 3]]  # the third run starts again from epoch 0


@pytest.mark.processes
def test_a_fresh_shuffling_pipeline_reads_epoch_0s_order_first():
    """Lesson 11 §1: BackupAndRestore restores the epoch number, not where a shuffling pipeline's
    random generator was. A seeded tf.data shuffle gives a new order each pass; a restarted process
    builds the pipeline again, and its first pass (the resumed epoch) repeats epoch 0's order."""
    code = """
        import tensorflow as tf
        pipeline = tf.data.Dataset.range(16).shuffle(16, seed=1)
        result = [[int(v) for v in pipeline] for _ in range(PASSES)]
    """
    epoch0, epoch1 = run_fresh(code.replace("PASSES", "2"))["result"]  # the unbroken process: two epochs
    [resumed] = run_fresh(code.replace("PASSES", "1"))["result"]  # a restarted process, resuming at epoch 1
    assert epoch0 != epoch1  # reshuffled each pass
    assert resumed == epoch0  # the resumed epoch 1 reads epoch 0's order, not epoch 1's


@pytest.mark.processes
def test_log_device_placement_turned_on_after_tensorflow_started_prints_nothing():
    """Lesson 01: tf.debugging.set_log_device_placement(True) logs every placement only when it is turned on
    before TensorFlow starts; once setup_devices has started it (as in every lesson's kernel), TensorFlow 2.21
    prints nothing, on stdout or stderr, even with its C++ information lines on."""
    out = run_fresh("""
        import os, tempfile
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        import mgpu_edu
        mgpu_edu.setup_devices(4, verbose=False)
        import tensorflow as tf
        tf.debugging.set_log_device_placement(True)
        with tempfile.TemporaryFile() as sink:
            saved = [os.dup(1), os.dup(2)]
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                with tf.device("/device:CPU:2"):
                    (tf.ones((2, 2)) + 1).numpy()
                tf.function(lambda x: x * 2)(tf.ones(2)).numpy()
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
            sink.seek(0)
            result = sink.read().decode()
    """)["result"]
    assert "Executing op" not in out and "AddV2" not in out and "Mul" not in out, out[:500]


def test_an_asynchronous_checkpoint_is_written_in_the_background_and_restores(tmp_path):
    """Lesson 11 §3: tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True) makes save return
    while the files are still being written; Checkpoint.sync() waits for them; the checkpoint restores."""
    import keras
    import tensorflow as tf

    model = models.mlp(8, 2, hidden=(4,), seed=0)
    checkpoint = tf.train.Checkpoint(model=model)
    path = checkpoint.save(str(tmp_path / "ckpt"),
                           options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True))
    checkpoint.sync()  # wait for the background write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    restored = models.mlp(8, 2, hidden=(4,), seed=1)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    for a, b in zip(model.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert isinstance(model, keras.Model)


def test_tf_function_queues_stateful_ops_without_a_variable_but_not_writes_to_different_variables(four_devices):
    """Lesson 01 §2: tf.function keeps stateful ops that take no variable (tf.timestamp, tf.print) in program
    order; reads and writes of one variable stay ordered among themselves, but writes to different variables
    (on different devices) get no order between them."""
    import tensorflow as tf

    variables = []
    for device in four_devices[:2]:
        with tf.device(device):
            variables.append(tf.Variable(0.0))

    @tf.function
    def step():
        stamps = [tf.timestamp(), tf.timestamp()]
        for variable in variables:
            variable.assign_add(1.0)
        return stamps, variables[0].read_value()  # a read after the first variable's write

    graph = step.get_concrete_function().graph
    stamps = [op for op in graph.get_operations() if op.type == "Timestamp"]
    writes = [op for op in graph.get_operations() if op.type == "AssignAddVariableOp"]
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp" and op.inputs[0] is writes[0].inputs[0]]
    assert len(stamps) == 2 and len(writes) == 2 and reads
    assert stamps[0] in stamps[1].control_inputs  # the second timestamp waits for the first
    assert not writes[0].control_inputs and not writes[1].control_inputs  # the two writes: no order between them
    assert any(writes[0] in read.control_inputs for read in reads)  # one variable's read waits for its write


def test_synchronized_batch_normalization_normalises_with_the_whole_batch(four_devices):
    """Lesson 02 §4: under a strategy, BatchNormalization computes each replica's statistics from its own
    shard; synchronized=True all-reduces them, so every replica normalises with the whole batch's, as one
    device does. 30 examples on 4 replicas (8, 8, 8, 6)."""
    import keras
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(30, 5)).astype("float32") * [1, 2, 3, 4, 5]
    one_device = keras.layers.BatchNormalization()(x, training=True).numpy()
    gaps = {}
    for synchronized in (False, True):
        strategy = strategies.make_strategy(four_devices)
        with strategy.scope():
            layer = keras.layers.BatchNormalization(synchronized=synchronized)
            layer.build((None, 5))
        batch = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(x).batch(30))))
        out = strategy.experimental_local_results(
            strategy.run(tf.function(lambda b, layer=layer: layer(b, training=True)), args=(batch,)))
        gaps[synchronized] = float(np.max(np.abs(np.concatenate([o.numpy() for o in out]) - one_device)))
    assert gaps[True] < 1e-5 and gaps[False] > 0.1


def test_tf_device_type_case_rules(four_devices):
    """Lesson 01 §1: the short form takes any case ('/Cpu:1'); in '/device:TYPE:N' only 'CPU' or 'cpu' work, and
    '/device:Cpu:1' silently runs on device 0 (or raises, with soft placement off)."""
    import tensorflow as tf

    where = {}
    for name in ("/cpu:1", "/Cpu:1", "/CPU:1", "/device:cpu:1", "/device:CPU:1", "/device:Cpu:1"):
        with tf.device(name):
            where[name] = (tf.ones(1) + 1).device.rsplit(":", 1)[-1]
    assert where == {"/cpu:1": "1", "/Cpu:1": "1", "/CPU:1": "1", "/device:cpu:1": "1", "/device:CPU:1": "1",
                     "/device:Cpu:1": "0"}
    tf.config.set_soft_device_placement(False)
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="Could not satisfy device specification"):
            with tf.device("/device:Cpu:1"):
                tf.ones(1) + 1
    finally:
        tf.config.set_soft_device_placement(True)


def test_memory_growth_is_dropped_once_logical_devices_are_configured():
    """Lesson 00 §3: growth first, then a split into logical GPUs: TensorFlow drops the growth setting
    (the GPU run itself is in docs/gpu-runs.md). Read where TensorFlow decides it."""
    import inspect

    from tensorflow.python.eager import context

    source = inspect.getsource(context.Context)
    assert "Only compute growth if virtual devices have not been configured" in source


@pytest.mark.parametrize("policy", ["FILE", "AUTO"])
def test_file_sharding_with_fewer_files_than_workers_fails(tmp_path, policy):
    """Lesson 09 §3: with one file and two workers, FILE sharding (and AUTO, which picks FILE for files) can't
    give each worker a file: worker 0's pipeline raises InvalidArgumentError when it is read, worker 1's is
    empty. Asked of tf.data's own rewrite (input_ops.auto_shard_dataset, what experimental_distribute_dataset
    runs on each worker)."""
    import tensorflow as tf
    from tensorflow.python.distribute import input_ops

    (tmp_path / "part-0.txt").write_text("1\n2\n3\n")
    files = tf.data.Dataset.list_files(str(tmp_path / "part-*.txt"), shuffle=False)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    dataset = files.interleave(tf.data.TextLineDataset, cycle_length=1).batch(2).with_options(options)
    first, second = (input_ops.auto_shard_dataset(dataset, num_shards=2, index=i, num_replicas_in_sync=2)
                     for i in (0, 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not enough for the required 2 shards"):
        list(first)
    assert list(second) == []
