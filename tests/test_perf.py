"""Input-pipeline and throughput timers, on real TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import perf


def test_pipelines_give_the_same_batches_and_cache_pays(four_devices):
    import tensorflow as tf

    x = np.arange(40, dtype="float32").reshape(20, 2)
    y = np.arange(20, dtype="int32")
    slow = [b[0].numpy() for b in perf.slow_pipeline(x, y, 8, delay_s=0.0)]
    fast = [b[0].numpy() for b in perf.fast_pipeline(x, y, 8, delay_s=0.0)]
    assert [len(b) for b in slow] == [8, 8, 4]
    for a, b in zip(slow, fast, strict=True):
        np.testing.assert_array_equal(a, b)
    step = tf.function(lambda xb, yb: tf.reduce_sum(xb))
    timings = perf.time_epochs(step, perf.fast_pipeline(x, y, 8, delay_s=0.02), epochs=2)
    first, second = (sum(t.wait_s for t in epoch) for epoch in timings)
    assert first > 0.02 and second < first / 2  # epoch 2 reads from the cache
    assert perf.throughput(step, tf.constant(x), tf.constant(y), steps=3) > 0
    with pytest.raises(ValueError, match="delay_s=-1"):
        perf.slow_pipeline(x, y, 8, delay_s=-1)
