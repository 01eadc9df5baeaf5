"""The 3-D run (lesson 16) against one device's Keras Adam, and the planner's predictions against what it measured."""

from __future__ import annotations

import pytest

from conftest import run_fresh
from mgpu_edu import planner, threed
from mgpu_edu._validate import BadArgument

# The 3-D run's tests start an 8-device process (about 40 s here): make test runs them, make check doesn't (lesson
# 16 asserts the same when it changes).
slow = pytest.mark.slow

RUN = """
from mgpu_edu import meshes
meshes.record_collectives()
import mgpu_edu
mgpu_edu.setup_devices(8, verbose=False)
import numpy as np
tf = mgpu_edu.import_tensorflow()
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
import keras
from mgpu_edu import gpt, threed
from mgpu_edu.parallelism.meshes import MEGATRON
keras.utils.set_random_seed(0)
model = gpt.TinyGPT(vocab=64, seq_len=16, hidden=32, heads=4, layers=2)
rng = np.random.default_rng(0)
tokens = rng.integers(0, 64, (8, 16)).astype(np.int32)
targets = rng.integers(0, 64, (8, 16)).astype(np.int32)
start = model.weights_by_name()
one = {n: tf.Variable(w) for n, w in start.items()}
adam = keras.optimizers.Adam(1e-2)
one_losses = []
for _ in range(3):
    with tf.GradientTape() as tape:
        loss = gpt.next_token_loss(gpt.forward(one, tokens, 4), targets)
    grads = tape.gradient(loss, list(one.values()))
    adam.apply_gradients(zip([tf.convert_to_tensor(g) for g in grads], list(one.values())))
    one_losses.append(float(loss))
grid = threed.Grid(data=2, tensor=2, pipeline=2, micro_batches=4)
run = threed.train(model, tokens, targets, grid, mgpu_edu.logical_devices(), steps=3, learning_rate=1e-2)
worst = 0.0
for device, shares in enumerate(run.shares):
    stage, rest = divmod(device, 4)
    replica, rank = divmod(rest, 2)
    for name, share in shares.items():
        whole = one[name].numpy()
        axes = MEGATRON.get(name.split("/")[-1], (None,) * whole.ndim)
        piece = tuple(slice(rank * (n // 2), (rank + 1) * (n // 2)) if a else slice(None)
                      for n, a in zip(whole.shape, axes))
        worst = max(worst, float(np.abs(whole[piece] - share).max()))
# Keras's Adam applies a gather's IndexedSlices gradient row by row: repeated rows differ from the dense update
table = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
after = {}
for mode in ("sparse", "dense"):
    v = tf.Variable(table)
    opt = keras.optimizers.Adam(0.1)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(v, [1, 1, 2]) * tf.constant([[1., 2, 3], [1, 2, 3], [4, 5, 6]]))
        g = tape.gradient(loss, v)
        kind = type(g).__name__
        opt.apply_gradients([(g if mode == "sparse" else tf.convert_to_tensor(g), v)])
    after[mode] = v.numpy()
result = {"losses": run.losses, "one_losses": one_losses, "worst": worst, "sent": run.sent, "held": run.held,
          "in_flight": run.in_flight, "gradient_kind": kind,
          "repeated_row_gap": float(np.abs(after["sparse"][1] - after["dense"][1]).max()),
          "other_rows_gap": float(max(np.abs(after["sparse"][r] - after["dense"][r]).max() for r in (0, 2, 3, 4)))}
"""


@pytest.fixture(scope="module")
def capstone() -> dict:
    return run_fresh(RUN, timeout=600)["result"]


@slow
def test_three_d_training_equals_one_device(capstone):
    """After 3 Adam steps every device's share of every weight equals one device's Keras Adam training."""
    for got, want in zip(capstone["losses"], capstone["one_losses"], strict=True):
        assert abs(got - want) < 1e-5
    assert capstone["worst"] < 1e-4  # Adam steps of 1e-2 divided by √v: float32 rounding, magnified near g = 0


@slow
def test_the_planner_predicts_what_the_run_sent_and_held(capstone):
    model = planner.Model(layers=2, hidden=32, heads=4, seq=16, vocab=64)
    layout = planner.Layout(data=2, tensor=2, pipeline=2, zero=1, micro_batch=1, micro_batches=4, recompute="stage")
    for device in range(8):
        stage = device // 4
        p = planner.predict(model, layout, precision="fp32", stage=stage)
        sent = capstone["sent"][device]
        assert sent == {axis: p.sent[axis] for axis in ("tensor", "pipeline", "data")}, device
        held = capstone["held"][device]
        kinds = ("weights", "gradients", "optimizer", "activations")  # "working" is transient: not measured here
        assert {kind: held[kind] for kind in kinds} == {kind: p.held[kind] for kind in kinds}, device
        assert held["update copy"] == held["weights"] // 2  # its half of its share, as Keras's Adam's variable
    assert capstone["in_flight"] == [2, 1]  # 1F1B: stage s keeps P − s micro-batches


@slow
def test_keras_adam_updates_a_gathers_repeated_rows_differently_from_the_dense_gradient(capstone):
    assert capstone["gradient_kind"] == "IndexedSlices"
    assert capstone["repeated_row_gap"] > 0.01 and capstone["other_rows_gap"] < 1e-6


def test_stage_weights_and_grid():
    names = ["token_embedding", "position_embedding", "block0/wq", "block1/wq", "block2/wq", "block3/wq",
             "final_gamma", "lm_head"]
    assert threed.stage_weights(names, 4, 2) == [names[:4], names[4:]]
    with pytest.raises(BadArgument, match="can't share 4 blocks"):
        threed.stage_weights(names, 4, 3)
    grid = threed.Grid(2, 2, 2, 4)
    assert [grid.device(k, s, r) for s in range(2) for k in range(2) for r in range(2)] == list(range(8))
