"""MirroredStrategy helpers and the replicas × batch explorer, without a browser."""

from __future__ import annotations

import math
import threading
import time

import pytest

from mgpu_edu import data, mirrored, models


def test_seed_004_arithmetic():
    assert mirrored.steps_per_epoch(5656, 64) == 89
    assert mirrored.steps_per_epoch(5656, 128) == 45
    plan = mirrored.batch_plan(5656, 64, 2)
    assert (plan.per_replica, plan.global_batch, plan.steps_per_epoch, plan.last_batch) == (64, 128, 45, 24)


@pytest.mark.parametrize(("batch", "replicas", "mode", "per", "glob"), [
    (32, 4, "per_replica", 32, 128), (100, 3, "global", 34, 100), (4, 4, "global", 1, 4), (7, 1, "global", 7, 7)])
def test_batch_plan_modes(batch, replicas, mode, per, glob):
    plan = mirrored.batch_plan(1000, batch, replicas, mode=mode, base_lr=0.1, base_batch=32)
    assert (plan.per_replica, plan.global_batch) == (per, glob)
    assert plan.steps_per_epoch == math.ceil(1000 / glob)
    assert plan.learning_rate == pytest.approx(0.1 * glob / 32)
    assert plan.uneven == (glob % replicas != 0)


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
    with pytest.raises(ValueError, match="replicas=5: this kernel has 4 devices"):
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
    from mgpu_edu.widgets import ReplicaBatchExplorer

    explorer = ReplicaBatchExplorer(None, _small_split(), devices=[f"/device:CPU:{i}" for i in range(4)],
                                    background=False)
    assert "mgpu-explorer" in explorer.root._dom_classes and "mgpu-results" in explorer.table._dom_classes
    assert explorer.replicas.max == 4  # more replicas than devices can't be chosen
    explorer.replicas.value, explorer.batch.value = 4, 32
    assert "global batch <b>128</b>" in explorer.numbers.value and "<b>2</b> steps" in explorer.numbers.value
    assert "<b>0.2</b>" in explorer.numbers.value  # 0.05 × 128 / 32
    explorer.mode.value = "global"
    explorer.batch.value = 3
    assert "can&#x27;t be split over 4 replicas" in explorer.numbers.value
    assert explorer.train_button.disabled
    assert explorer.train() is None and "⚠" in explorer.status.value  # explained, no exception
    explorer.batch.value = 10
    assert not explorer.train_button.disabled and "uneven" in explorer.numbers.value


@pytest.mark.widgets
def test_explorer_trains_adds_rows_and_ignores_second_click(four_devices):
    from mgpu_edu.widgets import ReplicaBatchExplorer

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
