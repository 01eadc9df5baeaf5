"""MirroredStrategy runs: the batch arithmetic, the input pipeline, and a timed training run.

This is the module behind lesson 04 and its replicas × batch-size explorer. On a machine with
no GPU the replicas are logical CPUs: the arithmetic and the code paths are the real ones,
the speed is not (the replicas share the same cores).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from mgpu_edu import quiet
from mgpu_edu._validate import whole_number as _positive

MODES = ("per_replica", "global")
#: Collective keys each new strategy skips ahead by (see make_strategy).
_KEY_STRIDE = 10_000


def make_strategy(devices: list[str], cross_device_ops: Any = None) -> Any:
    """A MirroredStrategy over ``devices`` that can live beside earlier ones in this process.

    Every MirroredStrategy numbers its collective all-reduces from the same starting key, so a
    second strategy over a different number of devices in one process can collide with the
    first ("... is joining a group with size 4, but that group has size 2", tensorflow#61314).
    A real job makes one strategy per process; a lesson that compares 1, 2 and 4 replicas makes
    several, so each gets its own key range, as TensorFlow's own tests do.
    """
    tf = quiet.import_tensorflow()
    tf.distribute.MirroredStrategy._collective_key_base += _KEY_STRIDE
    return tf.distribute.MirroredStrategy(list(devices), cross_device_ops=cross_device_ops)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How one epoch is cut up for a number of replicas."""

    examples: int
    replicas: int
    per_replica: int
    global_batch: int
    steps_per_epoch: int
    last_batch: int
    learning_rate: float | None

    @property
    def uneven(self) -> bool:
        """True when the global batch doesn't split into equal per-replica shares."""
        return self.global_batch % self.replicas != 0


def steps_per_epoch(examples: int, global_batch: int) -> int:
    """Steps to see every example once: ceil(examples ÷ global batch); the last batch may be short.

    Example:
        >>> steps_per_epoch(5656, 64), steps_per_epoch(5656, 64 * 2)
        (89, 45)
    """
    _positive("examples", examples)
    _positive("global_batch", global_batch)
    return math.ceil(examples / global_batch)


def scaled_learning_rate(base_lr: float, base_batch: int, global_batch: int) -> float:
    """The linear scaling rule: multiply the learning rate by how much the global batch grew.

    Example:
        >>> scaled_learning_rate(0.1, 32, 128)
        0.4
    """
    if isinstance(base_lr, bool) or not isinstance(base_lr, (int, float)) or base_lr <= 0:
        raise ValueError(f"base_lr={base_lr!r} must be a positive number, e.g. 0.05.")
    _positive("base_batch", base_batch)
    _positive("global_batch", global_batch)
    return base_lr * global_batch / base_batch


def batch_plan(examples: int, batch: int, replicas: int, mode: str = "per_replica",
               base_lr: float | None = None, base_batch: int | None = None) -> BatchPlan:
    """Work out per-replica batch, global batch, steps per epoch and the scaled learning rate.

    mode="per_replica": ``batch`` is each replica's share (global = batch × replicas), the
    usual recipe. mode="global": ``batch`` is the whole step's batch, split over the replicas;
    it must be at least the number of replicas, or some replica would get nothing.

    Example:
        >>> plan = batch_plan(5656, 64, 2)
        >>> plan.global_batch, plan.steps_per_epoch
        (128, 45)
    """
    _positive("examples", examples)
    _positive("batch", batch)
    _positive("replicas", replicas)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use 'per_replica' or 'global'.")
    if mode == "per_replica":
        per_replica, global_batch = batch, batch * replicas
    else:
        if batch < replicas:
            raise ValueError(f"a global batch of {batch} can't be split over {replicas} replicas: some would get "
                             f"no examples. Use a global batch of at least {replicas}, or fewer replicas.")
        per_replica, global_batch = math.ceil(batch / replicas), batch
    steps = steps_per_epoch(examples, global_batch)
    lr = None
    if base_lr is not None:
        lr = scaled_learning_rate(base_lr, base_batch or per_replica, global_batch)
    return BatchPlan(examples, replicas, per_replica, global_batch, steps,
                     examples - (steps - 1) * global_batch, lr)


def input_pipeline(x: Any, y: Any, global_batch: int, shuffle: bool = True, seed: int = 0) -> Any:
    """tf.data pipeline for in-memory arrays: cache → shuffle → batch(global) → prefetch(AUTOTUNE).

    Batch by the **global** batch: the strategy splits each batch over the replicas.
    """
    tf = quiet.import_tensorflow()
    _positive("global_batch", global_batch)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache()
    if shuffle:
        dataset = dataset.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(global_batch).prefetch(tf.data.AUTOTUNE)


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
                   on_batch: Callable[[int, int], None] | None = None) -> RunResult:
    """Train build_model() with MirroredStrategy over the first ``replicas`` devices; time it.

    ``split`` holds x_train, y_train, x_test, y_test. The optimizer is SGD with momentum 0.9
    at ``learning_rate``; the loss is sparse cross-entropy on logits. ``on_batch(done,
    total)`` is called after every step (for a progress bar). seconds_per_epoch is measured
    in steady state: the mean time of the steps that are not the first of their epoch, times
    the steps per epoch. The first step of the first epoch builds the graph, and the first of
    every later epoch restarts the input iterator (about half a second on 2 CPU cores), so
    neither says how fast training runs. With one step per epoch there is nothing else to
    time, and it is the whole run. On logical CPUs the replicas share the cores: expect no
    speed-up.
    """
    tf = quiet.import_tensorflow()
    import keras

    from mgpu_edu import devices as _devices

    _positive("epochs", epochs)
    names = list(devices) if devices is not None else _devices.logical_devices()
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= len(names):
        raise ValueError(f"replicas={replicas!r}: this kernel has {len(names)} devices, so use 1 to {len(names)}.")
    plan = batch_plan(len(split.x_train), global_batch, replicas, mode="global")
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

    dataset = input_pipeline(split.x_train, split.y_train, global_batch)
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
                     len(split.x_train) / seconds, float(history.history["loss"][-1]), float(accuracy),
                     learning_rate)
