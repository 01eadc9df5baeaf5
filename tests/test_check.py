"""Exercise checks: right answers, the typical wrong answers with their hints, and unsolved ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mgpu_edu import check


def test_cross_device_bytes():
    assert check.cross_device_bytes(..., 8, 250_000).status == "unsolved"
    assert check.cross_device_bytes(7_000_000, 8, 250_000).correct
    assert "reads it in place" in check.cross_device_bytes(8_000_000, 8, 250_000).message
    assert "counts elements" in check.cross_device_bytes(1_750_000, 8, 250_000).message
    assert check.cross_device_bytes("7e6", 8, 250_000).status == "wrong"


def _bounds(b, n):
    from mgpu_edu.parallelism.parallel import shard_sizes

    out, start = [], 0
    for size in shard_sizes(b, n):
        out.append((start, start + size))
        start += size
    return out


def test_shard_bounds_function():
    assert check.shard_bounds_function(None).status == "unsolved"
    assert check.shard_bounds_function(_bounds).correct
    assert check.shard_bounds_function(lambda b, n: [list(pair) for pair in _bounds(b, n)]).correct  # lists do
    assert check.shard_bounds_function(lambda b, n: np.array(_bounds(b, n))).correct  # and so does NumPy
    assert "returned the shard sizes" in check.shard_bounds_function(
        lambda b, n: [b // n + (i < b % n) for i in range(n)]).message
    assert "stops *before* stop" in check.shard_bounds_function(
        lambda b, n: [(a, c - 1) for a, c in _bounds(b, n)]).message
    assert "must start where the one before it stopped" in check.shard_bounds_function(
        lambda b, n: [(0, c - a) for a, c in _bounds(b, n)]).message
    assert "one per tower" in check.shard_bounds_function(lambda b, n: _bounds(b, n)[:-1]).message
    assert "raised ZeroDivisionError" in check.shard_bounds_function(lambda b, n: [1 / 0]).message
    assert "pairs of whole numbers" in check.shard_bounds_function(lambda b, n: 3).message
    feedback = check.shard_bounds_function(lambda b, n: np.array_split(np.arange(b), n))  # the shards themselves
    assert feedback.status == "wrong"


def test_shard_bounds_cut_the_pieces_tf_split_cuts(four_devices):  # the fixture sets up the devices first
    """What the check calls right is what TensorFlow does: x[start:stop] for each pair are tf.split's pieces."""
    import tensorflow as tf

    from mgpu_edu.parallelism.parallel import shard_sizes

    for b, n in [(10, 4), (30, 4), (3, 4), (17, 5), (0, 3)]:
        x = tf.range(b)
        pieces = tf.split(x, shard_sizes(b, n))
        assert [x[a:c].numpy().tolist() for a, c in _bounds(b, n)] == [p.numpy().tolist() for p in pieces]


def test_combine_function():
    assert check.combine_function(None).status == "unsolved"
    assert check.combine_function(lambda s, c: sum(s) / sum(c)).correct
    naive = check.combine_function(lambda s, c: sum(a / b for a, b in zip(s, c, strict=True)) / len(s))
    assert naive.status == "wrong" and "mean of the towers' means" in naive.message
    assert check.combine_function(lambda s, c: sum(s)).status == "wrong"
    listed = check.combine_function(lambda s, c: [sum(s) / sum(c)])
    assert listed.status == "wrong" and "returned list" in listed.message and "raised" not in listed.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (10_000_000, "correct", "under 2·S"),
    (5_000_000, "wrong", "one phase"),
    (30_000_000, "wrong", "reduce-to-one"),
    (1, "wrong", "2(N−1) steps"),
    (None, "unsolved", "number of bytes"),
])
def test_ring_bytes(answer, status_, hint):
    feedback = check.ring_bytes(answer, n=6, nbytes=6_000_000)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_"), [(14, "correct"), (7, "wrong"), (8, "wrong"), (None, "unsolved")])
def test_ring_steps(answer, status_):
    assert check.ring_steps(answer, n=8).status == status_


def test_combine_function_dividing_by_an_empty_tower():
    def per_tower(sums, counts):
        return sum(s / c for s, c in zip(sums, counts, strict=True)) / len(sums)

    feedback = check.combine_function(per_tower)  # fails on the first uneven case already
    assert feedback.status == "wrong"

    def guarded_first(sums, counts):
        return sum(sums) / sum(counts) if 0 not in counts else sums[-1] / counts[-1]

    assert "empty tower" in check.combine_function(guarded_first).message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (28, "correct", "bubble 9.68%"), (27, "wrong", "exactly 10%"), (40, "wrong", "isn't the fewest"),
    (8, "wrong", "leaves a bubble of 27.3%"), (0, "wrong", "whole number"), (None, "unsolved", "micro-batches")])
def test_micro_batches(answer, status_, hint):
    feedback = check.micro_batches(answer, stages=4, target=0.10)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_"), [(1_048_576, "correct"), (4_194_304, "wrong"), (1024, "wrong"),
                                                 ("x", "wrong"), (None, "unsolved")])
def test_kernel_shard(answer, status_):
    assert check.kernel_shard(answer, inputs=1024, outputs=4096, devices=4).status == status_


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (30, "correct", "88 examples"), (29, "wrong", "short last batch"), (118, "wrong", "per-replica batch"),
    (None, "unsolved", "whole number")])
def test_steps_per_epoch(answer, status_, hint):
    feedback = check.steps_per_epoch(answer, examples=5656, per_replica=48, replicas=4)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    ([3, 3, 3, 1], "correct", "[0.833, 0.833, 0.833, 2.5] × the right weight"),
    ((3, 3, 3, 1), "correct", "⌈10 ÷ 4⌉ = 3"),
    (np.array([3, 3, 3, 1]), "correct", "in order"), ([3, 3, 2, 2], "wrong", "lesson 02's even split"),
    ([3, 3, 3, 2], "wrong", "adds up to 11"), ([3, 3, 4], "wrong", "one per replica, 4 in all"),
    ([4, 4, 2, 0], "wrong", "not how TensorFlow splits it"), ("3331", "wrong", "a list of 4 whole numbers"),
    ([3, 3, 3, 0.5], "wrong", "whole numbers"), ([3, 3, 5, -1], "wrong", "whole numbers"), (7, "wrong", "a list"),
    (None, "unsolved", "one per replica")])
def test_batch_shares(answer, status_, hint):
    feedback = check.batch_shares(answer, batch=10, replicas=4)
    assert feedback.status == status_ and hint in feedback.message


def test_batch_shares_agrees_with_the_rule_that_tensorflow_follows():
    """The expected split is mirrored.replica_shares, which tests/test_mirrored.py checks against TensorFlow."""
    from mgpu_edu import mirrored
    for batch, replicas in [(6, 4), (30, 4), (64, 4), (1, 3), (0, 2), (13, 5)]:
        assert check.batch_shares(mirrored.replica_shares(batch, replicas), batch, replicas).correct


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (math.log(1 + 9 / math.e), "correct", "log(1 + 9/e)"), (1.461, "correct", "e/(e + 9)"),
    (1.46, "correct", "1.4612"), (0, "wrong", "right loss gives a perfect prediction"),
    (math.log(10), "wrong", "uniform guess"), (math.log(1 + 9 * math.e), "wrong", "upside down"),
    (math.e / (math.e + 9), "wrong", "−log of it"),
    (1.3, "wrong", "−log of e/(e + C − 1) with C = 10"), (None, "unsolved", "a loss")])
def test_softmax_floor(answer, status_, hint):
    feedback = check.softmax_floor(answer, classes=10)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (0.04, "correct", "grew 4×"), (0.01, "wrong", "keeps the rate"), (0.0025, "wrong", "divides"),
    ("0.04", "wrong", "expected a number")])
def test_scaled_lr(answer, status_, hint):
    feedback = check.scaled_lr(answer, base_lr=0.01, base_batch=32, replicas=4, per_replica=32)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (0.125, "correct", "compute_average_loss"), (0.5, "wrong", "own mean"), (8.0, "wrong", "the sum")])
def test_replica_loss(answer, status_, hint):
    feedback = check.replica_loss(answer, loss_sum=8.0, per_replica=16, global_batch=64)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_"), [(8, "correct"), (1, "wrong"), (100, "wrong"), (800, "wrong"),
                                                 (None, "unsolved")])
def test_python_runs(answer, status_):
    assert check.python_runs(answer, replicas=8).status == status_


def test_function_stubs_are_unsolved_and_forgotten_returns_are_explained(capsys):
    def shard_stub(batch, n):
        return ...

    def combine_stub(sums, counts):
        return ...

    def forgot_return(sums, counts):
        sum(sums) / sum(counts)

    assert check.shard_bounds_function(shard_stub).status == "unsolved"
    assert check.combine_function(combine_stub).status == "unsolved"
    assert "forget the `return`" in check.combine_function(forgot_return).message
    assert "no parentheses" in check.combine_function(2.0).message
    assert "no parentheses" in check.shard_bounds_function([3, 3]).message


def test_placed_on_checks_the_value_too(four_devices):
    import tensorflow as tf

    with tf.device(four_devices[-1]):
        right, wrong = tf.reduce_sum(tf.ones((3, 3))), tf.reduce_sum(tf.ones((2, 2)))
    assert check.placed_on(right, four_devices[-1], expected=9.0).correct
    feedback = check.placed_on(wrong, four_devices[-1], expected=9.0)
    assert feedback.status == "wrong" and "holds 4, not 9" in feedback.message
    assert check.placed_on(right, four_devices[0], expected=9.0).status == "wrong"
    with tf.device(four_devices[-1]):
        vector = check.placed_on(tf.ones(3) * 3, four_devices[-1], expected=9.0)
    assert vector.status == "wrong" and "a tensor of shape (3,), not the single number 9" in vector.message


def test_placed_on_turns_numpy_values_away_with_the_reason(four_devices):
    """NumPy 2 arrays have a .device ("cpu") too: .numpy() of the right tensor must not read as misplaced."""
    import numpy as np
    import tensorflow as tf

    with tf.device(four_devices[-1]):
        total = tf.reduce_sum(tf.ones((3, 3)))
    for value in (total.numpy(), np.asarray(total), float(total)):
        feedback = check.placed_on(value, four_devices[-1], expected=9.0)
        assert feedback.status == "wrong" and "expected a TensorFlow tensor" in feedback.message, value
        assert "lives on" not in feedback.message
    assert "`.numpy()` copies" in check.placed_on(total.numpy(), four_devices[-1]).message


def test_spread_function_reads_where_tensorflow_put_each_value(four_devices):
    import tensorflow as tf

    def spread(values):
        out = []
        for i, value in enumerate(values):
            with tf.device(four_devices[i % len(four_devices)]):
                out.append(tf.constant(value))
        return out

    def one_scope(values):  # every tensor made in one scope: all on one device
        with tf.device(four_devices[1]):
            return [tf.constant(v) for v in values]

    def no_wrap(values):  # i, not i % N: past the last device, soft placement puts it elsewhere
        out = []
        for i, value in enumerate(values):
            with tf.device(f"/device:CPU:{i}"):
                out.append(tf.constant(value))
        return out

    assert check.spread_function(None, four_devices).status == "unsolved"
    right = check.spread_function(spread, four_devices)
    assert right.correct and "6 values over 4 devices" in right.message
    assert "every tensor lives on the same device" in check.spread_function(one_scope, four_devices).message
    # TensorFlow soft-places CPU:4 on CPU:0, which is where item 4 belongs anyway: item 5 is the first wrong one
    assert "value i goes to device i % 4, so item 5" in check.spread_function(no_wrap, four_devices).message
    assert "item 0 is float 1.0, not a TensorFlow tensor" in check.spread_function(list, four_devices).message

    def vectors(values):  # tf.constant([value]): right place, but a vector
        out = []
        for i, value in enumerate(values):
            with tf.device(four_devices[i % 4]):
                out.append(tf.constant([value]))
        return out

    assert "has shape (1,)" in check.spread_function(vectors, four_devices).message

    def breaks_while_read(values):  # a generator runs its body only when the check reads it
        for i, value in enumerate(values):
            with tf.device(four_devices[i]):  # IndexError at the fifth value
                yield tf.constant(value)

    assert "raised IndexError" in check.spread_function(breaks_while_read, four_devices).message
    stacked = check.spread_function(lambda v: tf.stack(spread(v)), four_devices).message
    assert "spread returned one tensor" in stacked
    assert "keep the values, in order" in check.spread_function(lambda v: spread(v[::-1]), four_devices).message
    assert "one tensor per value, so 6" in check.spread_function(lambda v: spread(v[:4]), four_devices).message
    assert "no parentheses" in check.spread_function([1.0], four_devices).message


@pytest.mark.parametrize("spelling", ["/CPU:{}", "CPU:{}", "/cpu:{}", "/device:CPU:{}",
                                      "/job:localhost/replica:0/task:0/device:CPU:{}"])
def test_spread_function_takes_every_spelling_tf_device_takes(spelling, four_devices):
    import tensorflow as tf

    devices = [spelling.format(i) for i in range(len(four_devices))]

    def spread(values):
        out = []
        for i, value in enumerate(values):
            with tf.device(devices[i % len(devices)]):
                out.append(tf.constant(value))
        return out

    assert check.spread_function(spread, devices).correct


def _number_types(value):
    """value as every real-number type a learner can produce."""
    import numpy as np
    import tensorflow as tf

    kinds = [value, float(value), np.float64(value), np.float32(value), np.array(value), tf.constant(float(value))]
    if float(value).is_integer():
        kinds += [int(value), np.int64(value), np.int32(value), tf.constant(int(value))]
    return kinds


@pytest.mark.parametrize(("fn", "answer", "kwargs"), [
    (check.micro_batches, 96, {"stages": 6, "target": 0.05}),
    (check.memory_split, 2304, {"total_mb": 15360, "n": 5}),
    (check.cross_device_bytes, 7_000_000, {"readers": 8, "elements": 250_000}),
    (check.ring_bytes, 10_000_000, {"n": 6, "nbytes": 6_000_000}),
    (check.ring_steps, 14, {"n": 8}),
    (check.steps_per_epoch, 30, {"examples": 5656, "per_replica": 48, "replicas": 4}),
    (check.softmax_floor, math.log(1 + 7 / math.e), {"classes": 8}),
    (check.scaled_lr, 0.04, {"base_lr": 0.01, "base_batch": 32, "replicas": 4, "per_replica": 32}),
    (check.replica_loss, 0.125, {"loss_sum": 8.0, "per_replica": 16, "global_batch": 64}),
    (check.python_runs, 8, {"replicas": 8}),
    (check.kernel_shard, 1_048_576, {"inputs": 1024, "outputs": 4096, "devices": 4}),
    (check.allreduce_seconds, 0.06, {"params": 100e6, "replicas": 4, "gbytes_per_s": 10}),
    (check.model_speedup, 3.2, {"compute_s": 0.1, "comm_s": 0.025, "replicas": 4}),
    (check.global_batch_workers, 256, {"workers": 4, "per_worker": 64}),
    (check.staleness, 4, {"workers": 5}),
    (check.zero_stage_that_fits, 2, {"params": 7.5e9, "devices": 64, "gpu_gb": 24}),
    (check.zero3_bytes, 4_500_000, {"n": 4, "params": 1e6}),
    (check.lost_steps, 37, {"steps_done": 137, "every": 50}),
    (check.checkpoint_interval, 1315, {"save_seconds": 30, "mtbf_seconds": 28_800}),
    (check.mfu_from_throughput, 0.33683, {"tokens_per_second": 99_972, "devices": 1024, "peak_flops": 312e12}),
])
def test_every_numeric_check_takes_every_number_type(fn, answer, kwargs):
    for kind in _number_types(answer):
        assert fn(kind, **kwargs).correct, (fn.__name__, type(kind), kind)
    assert fn(True, **kwargs).status == "wrong"  # a bool is not a number here
    assert fn("1", **kwargs).status == "wrong"


def test_whole_number_checks_reject_fractions():
    feedback = check.micro_batches(96.5, stages=6, target=0.05)
    assert feedback.status == "wrong" and "whole number" in feedback.message


def test_memory_split_feedback(capsys):
    assert check.memory_split(None).status == "unsolved"
    assert check.memory_split(...).status == "unsolved"
    assert check.memory_split(2304).status == "correct"
    wrong = check.memory_split(3072)
    assert wrong.status == "wrong" and "20 %" in wrong.message
    assert "multiple of 256" in check.memory_split(2457).message
    assert check.memory_split("2304").status == "wrong"
    out = capsys.readouterr().out
    assert "⏳ Not solved yet" in out and "✅ Correct" in out and "❌ Not yet right" in out


def test_placed_on_feedback(capsys):
    class Fake:
        device = "/job:localhost/replica:0/task:0/device:CPU:2"

    assert check.placed_on(None, "/device:CPU:2").status == "unsolved"
    assert check.placed_on(Fake(), "/device:CPU:2").correct
    assert check.placed_on(Fake(), "/device:CPU:1").status == "wrong"
    assert check.placed_on(3.0, "/device:CPU:1").status == "wrong"


def test_placed_on_compares_type_and_index(capsys):
    class On:
        def __init__(self, device):
            self.device = device

    assert check.placed_on(On("/job:localhost/replica:0/task:0/device:CPU:11"), "/device:CPU:1").status == "wrong"
    assert check.placed_on(On("/job:localhost/replica:0/task:0/device:GPU:0"), "/gpu:0").correct


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (0.06, "correct", "60 ms per step"), (0.015, "wrong", "counts parameters, not bytes"),
    (0.04, "wrong", "sends the tensor once"), (None, "unsolved", "number of seconds"), (1.0, "wrong", "2(N−1)/N")])
def test_allreduce_seconds_hints(answer, status_, hint):
    feedback = check.allreduce_seconds(answer, params=100e6, replicas=4, gbytes_per_s=10)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (3.2, "correct", "efficiency of 80%"), (4, "wrong", "that is the ideal"), (0.8, "wrong", "that is the efficiency"),
    (None, "unsolved", "speed-up"), (2.0, "wrong", "N replicas process N batches")])
def test_model_speedup_hints(answer, status_, hint):
    feedback = check.model_speedup(answer, compute_s=0.1, comm_s=0.025, replicas=4)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (256, "correct", "MultiWorkerMirroredStrategy adds up replicas"), (64, "wrong", "one worker's share"),
    (None, "unsolved", "whole number of examples"), (100, "wrong", "workers × per-worker batch")])
def test_global_batch_workers_hints(answer, status_, hint):
    feedback = check.global_batch_workers(answer, workers=4, per_worker=64)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (4, "correct", "the other 4 each apply an update"), (5, "wrong", "a worker's own update isn't in between"),
    (None, "unsolved", "whole number of updates"), (9, "wrong", "the other workers' updates")])
def test_staleness_hints(answer, status_, hint):
    feedback = check.staleness(answer, workers=5)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (2, "correct", "stage 2: 16.6 GB per device, where stage 1 needs 31.4 GB"), (3, "wrong", "pick the lowest"),
    (1, "wrong", "stage 1 needs 31.4 GB"), (5, "wrong", "not a ZeRO stage"), (None, "unsolved", "ZeRO stage")])
def test_zero_stage_that_fits_hints(answer, status_, hint):
    feedback = check.zero_stage_that_fits(answer, params=7.5e9, devices=64, gpu_gb=24)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (5.25e9, "correct", "5,250,000,000 bytes"), (3.5e9, "wrong", "that is stages 0–2"),
    (42e9, "wrong", "all devices together"), (2.625e9, "wrong", "counts weights, not bytes"),
    (6e9, "wrong", "leaves out (N−1)/N"), (10.5e9, "wrong", "counts 4 bytes per weight"),
    (5.25, "wrong", "that is in GB"), (None, "unsolved", "number of bytes")])
def test_zero3_bytes_hints(answer, status_, hint):
    feedback = check.zero3_bytes(answer, n=8, params=1e9)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (37, "correct", "resumes from the checkpoint of step 100"), (100, "wrong", "the step it resumes *from*"),
    (13, "wrong", "never written"), (0, "wrong", "only what a checkpoint holds"),
    (137, "wrong", "only the ones after it"), (36, "wrong", "last multiple of 50"),
    (None, "unsolved", "whole number of steps")])
def test_lost_steps_hints(answer, status_, hint):
    feedback = check.lost_steps(answer, steps_done=137, every=50)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (1314.5, "correct", "about 1,315 s (22 min)"), (1300, "correct", "1,315 s"), (929.5, "wrong", "leaves out the 2"),
    (1_728_000, "wrong", "square root"), (21.9, "wrong", "in minutes"), (600, "wrong", "both in seconds"),
    (None, "unsolved", "number of seconds")])
def test_checkpoint_interval_hints(answer, status_, hint):
    feedback = check.checkpoint_interval(answer, save_seconds=30, mtbf_seconds=8 * 3600)
    assert feedback.status == status_ and hint in feedback.message


def test_zero_stage_that_fits_means_what_memory_fits_means():
    """Exercise 1 of lesson 10 and memory.fits agree: model states fit in 90 % of the card, not 100 %."""
    # 13 B weights on 32 GPUs: stage 2 needs 31.7 GB, which a 34 GB card holds only without the 10 % spare
    feedback = check.zero_stage_that_fits(2, params=13e9, devices=32, gpu_gb=34)
    assert feedback.status == "wrong" and "without the 10 %" in feedback.message
    assert check.zero_stage_that_fits(3, params=13e9, devices=32, gpu_gb=34).correct
    assert check.zero_stage_that_fits(2, params=13e9, devices=32, gpu_gb=40).correct


def test_scaled_lr_recognises_the_square_root_rule():
    feedback = check.scaled_lr(0.02, base_lr=0.01, base_batch=32, replicas=4, per_replica=32)
    assert feedback.status == "wrong" and "square-root rule" in feedback.message and "Adam" in feedback.message


def _float32_function(fn):
    """fn computed in float32, as NumPy or TensorFlow code would compute it."""
    return lambda *args: np.float32(fn(*args))


@pytest.mark.parametrize("kind", ["float32", "numpy", "tensor", "tensor16"])
def test_combine_function_accepts_answers_right_to_their_dtypes_precision(kind):
    """2.33333 in float32 is right (14 / 6 can't be written exactly in float32), and never reported as wrong."""
    import tensorflow as tf

    def combine(sums, counts):
        if kind == "float32":
            return np.float32(sum(sums)) / np.float32(sum(counts))
        if kind == "numpy":
            return np.sum(np.array(sums, np.float32)) / np.sum(np.array(counts, np.float32))
        if kind == "tensor":
            return tf.reduce_sum(tf.constant(sums, tf.float32)) / tf.reduce_sum(tf.constant(counts, tf.float32))
        return tf.cast(tf.reduce_sum(tf.constant(sums)) / tf.reduce_sum(tf.constant(counts, tf.float32)), tf.float16)

    assert check.combine_function(combine).correct


def test_a_wrong_answer_is_never_printed_as_equal_to_the_expected_one():
    """'2.33333, expected 2.33333' would tell a learner nothing: wrong answers are shown with enough digits."""
    feedback = check.combine_function(lambda s, c: sum(s) / sum(c) + (1e-4 if sum(c) == 6 else 0))
    assert feedback.status == "wrong"
    shown, expected = feedback.message.split(" = ")[1].split(", expected ")
    assert shown != expected.rstrip(".")


@pytest.mark.parametrize(("fn", "kwargs", "formula"), [
    (check.ring_bytes, {"n": 3, "nbytes": 1000}, lambda f: f(2) * f(2) / f(3) * f(1000)),
    (check.softmax_floor, {"classes": 7}, lambda f: np.log(f(1) + f(6) / f(np.e))),
    (check.scaled_lr, {"base_lr": 0.003, "base_batch": 48, "replicas": 3, "per_replica": 32},
     lambda f: f(0.003) * f(96) / f(48)),
    (check.replica_loss, {"loss_sum": 7.3, "per_replica": 16, "global_batch": 48}, lambda f: f(7.3) / f(48)),
    (check.allreduce_seconds, {"params": 123e6, "replicas": 3, "gbytes_per_s": 7},
     lambda f: f(2) * f(2) / f(3) * f(123e6) * f(4) / f(7e9)),
    (check.model_speedup, {"compute_s": 0.1, "comm_s": 0.03, "replicas": 3}, lambda f: f(0.1) * f(3) / f(0.13)),
    (check.zero3_bytes, {"n": 7, "params": 1.3e9}, lambda f: f(3) * f(6) / f(7) * f(1.3e9) * f(2)),
    (check.checkpoint_interval, {"save_seconds": 37, "mtbf_seconds": 30_000}, lambda f: np.sqrt(f(2 * 37 * 30_000))),
    (check.cross_device_bytes, {"readers": 7, "elements": 1_234_567}, lambda f: f(6) * f(1_234_567) * f(4)),
])
def test_every_float_check_accepts_a_float32_answer(fn, kwargs, formula):
    """Computed in float32 (NumPy scalars or tensors), a right answer is right: judged to float32's precision."""
    import tensorflow as tf

    assert fn(formula(float), **kwargs).correct
    assert fn(formula(np.float32), **kwargs).correct
    assert fn(tf.constant(formula(np.float32)), **kwargs).correct
    assert fn(formula(float) * 1.05, **kwargs).status == "wrong"  # a real mistake is still one


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (7_000_000, "correct", "own chunk"),
    (np.float32(7_000_000), "correct", "own chunk"),
    (56_000_000, "wrong", "whole tensor"),
    (8_000_000, "wrong", "keeps for itself"),
    (14_000_000, "wrong", "all-reduce"),
    (1_000_000, "wrong", "one chunk"),
    (3, "wrong", "each of the other N−1"),
    (None, "unsolved", "number of bytes"),
])
def test_all_to_all_bytes(answer, status_, hint):
    feedback = check.all_to_all_bytes(answer, n=8, nbytes=8_000_000)
    assert feedback.status == status_ and hint in feedback.message


def _reduce_scatter_variants():
    """A right solution and the typical mistakes, built from mgpu_edu.collectives on the devices."""
    import tensorflow as tf

    from mgpu_edu import collectives, parallel

    def right(tensors):
        sums, kept = collectives.all_reduce(tensors), []
        sizes = parallel.shard_sizes(int(sums[0].shape[0]), len(tensors))
        for i, total in enumerate(sums):
            with tf.device(tensors[i].device):
                kept.append(tf.split(total, sizes)[i])
        return kept

    def whole(tensors):
        return collectives.all_reduce(tensors)

    def chunk_zero(tensors):
        return [tf.split(t, parallel.shard_sizes(7, len(tensors)))[0] for t in collectives.all_reduce(tensors)]

    def floor_rows(tensors):
        n, kept = len(tensors), []
        for i, total in enumerate(collectives.all_reduce(tensors)):
            with tf.device(tensors[i].device):
                kept.append(total[i * (7 // n): (i + 1) * (7 // n)])
        return kept

    def default_device(tensors):  # slices outside tf.device: they land on the default device
        sizes = parallel.shard_sizes(7, len(tensors))
        return [tf.split(t, sizes)[i] for i, t in enumerate(collectives.all_reduce(tensors))]

    def even_split(tensors):  # tf.split(total, N): 7 rows don't divide by 4
        return [tf.split(t, len(tensors))[i] for i, t in enumerate(collectives.all_reduce(tensors))]

    def numpy_split(tensors):
        return [np.array_split(t, len(tensors))[i] for i, t in enumerate(collectives.all_reduce(tensors))]

    def as_tuple_with_gather(tensors):  # another right answer: a tuple, rows picked with tf.gather
        sizes = parallel.shard_sizes(7, len(tensors))
        starts = np.cumsum([0, *sizes])
        out = []
        for i, total in enumerate(collectives.all_reduce(tensors)):
            with tf.device(tensors[i].device):
                out.append(tf.gather(total, list(range(starts[i], starts[i + 1]))))
        return tuple(out)

    def stub(tensors):
        return ...

    def broken(tensors):
        raise RuntimeError("oops")

    return {"right": right, "whole": whole, "chunk_zero": chunk_zero, "floor_rows": floor_rows,
            "default_device": default_device, "stub": stub, "broken": broken, "even_split": even_split,
            "numpy_split": numpy_split, "as_tuple_with_gather": as_tuple_with_gather}


@pytest.mark.parametrize(("variant", "status_", "hint"), [
    ("right", "correct", "twice what a real one sends"),
    ("as_tuple_with_gather", "correct", "chunk i of the sum on device i"),
    ("even_split", "wrong", "parallel.shard_sizes(7, 4)"),
    ("numpy_split", "wrong", "Cut with tf.split or by slicing"),
    ("whole", "wrong", "kept the whole sum"),
    ("chunk_zero", "wrong", "kept chunk 0"),
    ("floor_rows", "wrong", "numpy.array_split"),
    ("default_device", "wrong", "with tf.device(tensors[i].device)"),
    ("stub", "unsolved", "still returns `...`"),
    ("broken", "wrong", "raised RuntimeError: oops"),
])
def test_reduce_scatter_function(four_devices, variant, status_, hint):
    feedback = check.reduce_scatter_function(_reduce_scatter_variants()[variant], four_devices)
    assert feedback.status == status_ and hint in feedback.message, feedback


def test_reduce_scatter_function_unsolved_and_not_a_function(four_devices):
    assert check.reduce_scatter_function(None, four_devices).status == "unsolved"
    assert "no parentheses" in check.reduce_scatter_function(3, four_devices).message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (2 * 2 * 7 / 8 * 2048 * 4096 * 2, "correct", "two ring all-reduces"),
    (2 * 7 / 8 * 2048 * 4096 * 2, "wrong", "one all-reduce"),
    (4 * 2048 * 4096 * 2, "wrong", "(t−1)/t"),
    (2 * 2 * 7 / 8 * 2048 * 4096 * 4, "wrong", "4 bytes a value"),
    (4 * 2 * 7 / 8 * 2048 * 4096 * 2, "wrong", "the backward pass too"),
    (5, "wrong", "count the block's all-reduces"),
    (None, "unsolved", "number of bytes"),
])
def test_tp_block_bytes(answer, status_, hint):
    feedback = check.tp_block_bytes(answer, t=8, seq=2048, batch=1, hidden=4096)
    assert feedback.status == status_ and hint in feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    ((12 * 64 * 64 + 4 * 64) // 4 + 6 * 64, "correct", "plus all 384 copied"),
    ((12 * 64 * 64 + 10 * 64) // 4, "wrong", "splits everything"),
    ((12 * 64 * 64 + 4 * 64) // 4, "wrong", "leaves out the 384 copied"),
    (12 * 64 * 64 // 4 + 6 * 64, "wrong", "leaves b1 out"),
    ((12 * 64 * 64 + 6 * 64) // 4 + 4 * 64, "wrong", "splits bo and b2"),
    (12 * 64 * 64 // 4 + 10 * 64, "wrong", "that copies b1"),
    (12 * 64 * 64 + 10 * 64, "wrong", "the whole block"),
    (2.5, "wrong", "whole number"),
    (None, "unsolved", "number of weights"),
])
def test_block_weights_per_device(answer, status_, hint):
    feedback = check.block_weights_per_device(answer, hidden=64, t=4)
    assert feedback.status == status_ and hint in feedback.message, feedback


_RING = 7 * 2 * 1 * 32 * 4096 * 128 * 2  # N−1 steps × (keys + values) × b·heads·(s/N)·head_dim × 2 bytes


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (_RING, "correct", "N−1 = 7 steps"),
    (float(_RING), "correct", "N−1 = 7 steps"),
    (_RING // 2, "wrong", "the keys only"),
    (_RING // 7 * 8, "wrong", "that is N steps"),
    (_RING * 8, "wrong", "the total over all 8 GPUs"),
    (_RING * 3 // 2, "wrong", "the queries too"),
    (_RING * 2, "wrong", "4 bytes a value"),
    (_RING * 3, "wrong", "forward and backward passes together"),
    (3, "wrong", "Count the steps"),
    (None, "unsolved", "number of bytes"),
])
def test_ring_attention_bytes(answer, status_, hint):
    feedback = check.ring_attention_bytes(answer, n=8, batch=1, heads=32, seq=32768, head_dim=128)
    assert feedback.status == status_ and hint in feedback.message, feedback


@pytest.mark.parametrize(("fn", "status_", "hint"), [
    (lambda d, n: [d, 2 * n - 1 - d], "correct", "2N+1 causal chunk products"),
    (lambda d, n: (2 * n - 1 - d, d), "correct", "2N+1"),  # any order, a tuple
    (lambda d, n: {d, 2 * n - 1 - d}, "correct", "2N+1"),  # a set will do
    (lambda d, n: d, "wrong", "return the two chunk numbers"),
    (lambda d, n: [2 * d, 2 * d + 1], "wrong", "neighbouring chunks"),
    (lambda d, n: [d, n - 1 - d], "wrong", "2N chunks"),
    (lambda d, n: [d, d + n], "wrong", "its mirror from the end"),
    (lambda d, n: 1 / 0, "wrong", "raised ZeroDivisionError"),
    (lambda d, n: ..., "unsolved", "still returns"),
    (None, "unsolved", "define `zigzag"),
    (3, "wrong", "no parentheses"),
])
def test_zigzag_function(fn, status_, hint):
    feedback = check.zigzag_function(fn)
    assert feedback.status == status_ and hint in feedback.message, feedback


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (12, "correct", "18 slots"),
    (12.0, "correct", "18 slots"),
    (21, "wrong", "leaves k out"),
    (14, "wrong", "ignores the capacity factor: an expert"),
    (22, "wrong", "ignores the capacity factor and k"),
    (13, "wrong", "rounds up"),
    (18, "wrong", "number of slots"),
    (30, "wrong", "first `capacity` choices"),
    (5, "wrong", "capacity = ⌈capacity factor"),
    (12.5, "wrong", "whole number"),
    (None, "unsolved", "token choices"),
])
def test_dropped_tokens(answer, status_, hint):
    feedback = check.dropped_tokens(answer, tokens=64, experts=8, top_k=2, capacity_factor=1.1, routed=30)
    assert feedback.status == status_ and hint in feedback.message, feedback


_WHOLE = 1024 * 512 * 4  # the gathered tensor, 2,097,152 bytes


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (2 * 7 / 8 * _WHOLE, "correct", "zero-filled copy"),
    (3_670_016, "correct", "zero-filled copy"),
    (7 / 8 * _WHOLE, "wrong", "a ring all-gather's bytes"),
    (_WHOLE, "wrong", "the whole tensor's size"),
    (_WHOLE / 8, "wrong", "one device's share"),
    (2 * 7 * _WHOLE, "wrong", "multiplies by N − 1"),
    (5, "wrong", "sends 2(N−1)/N · S"),
    ("many", "wrong", "expected a number of bytes"),
    (None, "unsolved", "number of bytes"),
])
def test_dtensor_gather_bytes(answer, status_, hint):
    feedback = check.dtensor_gather_bytes(answer, n=8, rows=1024, cols=512)
    assert feedback.status == status_ and hint in feedback.message, feedback


_MEGATRON = {"wq": (None, "model"), "wk": (None, "model"), "wv": (None, "model"), "wo": ("model", None),
             "w1": (None, "model"), "b1": ("model",), "w2": ("model", None)}


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (_MEGATRON, "correct", "by columns, wo and w2 by rows"),
    ({**_MEGATRON, "w1": [None, "model"]}, "correct", "by rows"),  # lists do as well as tuples
    ({**_MEGATRON, "ln1_gamma": (None,), "bo": [None]}, "correct", "by rows"),  # whole weights may be listed
    ({**_MEGATRON, "wq": ("unsharded", "model"), "bo": ("unsharded",)}, "correct", "by rows"),  # DTensor's spelling
    ({**_MEGATRON, "b1": ("model")}, "wrong", "a string, not a tuple"),
    ({**_MEGATRON, "wo": (None, "model")}, "wrong", "split the rows"),
    ({**_MEGATRON, "w2": (None, "model")}, "wrong", "w2's rows meet the columns"),
    ({**_MEGATRON, "b1": (None,)}, "wrong", "split it like those columns"),
    ({k: v for k, v in _MEGATRON.items() if k != "wk"}, "wrong", "wk is missing"),
    ({**_MEGATRON, "bo": ("model",)}, "wrong", "held whole by each device"),
    ({k: tuple("x" if a else a for a in v) for k, v in _MEGATRON.items()}, "wrong",
     "splits the right dimension, along an axis named 'x': the mesh's tensor axis is named 'model'"),
    ([("wq", (None, "model"))], "wrong", "expected a dict"),
    (..., "unsolved", "dict of weight name"),
])
def test_megatron_layouts(answer, status_, hint):
    feedback = check.megatron_layouts(answer)
    assert feedback.status == status_ and hint in feedback.message, feedback


def test_megatron_layouts_are_what_tensor_parallelism_splits():
    """The check's answer is the split lesson 13 makes by hand: each split weight's shard has 1/t of that axis."""
    from mgpu_edu.parallelism import meshes, tensor

    hidden, heads, t = 8, 2, 2
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(shape) for name, shape in
               {"wq": (hidden, hidden), "wk": (hidden, hidden), "wv": (hidden, hidden), "wo": (hidden, hidden),
                "w1": (hidden, 4 * hidden), "b1": (4 * hidden,), "w2": (4 * hidden, hidden), "bo": (hidden,),
                "b2": (hidden,), "ln1_gamma": (hidden,), "ln1_beta": (hidden,), "ln2_gamma": (hidden,),
                "ln2_beta": (hidden,)}.items()}
    shard = tensor.shard_block(weights, t, heads)[0]
    for name, whole in weights.items():
        axes = meshes.MEGATRON.get(name, (None,) * whole.ndim)
        expected = tuple(size // t if axis else size for size, axis in zip(whole.shape, axes, strict=True))
        assert tuple(np.shape(shard[name])) == expected, name


def test_mfu_from_throughput_names_hardware_flops_and_six_per_parameter():
    """Lesson 17, exercise 1: GPT-3 at 99,972 tokens/s on 1,024 A100s (Narayanan et al.'s 140 TFLOP/s, counted with
    the recomputed forward): MFU, not HFU, and attention counted."""
    from mgpu_edu import costmodel, planner

    model = planner.PUBLISHED["GPT-3 175B on 64 A100s (Megatron-LM)"].model
    args = {"tokens_per_second": 99_972, "devices": 1024, "peak_flops": 312e12}
    right = costmodel.mfu(model, 99_972, 1024, 312e12)
    assert check.mfu_from_throughput(right, **args).correct and round(right, 3) == 0.337
    assert check.mfu_from_throughput(..., **args).status == "unsolved"
    assert "hardware FLOPs" in check.mfu_from_throughput(140 / 312, **args).message
    assert "attention" in check.mfu_from_throughput(6 * model.params * 99_972 / (1024 * 312e12), **args).message
    assert "fraction" in check.mfu_from_throughput(100 * right, **args).message
    assert check.mfu_from_throughput(right * 1.01, **args).status == "wrong"


def test_a_float16_answer_is_held_to_two_of_its_steps():
    """A float16 answer is judged to float16's precision (steps of 2**-10 of its value), two steps at most: the
    right value rounded to float16 is right, one 0.3 % off (three steps) is not."""
    right = math.log(1 + 6 / math.e)  # softmax_floor for 7 classes
    assert check.softmax_floor(np.float16(right), classes=7).correct
    assert not check.softmax_floor(np.float16(right * 1.003), classes=7).correct


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (7 / 8 * 989e12 / 450e9, "correct", "the same threshold as data parallelism"),
    (989e12 / 450e9, "wrong", "C/W alone"),
    (7 / 8 * 989e12 / 450e9 / 3, "wrong", "against one collective"),
    (7 / 8 * 989e12 / 450e9 * 1.5, "wrong", "only the backward pass"),
    (7 / 8 * 989e12 / 450e9 * 2, "wrong", "2 bytes a value"),
    (7 / 8 * 989e12 / 50e9, "wrong", "network between nodes"),
    (5, "wrong", "solve for b"),
    (None, "unsolved", "tokens per device"),
])
def test_fsdp_tokens(answer, status_, hint):
    """Lesson 18, exercise 1: 8 H100s in one node (989 TFLOP/s, 450 GB/s of NVLink one way): 1,923 tokens."""
    feedback = check.fsdp_tokens(answer, "H100", 8)
    assert feedback.status == status_ and hint in feedback.message, feedback.message


@pytest.mark.parametrize(("answer", "status_", "hint"), [
    (7 / 96, "correct", "a third of 1F1B's"),
    (7 / 32, "wrong", "1F1B's bubble"),
    (0, "wrong", "ZB-H2"),
    (7 / 103, "wrong", "share of the whole run"),
    (0.5, "wrong", "ideal time is 3M slots"),
    ("a third", "wrong", "expected a fraction"),
    (None, "unsolved", "the bubble"),
])
def test_zero_bubble(answer, status_, hint):
    """Lesson 18, exercise 2: 8 stages, 32 micro-batches: (P − 1)/(3M) = 7/96, against 1F1B's 7/32."""
    feedback = check.zero_bubble(answer, 8, 32)
    assert feedback.status == status_ and hint in feedback.message, feedback.message
