"""Input-pipeline and throughput timers, on real TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import perf


def test_pipelines_give_the_same_batches_and_the_cache_decodes_once(four_devices):
    """Counted, not timed: the slow and the parallel pipelines decode every batch in every epoch, the cached
    one only in the first; all three give the same batches in the same order."""
    import tensorflow as tf

    x = np.arange(40, dtype="float32").reshape(20, 2)
    y = np.arange(20, dtype="int32")
    step = tf.function(lambda xb, yb: tf.reduce_sum(xb))
    batches, decoded = {}, {}
    makers = {"slow": perf.slow_pipeline, "parallel": perf.parallel_pipeline, "cache": perf.fast_pipeline}
    for name, make in makers.items():
        calls: list[int] = []
        dataset = make(x, y, 8, delay_s=0.001, decoded=calls)
        batches[name] = [b[0].numpy() for b in dataset]  # one epoch, by hand
        first = len(calls)
        timings = perf.time_epochs(step, dataset, epochs=2)
        decoded[name] = [first, len(calls) - first]
        assert [len(epoch) for epoch in timings] == [3, 3]
    assert [len(b) for b in batches["slow"]] == [8, 8, 4]
    for name in ("parallel", "cache"):
        for a, b in zip(batches["slow"], batches[name], strict=True):
            np.testing.assert_array_equal(a, b)
    assert decoded == {"slow": [3, 6], "parallel": [3, 6], "cache": [3, 0]}
    assert perf.throughput(step, tf.constant(x), tf.constant(y), steps=3) > 0
    with pytest.raises(ValueError, match="delay_s=-1"):
        perf.slow_pipeline(x, y, 8, delay_s=-1)
