"""MirroredStrategy runs: how TensorFlow splits a batch, what ``fit`` does with it, and custom steps.

This is the module behind lessons 04, 05 and 06 and the replicas × batch-size explorer. Every claim
it makes about TensorFlow or Keras (the split of a batch, how ``fit`` scales each replica's
loss) is checked against TensorFlow itself in ``tests/test_mirrored.py``. On a machine with no
GPU the replicas are logical CPUs: the arithmetic and the code paths are the real ones, the
speed is not (the replicas share the same cores).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, real_number, whole_number
from mgpu_edu._validate import whole_number as _positive
from mgpu_edu.runtime import devices as _devices
from mgpu_edu.runtime import quiet
from mgpu_edu.runtime.strategies import make_strategy

MODES = ("per_replica", "global")


def replica_shares(batch: int, replicas: int) -> list[int]:
    """How ``experimental_distribute_dataset`` splits one batch of ``batch`` examples over the replicas.

    TensorFlow gives each replica ⌈batch ÷ replicas⌉ examples, in order, until the batch runs
    out, so the last replicas get fewer, or none. That is not lesson 02's even split
    (:func:`mgpu_edu.parallel.shard_sizes`, which gives 8, 8, 7, 7 for 30 on 4). Checked against
    TensorFlow in tests/test_mirrored.py, for full and short batches, with and without
    ``drop_remainder``.

    Example:
        >>> replica_shares(30, 4), replica_shares(6, 4)
        ([8, 8, 8, 6], [2, 2, 2, 0])
    """
    _positive("replicas", replicas)
    whole_number("batch", batch, minimum=0, hint="It is the number of examples in the batch.")
    per = math.ceil(batch / replicas)
    return [max(0, min(per, batch - i * per)) for i in range(replicas)]


def fit_example_weights(shares: Sequence[int]) -> list[float | None]:
    """How much ``fit`` under MirroredStrategy over- or under-weights each replica's examples.

    Keras 3 takes each replica's *mean* loss and divides it by the number of replicas N, so an
    example on a replica with n_k examples weighs 1/(N·n_k) instead of 1/B (B = the whole
    batch). This returns B/(N·n_k) per replica: 1.0 means exactly the right step, None marks an
    empty replica. Equal shares give 1.0 everywhere; a short last batch split 2, 2, 2, 0 gives
    0.75: that step is three quarters of the right one. Checked against ``fit`` and a
    one-device step in tests/test_mirrored.py.

    Example:
        >>> fit_example_weights([16, 16, 16, 16]), fit_example_weights([2, 2, 2, 0])
        ([1.0, 1.0, 1.0, 1.0], [0.75, 0.75, 0.75, None])
    """
    shares = list(shares)
    if not shares:
        raise BadArgument("shares=[] must list each replica's examples, e.g. shares=[2, 2, 2, 0].")
    for share in shares:
        whole_number("shares", share, minimum=0, hint=f"In shares={shares!r}, each is one replica's examples.")
    batch, n = sum(shares), len(shares)
    return [batch / (n * k) if k else None for k in shares]


def steps_per_epoch(examples: int, global_batch: int, drop_remainder: bool = False) -> int:
    """Steps to see every example once: ⌈examples ÷ global batch⌉; the last batch may be short.

    With ``drop_remainder=True`` the short last batch is skipped: ⌊examples ÷ global batch⌋.

    Example:
        >>> steps_per_epoch(5656, 64), steps_per_epoch(5656, 64 * 2), steps_per_epoch(5656, 128, True)
        (89, 45, 44)
    """
    _positive("examples", examples)
    _positive("global_batch", global_batch)
    return examples // global_batch if drop_remainder else math.ceil(examples / global_batch)


def scaled_learning_rate(base_lr: float, base_batch: int, global_batch: int) -> float:
    """The linear scaling rule: multiply the learning rate by how much the global batch grew.

    A rule of thumb for SGD. Large factors need a warm-up (start small, grow to the scaled
    rate over the first epochs); for Adam, growing the rate with the square root of the
    factor is the usual, safer choice.

    Example:
        >>> scaled_learning_rate(0.1, 32, 128)
        0.4
    """
    real_number("base_lr", base_lr, minimum=0, above=True, example=0.05)
    _positive("base_batch", base_batch)
    _positive("global_batch", global_batch)
    return base_lr * global_batch / base_batch


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How one epoch is cut up for a number of replicas, and how TensorFlow splits its batches."""

    examples: int
    replicas: int
    per_replica: int
    global_batch: int
    steps_per_epoch: int
    last_batch: int
    learning_rate: float | None
    drop_remainder: bool = False

    @property
    def shares(self) -> list[int]:
        """TensorFlow's split of a full global batch over the replicas (:func:`replica_shares`)."""
        return replica_shares(self.global_batch, self.replicas)

    @property
    def last_shares(self) -> list[int]:
        """TensorFlow's split of the epoch's last batch (short unless it divides evenly or is dropped)."""
        return replica_shares(self.last_batch, self.replicas)

    @property
    def dropped(self) -> int:
        """Examples left out of every epoch by ``drop_remainder``."""
        return self.examples - self.steps_per_epoch * self.global_batch if self.drop_remainder else 0

    @property
    def uneven(self) -> bool:
        """True when a full global batch doesn't split into equal per-replica shares."""
        return len(set(self.shares)) > 1

    @property
    def last_step_weights(self) -> list[float | None]:
        """How ``fit`` weights the last batch's examples on each replica (1.0 = right; see fit_example_weights)."""
        return fit_example_weights(self.last_shares)

    @property
    def fit_error(self) -> str | None:
        """Why Keras 3 ``fit`` can't train this plan, in a sentence that says what to choose; None if it can.

        ``fit`` under MirroredStrategy reduces its first batch across the replicas to build the
        model, and fails (an ``AddN`` shape error deep inside TensorFlow) when that batch's
        shares differ in size. Checked against ``fit`` in tests/test_mirrored.py.
        """
        first = min(self.global_batch, self.examples)
        shares = replica_shares(first, self.replicas)
        if len(set(shares)) == 1:
            return None
        split = ", ".join(map(str, shares))
        if self.global_batch > self.examples:
            start = (f"fit can't use a global batch of {self.global_batch:,} on {self.examples:,} examples over "
                     f"{self.replicas} replicas: the only batch holds {first:,} examples, TensorFlow splits it "
                     f"{split}, and Keras 3's fit fails when its first batch splits unevenly.")
            if self.examples < self.replicas:
                return (f"{start} Fewer examples than replicas split unevenly whatever the batch: use at least "
                        f"{self.replicas} examples (then a batch that is a multiple of {self.replicas} works), or "
                        "evaluate them without the strategy.")
            return (f"{start} Choose a batch of at most {self.examples // self.replicas:,} per replica (for a "
                    f"validation set, fit's validation_batch_size, e.g. "
                    f"{self.examples // self.replicas * self.replicas:,}).")
        below = self.global_batch // self.replicas * self.replicas
        options = " or ".join(f"{b:,}" for b in (below, below + self.replicas) if b > 0)
        return (f"fit can't train a global batch of {self.global_batch:,} on {self.replicas} replicas: TensorFlow "
                f"splits it {split}, and Keras 3's fit fails when its first batch splits unevenly. Choose a "
                f"multiple of {self.replicas} ({options}), or give the batch per replica.")


def batch_plan(examples: int, batch: int, replicas: int, mode: str = "per_replica",
               base_lr: float | None = None, base_batch: int | None = None,
               drop_remainder: bool = False) -> BatchPlan:
    """Work out per-replica batch, global batch, steps per epoch and the scaled learning rate.

    mode="per_replica": ``batch`` is each replica's share (global = batch × replicas), the
    usual recipe. mode="global": ``batch`` is the whole step's batch, split over the replicas
    as TensorFlow splits it (:func:`replica_shares`); per_replica is then the largest share.
    ``drop_remainder=True`` leaves out the short last batch, as ``dataset.batch(...,
    drop_remainder=True)`` does. ``plan.fit_error`` says when Keras ``fit`` can't train the plan.

    Example:
        >>> plan = batch_plan(5656, 64, 2)
        >>> plan.global_batch, plan.steps_per_epoch, plan.last_shares
        (128, 45, [12, 12])
    """
    _positive("examples", examples)
    _positive("batch", batch)
    _positive("replicas", replicas)
    one_of("mode", mode, MODES)
    if mode == "per_replica":
        global_batch = batch * replicas
    else:
        if batch < replicas:
            raise ValueError(f"a global batch of {batch} can't be split over {replicas} replicas: some would get "
                             f"no examples. Use a global batch of at least {replicas}, or fewer replicas.")
        global_batch = batch
    per_replica = math.ceil(global_batch / replicas)
    if drop_remainder and examples < global_batch:
        raise ValueError(f"drop_remainder=True with a global batch of {global_batch:,} leaves no full batch in "
                         f"{examples:,} examples: the epoch would be empty. Use a smaller batch or keep the remainder.")
    steps = steps_per_epoch(examples, global_batch, drop_remainder)
    last = global_batch if drop_remainder else examples - (steps - 1) * global_batch
    lr = None
    if base_lr is not None:
        lr = scaled_learning_rate(base_lr, base_batch or per_replica, global_batch)
    return BatchPlan(examples, replicas, per_replica, global_batch, steps, last, lr, drop_remainder)


def input_pipeline(x: Any, y: Any, global_batch: int, shuffle: bool = True, seed: int = 0,
                   drop_remainder: bool = False) -> Any:
    """tf.data pipeline for in-memory arrays: cache → shuffle → batch(global) → prefetch(AUTOTUNE).

    Batch by the **global** batch: the strategy splits each batch over the replicas.
    ``drop_remainder=True`` skips the short last batch, which ``fit`` mis-scales on several
    replicas (:func:`fit_example_weights`).
    """
    tf = quiet.import_tensorflow()
    _positive("global_batch", global_batch)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache()
    if shuffle:
        dataset = dataset.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(global_batch, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def observed_shares(strategy: Any, dataset: Any) -> list[list[int]]:
    """Ask TensorFlow how it splits each batch of ``dataset``: examples per replica, batch by batch.

    Example:
        >>> observed_shares(strategy, tf.data.Dataset.range(70).batch(64))  # doctest: +SKIP
        [[16, 16, 16, 16], [2, 2, 2, 0]]
    """
    tf = quiet.import_tensorflow()
    shares = []
    for batch in strategy.experimental_distribute_dataset(dataset):
        first = tf.nest.flatten(batch)[0]
        shares.append([int(tf.shape(part)[0]) for part in strategy.experimental_local_results(first)])
    return shares


# ----------------------------------------------------------------------------- fit, against one device


@dataclasses.dataclass(frozen=True)
class FitComparison:
    """``fit`` under MirroredStrategy beside the same ``fit`` on one device, step by step."""

    shares: list[list[int]]
    step_ratios: list[float]
    max_difference: float


def compare_fit(build_model: Callable[[], Any], x: Any, y: Any, global_batch: int, devices: Sequence[str],
                drop_remainder: bool = False, learning_rate: float = 0.5) -> FitComparison:
    """One epoch of ``fit`` with MirroredStrategy over ``devices``, and the same on ``devices[0]`` alone.

    Both start from ``build_model()`` (same seed, same weights), use plain SGD (each step is
    −learning_rate × the gradient) and see the same batches in the same order. For each step,
    ``step_ratios`` holds the mirrored step's size relative to the one-device step (projected
    onto it: 1.0 is the same step, 0.75 three quarters of it); ``shares`` is TensorFlow's split
    of each batch; ``max_difference`` the largest weight difference after the epoch. With no
    GPU the replicas are logical CPUs: the arithmetic is the same as on GPUs.
    """
    tf = quiet.import_tensorflow()
    import keras
    import numpy as np

    devices = list(devices)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=drop_remainder)

    def run(strategy: Any) -> list[Any]:
        with strategy.scope():
            model = build_model()
            model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        snapshots = [np.concatenate([w.ravel() for w in model.get_weights()])]

        class _Record(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                snapshots.append(np.concatenate([w.ravel() for w in self.model.get_weights()]))

        model.fit(dataset, epochs=1, verbose=0, shuffle=False, callbacks=[_Record()])
        return snapshots

    mirrored_strategy = make_strategy(devices)
    shares = observed_shares(mirrored_strategy, dataset)
    reference = run(tf.distribute.OneDeviceStrategy(devices[0]))
    mirrored = run(mirrored_strategy)
    ratios = []
    for k in range(1, len(reference)):
        right, got = reference[k] - reference[k - 1], mirrored[k] - mirrored[k - 1]
        ratios.append(float(np.dot(got, right) / np.dot(right, right)))
    return FitComparison(shares, ratios, float(np.max(np.abs(reference[-1] - mirrored[-1]))))


# ----------------------------------------------------------------------------- a custom training step


#: How :func:`make_train_step` adds the model's regularization losses (``model.losses``) to each replica's loss.
REGULARIZATION = ("scaled", "per_replica")


def make_train_step(strategy: Any, model: Any, optimizer: Any, per_example_loss: Callable[[Any, Any], Any],
                    metrics: Sequence[Any] = (), divide_by: int | None = None,
                    build_optimizer: bool = True, regularization: str = "scaled") -> Any:
    """A ``tf.function`` training step under ``strategy``: ``train_step(batch)`` returns the batch's mean loss.

    Each replica returns its loss *sum* ÷ the **real** size of this global batch, which the
    replicas count together with an all-reduce of their own sizes (so it is the global size
    on one machine or across many). The gradient all-reduce adds the replicas' gradients, so
    every step, the short last batch and empty replicas included, is exactly the one-device
    step on the whole batch. ``divide_by=N`` divides by a constant instead: the common
    mistake, kept so a lesson can show it (right only for full batches).

    A regularized model's penalties (``model.losses``, e.g. L2 on its kernels) are the same on
    every replica, and the all-reduce adds the replicas' gradients, so each replica adds
    ``tf.nn.scale_regularization_loss(...)``: the penalty ÷ the number of replicas, which sums
    back to one penalty. ``regularization="per_replica"`` adds the whole penalty on every
    replica instead: the mistake that counts it N times, kept so a lesson can show it.

    Optimizers with slot variables (Adam, RMSprop, SGD with momentum) must be built in the
    strategy's scope before ``strategy.run`` traces ``apply_gradients``; this does it
    (``build_optimizer=False`` skips it, to show the failure). The metrics, created in the
    scope, are updated on every replica. No GPU: the replicas are logical CPUs.

    Example:
        >>> step = make_train_step(strategy, model, Adam(), models.per_example_loss())  # doctest: +SKIP
        >>> for batch in strategy.experimental_distribute_dataset(dataset):  # doctest: +SKIP
        ...     loss = step(batch)
    """
    tf = quiet.import_tensorflow()
    if divide_by is not None:
        _positive("divide_by", divide_by)
    one_of("regularization", regularization, REGULARIZATION)
    counter = getattr(getattr(optimizer, "iterations", None), "value", None)
    if strategy.num_replicas_in_sync > 1 and counter is not None and not isinstance(
            counter, tf.distribute.DistributedValues):
        raise BadArgument(f"optimizer={type(optimizer).__name__} was created outside strategy.scope(): its variables "
                          "(its step counter, Adam's moments) then live once, not once per replica, and every "
                          f"replica updates them ({strategy.num_replicas_in_sync} counts per step). Create it "
                          "inside `with strategy.scope():`, with the model.")
    if build_optimizer and not optimizer.built:
        with strategy.scope():
            optimizer.build(model.trainable_variables)  # slots (Adam's m and v) made here, mirrored

    def replica_step(x: Any, y: Any) -> Any:
        if divide_by is None:  # the real global batch: every replica adds in what it holds
            global_size = tf.distribute.get_replica_context().all_reduce("sum", tf.shape(y)[0])
        else:
            global_size = divide_by
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(per_example_loss(y, logits), global_batch_size=global_size)
            if model.losses:  # the regularizers' penalties: one per replica, all-reduced into N of them
                penalty = tf.add_n(model.losses)
                loss += tf.nn.scale_regularization_loss(penalty) if regularization == "scaled" else penalty
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))  # all-reduce (add), update
        for metric in metrics:
            metric.update_state(y, logits)
        return loss

    @tf.function
    def train_step(batch: Any) -> Any:
        per_replica_losses = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)  # the batch's mean

    return train_step


def steps_per_call(train_step: Any, steps: int) -> Any:
    """Run ``steps`` training steps per Python call, inside one ``tf.function``: a custom loop's
    ``steps_per_execution``.

    ``train_step`` takes one (distributed) batch and returns its loss, as from
    :func:`make_train_step`. The returned function takes an iterator, runs ``steps`` batches
    from it in a ``tf.range`` loop that the graph runs without coming back to Python, and
    returns their mean loss. The iterator must not run out inside a call (``repeat()`` the
    dataset). This works under MirroredStrategy with any number of replicas.

    Example:
        >>> run = steps_per_call(make_train_step(strategy, model, SGD(), loss), 16)  # doctest: +SKIP
        >>> loss = run(iter(strategy.experimental_distribute_dataset(dataset.repeat())))  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    k = whole_number("steps", steps, example=16, hint="It is training steps per call.")

    @tf.function
    def run(iterator: Any) -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(k):  # a graph loop: no return to Python between steps
            total += train_step(next(iterator))
        return total / k

    return run


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One timed training run: what the explorer's results table shows."""

    replicas: int
    global_batch: int
    per_replica: int
    steps_per_epoch: int
    seconds_per_epoch: float
    examples_per_second: float
    loss: float
    accuracy: float
    learning_rate: float

    def row(self) -> dict[str, str]:
        """The run formatted for a table."""
        return {
            "replicas": str(self.replicas), "global batch": f"{self.global_batch:,}",
            "per-replica batch": f"{self.per_replica:,}", "steps/epoch": str(self.steps_per_epoch),
            "s/epoch": f"{self.seconds_per_epoch:.2f}", "examples/s": f"{self.examples_per_second:,.0f}",
            "final loss": f"{self.loss:.3f}", "accuracy": f"{self.accuracy:.3f}",
        }


def train_mirrored(build_model: Callable[[], Any], split: Any, replicas: int, global_batch: int, epochs: int = 1,
                   learning_rate: float = 0.05, devices: list[str] | None = None,
                   on_batch: Callable[[int, int], None] | None = None, drop_remainder: bool = False) -> RunResult:
    """Train build_model() with MirroredStrategy over the first ``replicas`` devices; time it.

    ``split`` holds x_train, y_train, x_test, y_test. The optimizer is SGD with momentum 0.9
    at ``learning_rate``; the loss is sparse cross-entropy on logits. ``on_batch(done,
    total)`` is called after every step (for a progress bar). seconds_per_epoch is measured
    in steady state: the mean time of the steps that are not the first of their epoch, times
    the steps per epoch. The first step of the first epoch builds the graph, and the first of
    every later epoch restarts the input iterator (about half a second on 2 CPU cores), so
    neither says how fast training runs. With one step per epoch there is nothing else to
    time, and it is the whole run. ``drop_remainder=True`` skips each epoch's short last
    batch, which ``fit`` mis-scales on several replicas. A plan ``fit`` can't train (a first
    batch that splits unevenly, see ``BatchPlan.fit_error``) raises ValueError before any
    training. On logical CPUs the replicas share the cores: expect no speed-up.
    """
    tf = quiet.import_tensorflow()
    import keras

    _positive("epochs", epochs)
    names = list(devices) if devices is not None else _devices.logical_devices()
    whole_number("replicas", replicas, maximum=len(names), hint=f"This kernel has {len(names)} devices.")
    plan = batch_plan(len(split.x_train), global_batch, replicas, mode="global", drop_remainder=drop_remainder)
    if plan.fit_error:
        raise ValueError(plan.fit_error)
    strategy = make_strategy(names[:replicas])
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    total = plan.steps_per_epoch * epochs
    steady: list[float] = []  # duration of every step that isn't the first of its epoch
    clock = {"last": 0.0, "done": 0, "start": time.perf_counter()}

    class _Watch(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            clock["last"] = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch > 0:
                steady.append(time.perf_counter() - clock["last"])
            clock["done"] += 1
            if on_batch is not None:
                on_batch(clock["done"], total)

    dataset = input_pipeline(split.x_train, split.y_train, global_batch, drop_remainder=drop_remainder)
    history = model.fit(dataset, epochs=epochs, verbose=0, shuffle=False, callbacks=[_Watch()])
    fit_seconds = time.perf_counter() - clock["start"]
    # Test accuracy from one eager forward pass: no second graph to build, so runs stay quick.
    logits = model(split.x_test, training=False)
    accuracy = float(tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32),
                                                     tf.cast(split.y_test, tf.int32)), tf.float32)))
    # Steady state: each epoch's first step left out, the mean step scaled up to a whole epoch.
    if steady:
        seconds = sum(steady) / len(steady) * plan.steps_per_epoch
    else:
        seconds = fit_seconds / epochs
    return RunResult(replicas, global_batch, plan.per_replica, plan.steps_per_epoch, seconds,
                     (plan.examples - plan.dropped) / seconds, float(history.history["loss"][-1]), float(accuracy),
                     learning_rate)
