"""Exercise checks: right answers, the typical wrong answers with their hints, and unsolved ones."""

from __future__ import annotations

import pytest

from mgpu_edu import check


def test_device_names(capsys):
    expected = ["/device:CPU:0", "/device:CPU:1"]
    assert check.device_names(None, expected).status == "unsolved"
    assert check.device_names(["/job:localhost/replica:0/task:0/device:CPU:0", "/device:CPU:1"], expected).correct
    assert "physical" in check.device_names(["/physical_device:CPU:0"], expected).message
    assert "upper case" in check.device_names([], expected).message
    assert check.device_names(["/device:CPU:2", "/device:CPU:3"], expected).status == "wrong"
    assert check.device_names("CPU:0", expected).status == "wrong"


def test_cross_device_bytes():
    assert check.cross_device_bytes(..., 8, 250_000).status == "unsolved"
    assert check.cross_device_bytes(7_000_000, 8, 250_000).correct
    assert "reads it in place" in check.cross_device_bytes(8_000_000, 8, 250_000).message
    assert "counts elements" in check.cross_device_bytes(1_750_000, 8, 250_000).message
    assert check.cross_device_bytes("7e6", 8, 250_000).status == "wrong"


def test_shard_sizes_function():
    assert check.shard_sizes_function(None).status == "unsolved"
    assert check.shard_sizes_function(lambda b, n: [b // n + (i < b % n) for i in range(n)]).correct
    assert "covers" in check.shard_sizes_function(lambda b, n: [b // n] * n).message
    assert "larger shards first" in check.shard_sizes_function(
        lambda b, n: sorted([b // n + (i < b % n) for i in range(n)])).message
    assert "raised ZeroDivisionError" in check.shard_sizes_function(lambda b, n: [1 / 0]).message


def test_combine_function():
    assert check.combine_function(None).status == "unsolved"
    assert check.combine_function(lambda s, c: sum(s) / sum(c)).correct
    naive = check.combine_function(lambda s, c: sum(a / b for a, b in zip(s, c, strict=True)) / len(s))
    assert naive.status == "wrong" and "mean of the towers' means" in naive.message
    assert check.combine_function(lambda s, c: sum(s)).status == "wrong"


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

    assert check.shard_sizes_function(shard_stub).status == "unsolved"
    assert check.combine_function(combine_stub).status == "unsolved"
    assert "forget the `return`" in check.combine_function(forgot_return).message
    assert "no parentheses" in check.combine_function(2.0).message
    assert "no parentheses" in check.shard_sizes_function([3, 3]).message
