"""Measuring what makes training slow: input pipelines, batch size, precision.

Small, honest timers for lesson 08. They time real TensorFlow work on whatever devices exist;
on logical CPUs every measurement shares the same cores.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from mgpu_edu._validate import real_number, whole_number
from mgpu_edu.runtime import quiet


def slow_pipeline(x: Any, y: Any, batch: int, delay_s: float = 0.01, decoded: list[int] | None = None) -> Any:
    """A tf.data pipeline whose every batch costs ``delay_s`` of "decoding" (a sleep), done on demand.

    It stands in for reading and decoding images from disk: the device waits for each batch.
    If ``decoded`` is a list, every decode appends 1 to it, so a lesson can count them.
    """
    tf = quiet.import_tensorflow()
    real_number("delay_s", delay_s, minimum=0, example=0.01, hint="It is seconds of decoding per batch.")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(_decoder(x, delay_s, decoded))


def _decoder(x: Any, delay_s: float, decoded: list[int] | None) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The pipelines' "decode" step: a sleep of delay_s in a py_function, counted in ``decoded``."""
    tf = quiet.import_tensorflow()

    def decode(features: Any, labels: Any) -> tuple[Any, Any]:
        def work(f: Any) -> Any:
            if decoded is not None:
                decoded.append(1)
            time.sleep(delay_s)
            return f

        features = tf.py_function(work, [features], tf.float32)
        features.set_shape([None, x.shape[1]])
        return features, labels

    return decode


def parallel_pipeline(x: Any, y: Any, batch: int, delay_s: float = 0.01, decoded: list[int] | None = None) -> Any:
    """The same decoding, run on several batches at once (``map(..., num_parallel_calls=AUTOTUNE)``) and
    ahead of the device (``prefetch(AUTOTUNE)``), but every epoch again: nothing is cached.

    What a dataset too big for memory does. tf.data's autotuner picks how many decodes run at once.
    """
    tf = quiet.import_tensorflow()
    real_number("delay_s", delay_s, minimum=0, example=0.01, hint="It is seconds of decoding per batch.")
    return (tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
            .map(_decoder(x, delay_s, decoded), num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


def fast_pipeline(x: Any, y: Any, batch: int, delay_s: float = 0.01, decoded: list[int] | None = None) -> Any:
    """The same pipeline with ``cache()`` after the expensive map and ``prefetch(AUTOTUNE)`` at the end.

    Epoch 1 still decodes every batch, but while the device trains on the previous one;
    from epoch 2 on, batches come from memory: the cache holds the whole decoded dataset in RAM.
    """
    tf = quiet.import_tensorflow()
    return slow_pipeline(x, y, batch, delay_s, decoded).cache().prefetch(tf.data.AUTOTUNE)


class StepTiming(NamedTuple):
    """One training step: seconds spent waiting for the batch, then computing on it."""

    wait_s: float
    compute_s: float


def time_epochs(train_step: Callable[[Any, Any], Any], dataset: Any, epochs: int = 2) -> list[list[StepTiming]]:
    """Run ``train_step(x, y)`` over the dataset for some epochs; time each wait and each step."""
    timings = []
    for _ in range(epochs):
        epoch = []
        iterator = iter(dataset)
        while True:
            start = time.perf_counter()
            try:
                x, y = next(iterator)
            except StopIteration:
                break
            got = time.perf_counter()
            float(train_step(x, y))  # wait for the result, so compute time is real
            epoch.append(StepTiming(got - start, time.perf_counter() - got))
        timings.append(epoch)
    return timings


def throughput(train_step: Callable[[Any, Any], Any], x: Any, y: Any, steps: int = 10) -> float:
    """Examples per second of ``train_step`` on one batch (x, y), after one warm-up step."""
    whole_number("steps", steps, example=10)
    float(train_step(x, y))
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(x, y)
    float(loss)
    return steps * int(x.shape[0]) / (time.perf_counter() - start)


def steps_per_second(run: Callable[[], Any], steps: int, repeats: int = 3) -> float:
    """Training steps per second of ``run()``, which runs ``steps`` steps and returns when they are done.

    One untimed call first (it traces and compiles), then the fastest of ``repeats`` timed
    calls: the least disturbed by whatever else shares the machine.
    """
    whole_number("steps", steps, example=32)
    whole_number("repeats", repeats, example=3)
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return steps / best
