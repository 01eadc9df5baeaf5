"""DTensor meshes and layouts (lesson 15), asked of TensorFlow: shares, inserted collectives, training on a mesh.

DTensor writes its compiled programs only when asked before TensorFlow starts, so everything that
reads them runs in fresh processes with 8 logical CPUs (one process per setting).
"""

from __future__ import annotations

import pytest

from conftest import run_fresh
from mgpu_edu import meshes
from mgpu_edu._validate import BadArgument

START = """
from mgpu_edu import meshes
meshes.record_collectives()
import mgpu_edu
mgpu_edu.setup_devices(8, verbose=False)
import numpy as np
tf = mgpu_edu.import_tensorflow()
from tensorflow.experimental import dtensor
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": OPTIMIZER_OFF})
result = {}
mesh = meshes.make_mesh({"batch": 2, "model": 4})
L = lambda *axes: meshes.layout(mesh, *axes)
big = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
"""

RELAYOUTS = """
cases = {"gather": (("model", None), (None, None)), "all_to_all": (("model", None), (None, "model")),
         "split": ((None, None), ("model", None)), "gather_2d": (("batch", "model"), (None, None))}
for name, (source, target) in cases.items():
    x = meshes.put(big, L(*source))
    run = meshes.compiled_collectives(lambda t, target=target: dtensor.relayout(t, L(*target)), x)
    result[name] = {"equal": bool(np.array_equal(meshes.whole(run.result), big)),
                    "logical": [c.op for c in run.logical],
                    "physical": [[c.op, list(c.shape), c.group, c.sent] for c in run.physical]}
# shares: what TensorFlow's unpack gives each device, against holders' arithmetic
x = meshes.put(big, L("batch", "model"))
owners = meshes.holders({"batch": 2, "model": 4}, ["batch", "model"], [64, 32])
parts = meshes.shards(x)
result["shares"] = all(np.array_equal(parts[d], big[r * 32:(r + 1) * 32, c * 8:(c + 1) * 8])
                       for (r, c), devices in owners.items() for d in devices)
result["shapes"] = [list(p.shape) for p in parts]
# a matmul whose contraction is split: partial sums, then one all-reduce
w = np.ones((32, 16), np.float32)
run = meshes.compiled_collectives(tf.matmul, meshes.put(big, L(None, "model")), meshes.put(w, L("model", None)))
result["matmul_split_k"] = {"equal": bool(np.allclose(meshes.whole(run.result), big @ w)),
                            "layout": dtensor.fetch_layout(run.result).sharding_specs,
                            "physical": [[c.op, list(c.shape), c.group] for c in run.physical]}
run = meshes.compiled_collectives(tf.matmul, meshes.put(big, L("batch", None)), meshes.put(w, L(None, "model")))
errors = {}
for name, call in {"axis": lambda: L("data", None), "twice": lambda: L("model", "model"),
                   "uneven": lambda: meshes.put(np.ones((6, 4), np.float32), L("model", None)),
                   "rank": lambda: meshes.put(np.ones((8, 4), np.float32), L("model")),
                   "plain": lambda: meshes.compiled_collectives(tf.matmul, tf.ones((2, 2)), tf.ones((2, 2))),
                   "python_if": lambda: meshes.compiled_collectives(lambda t: t * 2 if tf.reduce_sum(t) > 0 else t,
                                                                    meshes.put(big, L(None, None)))}.items():
    try:
        call()
        errors[name] = "no error"
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {error}"
result["errors"] = errors
result["matmul_split_rows_cols"] = {"equal": bool(np.allclose(meshes.whole(run.result), big @ w)),
                                    "layout": dtensor.fetch_layout(run.result).sharding_specs,
                                    "physical": [c.op for c in run.physical]}
"""

GPT = """
import keras
from mgpu_edu import gpt, parallel, tensor
keras.utils.set_random_seed(0)
model = gpt.TinyGPT(vocab=64, seq_len=16, hidden=32, heads=4, layers=2)
rng = np.random.default_rng(0)
tokens = rng.integers(0, 64, (8, 16)).astype("int32")
targets = rng.integers(0, 64, (8, 16)).astype("int32")
start = model.weights_by_name()
_, ref_loss, ref_grads = tensor.model_gradients(model, tokens, targets)
result["forward_equal"] = float(np.abs(gpt.forward(start, tokens, 4).numpy() - model(tokens).numpy()).max())

def one_device_sgd(steps, lr):
    ws = {n: tf.Variable(w) for n, w in start.items()}
    for _ in range(steps):
        meshes.sgd_step(ws, tokens, targets, 4, lr)
    return {n: v.numpy() for n, v in ws.items()}

reference = one_device_sgd(3, 0.5)
for name, axes, tensor_axis in [("dp", {"batch": 8, "model": 1}, None), ("dp_tp", {"batch": 2, "model": 4}, "model"),
                               ("tp", {"batch": 1, "model": 8}, None)]:
    if name == "tp":
        m = meshes.make_mesh({"batch": 1, "model": 4}, devices=mgpu_edu.logical_devices(4))
        tensor_axis = "model"
    else:
        m = meshes.make_mesh(axes)
    layouts = meshes.gpt_layouts(m, start, tensor_axis=tensor_axis)
    ws = meshes.variables(start, layouts)
    toks = meshes.put(tokens, meshes.layout(m, "batch", None))
    tgts = meshes.put(targets, meshes.layout(m, "batch", None))
    run = meshes.compiled_collectives(meshes.gpt_gradients, ws, toks, tgts, 4)
    loss, grads = run.result
    entry = {"loss": float(meshes.whole(loss)),
             "grad_diff": max(float(np.abs(meshes.whole(grads[n]) - ref_grads[n].numpy()).max()) for n in start),
             "grad_layouts": {n: dtensor.fetch_layout(grads[n]).sharding_specs for n in ("block0/wq", "lm_head")},
             "physical": [[c.op, list(c.shape), c.group, c.sent] for c in run.physical],
             "held": {n: list(meshes.shards(ws[n].read_value())[0].shape) for n in ("block0/w1", "block0/w2")}}
    step = tf.function(meshes.sgd_step)
    for _ in range(3):
        step(ws, toks, tgts, 4, 0.5)
    if name == "tp":
        tp_shards = {n: meshes.shards(grads[n]) for n in start}
    entry["trained_diff"] = max(float(np.abs(meshes.whole(ws[n].read_value()) - reference[n]).max()) for n in start)
    result[name] = entry
result["ref_loss"] = ref_loss
line = meshes.make_mesh({"batch": 8})
acts = np.random.default_rng(1).standard_normal((16, 8, 32)).astype(np.float32)
weight = dtensor.DVariable(meshes.put(np.ones((32, 16), np.float32), meshes.layout(line, None, None)))
def weight_gradient(x, product):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(product(x, weight)))
    return tape.gradient(loss, weight)
seq_first = meshes.put(acts, meshes.layout(line, None, "batch", None))
runs = {"matmul_sbh": meshes.compiled_collectives(weight_gradient, seq_first, tf.matmul),
        "matmul_bsh": meshes.compiled_collectives(
            weight_gradient, meshes.put(acts.transpose(1, 0, 2), meshes.layout(line, "batch", None, None)), tf.matmul),
        "einsum_sbh": meshes.compiled_collectives(weight_gradient, seq_first, gpt.dense)}
result["three_ways"] = {k: {"shape": list(r.physical[0].shape), "sent": r.sent} for k, r in runs.items()}
result["three_ways"]["same_gradient"] = all(np.allclose(meshes.whole(r.result), meshes.whole(runs["matmul_bsh"].result),
                                                        rtol=1e-5) for r in runs.values())
# the by-hand versions of lessons 02 and 13, on the same weights
def per_example(y, logits):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True), axis=1)
by_hand = parallel.data_parallel_gradients(model, per_example, tokens, targets, mgpu_edu.logical_devices(8))
names = {id(v): n for n, v in zip(start, [model.tokens, model.positions, model.final_gamma, model.final_beta,
                                          model.head])}
for i, layer in enumerate(model.blocks):
    names.update({id(getattr(layer, n)): f"block{i}/{n}" for n in gpt.BLOCK_WEIGHTS})
by_hand = {names[id(v)]: tf.convert_to_tensor(g).numpy() for v, g in zip(model.trainable_variables, by_hand)}
result["dp_by_hand_diff"] = max(float(np.abs(by_hand[n] - ref_grads[n].numpy()).max()) for n in start)
split = tensor.forward_and_gradients(model, tokens, targets, mgpu_edu.logical_devices(4))
# device by device: the share of each gradient DTensor left on device d, against lesson 13's device d
result["tp_by_hand_diff"] = max(float(np.abs(tp_shards[n][d] - split.gradients[d][n].numpy()).max())
                                for n in start for d in range(4))
"""


@pytest.fixture(scope="module")
def dtensor_run() -> dict:
    """One 8-device process: relayouts, matmuls and TinyGPT on three meshes (Grappler switched off, as the lesson)."""
    return run_fresh(START.replace("OPTIMIZER_OFF", "True") + RELAYOUTS + GPT, timeout=600)["result"]


@pytest.mark.processes  # the module's 8-device process
def test_relayouts_are_collectives_and_keep_the_values(dtensor_run):
    for name in ("gather", "all_to_all", "split", "gather_2d"):
        assert dtensor_run[name]["equal"], name
    assert dtensor_run["gather"]["logical"] == ["DTensorAllGather"]
    assert dtensor_run["all_to_all"]["logical"] == ["DTensorAllToAll"]
    assert dtensor_run["split"]["logical"] == ["DTensorAllScatter"]
    assert dtensor_run["split"]["physical"] == []  # each device slices what it already holds


@pytest.mark.processes  # the module's 8-device process
def test_dtensor_gathers_with_an_all_reduce_of_a_zero_padded_tensor_on_cpus(dtensor_run):
    """On CPUs DTensor lowers an all-gather to CollectiveReduceV2 of the whole tensor: twice a ring gather's bytes."""
    whole = 64 * 32 * 4
    [(op, shape, group, sent)] = dtensor_run["gather"]["physical"]
    assert (op, shape, group) == ("CollectiveReduceV2", [64, 32], 4)
    ring_gather = 3 / 4 * whole
    assert sent == 2 * 3 / 4 * whole == 2 * ring_gather == 12288
    [(op, shape, group, sent)] = dtensor_run["gather_2d"]["physical"]
    assert (op, shape, group, sent) == ("CollectiveReduceV2", [64, 32], 8, 2 * 7 / 8 * whole)


@pytest.mark.processes  # the module's 8-device process
def test_all_to_all_sends_what_lesson_12_says(dtensor_run):
    [(op, shape, group, sent)] = dtensor_run["all_to_all"]["physical"]
    assert (op, group) == ("CollectiveAllToAllV2", 4)
    assert shape[0] * shape[1] * 4 == 64 * 32 * 4 // 4  # each device's share, cut into 4 pieces
    assert sent == 3 / 4 * (64 * 32 * 4 // 4) == 1536


@pytest.mark.processes  # the module's 8-device process
def test_shares_are_the_blocks_holders_names(dtensor_run):
    assert dtensor_run["shares"]
    assert dtensor_run["shapes"] == [[32, 8]] * 8


@pytest.mark.processes  # the module's 8-device process
def test_sharded_matmuls(dtensor_run):
    split_k = dtensor_run["matmul_split_k"]
    assert split_k["equal"] and split_k["layout"] == ["unsharded", "unsharded"]
    assert split_k["physical"] == [["CollectiveReduceV2", [64, 16], 4]]
    rows_cols = dtensor_run["matmul_split_rows_cols"]
    assert rows_cols["equal"] and rows_cols["layout"] == ["batch", "model"] and rows_cols["physical"] == []


@pytest.mark.processes  # the module's 8-device process
def test_gpt_on_meshes_equals_one_device_and_the_by_hand_versions(dtensor_run):
    assert dtensor_run["forward_equal"] == 0.0
    for name in ("dp", "dp_tp", "tp"):
        entry = dtensor_run[name]
        assert abs(entry["loss"] - dtensor_run["ref_loss"]) < 1e-5, name
        assert entry["grad_diff"] < 1e-6, name
        assert entry["trained_diff"] < 1e-5, name
    assert dtensor_run["dp_by_hand_diff"] < 1e-6
    assert dtensor_run["tp_by_hand_diff"] < 1e-6
    assert dtensor_run["dp_tp"]["grad_layouts"] == {"block0/wq": ["unsharded", "model"],
                                                    "lm_head": ["unsharded", "unsharded"]}
    assert dtensor_run["dp_tp"]["held"] == {"block0/w1": [32, 32], "block0/w2": [32, 32]}
    assert dtensor_run["dp"]["held"] == {"block0/w1": [32, 128], "block0/w2": [128, 32]}


@pytest.mark.processes  # the module's 8-device process
def test_tensor_parallel_inserts_megatrons_all_reduces(dtensor_run):
    """Per block: one all-reduce after attention and one after the MLP forward, and two in the backward."""
    tp = dtensor_run["tp"]["physical"]
    activations = [c for c in tp if c[1] == [16, 8, 32] and c[2] == 4]
    assert len(activations) == 2 * 4  # two blocks, s × b × hidden each
    dp_tp = [c for c in dtensor_run["dp_tp"]["physical"] if c[1] == [16, 4, 32]]
    assert len(dp_tp) == 8 and all(c[2] == 4 for c in dp_tp)  # the batch halves each device's activations


@pytest.mark.processes  # the module's 8-device process
def test_data_parallel_gradients_travel_in_one_padded_bucket_of_the_weights(dtensor_run):
    """DTensor combines the gradient all-reduces into one bucket: every weight once, padded to 1,024 values."""
    weights = 64 * 32 + 16 * 32 + 2 * 32 + 32 * 64 + 2 * (4 * 32 + 4 * 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32)
    buckets = [c for c in dtensor_run["dp"]["physical"] if c[1] and c[2] == 8]
    assert buckets == [["CollectiveReduceV2", [-(-weights // 1024) * 1024], 8, buckets[0][3]]]


@pytest.mark.processes  # the module's 8-device process
def test_a_batched_matmul_makes_dtensor_all_reduce_per_position(dtensor_run):
    """tf.matmul of [s, b, h] by a weight all-reduces the weight's per-position gradients (s × the bytes);
    gpt.dense's einsum, or the batch first, all-reduces the weight's size. The gradient is the same."""
    ways = dtensor_run["three_ways"]
    assert ways["matmul_sbh"]["shape"] == [16, 32, 16] and ways["einsum_sbh"]["shape"] == [32, 16]
    assert ways["matmul_sbh"]["sent"] == 16 * ways["matmul_bsh"]["sent"] == 16 * ways["einsum_sbh"]["sent"]
    assert ways["same_gradient"]


@pytest.mark.slow  # another 8-device process: make test runs it, make check doesn't
def test_grappler_changes_nothing_dtensor_computes(dtensor_run):
    """The lesson switches Grappler off (it prints errors for DTensor's functions); with it on, the same
    collectives are inserted and the results still equal one device."""
    on = run_fresh(START.replace("OPTIMIZER_OFF", "False") + RELAYOUTS + GPT, timeout=600)["result"]
    for name in ("gather", "all_to_all", "split", "gather_2d", "shares", "shapes", "matmul_split_k"):
        assert on[name] == dtensor_run[name], name
    for name in ("dp", "dp_tp", "tp"):
        assert on[name]["physical"] == dtensor_run[name]["physical"], name
        assert on[name]["grad_diff"] < 1e-6 and on[name]["trained_diff"] < 1e-5, name


@pytest.mark.slow  # another 8-device process: make test runs it, make check doesn't
def test_collective_gather_v2_when_tensorflow_is_told_to():
    """With LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2 set (to anything, even 0), DTensor gathers with
    CollectiveGatherV2, at a ring gather's bytes."""
    code = "import os\nos.environ['LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2'] = '0'\n" + START.replace(
        "OPTIMIZER_OFF", "True") + RELAYOUTS
    result = run_fresh(code, timeout=600)["result"]
    assert result["gather"]["equal"]
    [(op, shape, group, sent)] = result["gather"]["physical"]
    assert (op, shape, group, sent) == ("CollectiveGatherV2", [16, 32], 4, 3 / 4 * 64 * 32 * 4)


KERAS = """
import mgpu_edu
mgpu_edu.setup_devices(8, verbose=False)
import keras, numpy as np
tf = mgpu_edu.import_tensorflow()
from tensorflow.experimental import dtensor
result = {"backend": keras.backend.backend(), "devices": keras.distribution.list_devices()}
mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], result["devices"])
layout_map = keras.distribution.LayoutMap(mesh)
layout_map[".*dense.*kernel"] = (None, "model")
result["version"] = keras.__version__
try:
    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
except AttributeError as error:  # Keras 3.13's TensorFlow backend has no num_processes
    result["build_error"] = str(error)
    distribution = None
if distribution is not None:
    keras.distribution.set_distribution(distribution)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="dense")])
    kernel = model.layers[0].kernel
    result["asked"] = list(keras.distribution.distribution().get_variable_layout(kernel).axes)
    model.compile("sgd", "mse")
    history = model.fit(np.ones((16, 8)), np.ones((16, 16)), batch_size=8, epochs=1, verbose=0)
    result["trained"] = len(history.history["loss"])
    result["is_dtensor"] = bool(dtensor.is_dtensor(kernel.value))
    result["device"] = kernel.value.device
    try:
        keras.distribution.distribute_tensor(tf.ones((8, 8)), keras.distribution.distribution().get_data_layout((8, 8)))
        result["distribute_tensor"] = "ran"
    except Exception as error:
        result["distribute_tensor"] = type(error).__name__
    keras.distribution.set_distribution(None)
import inspect
from keras.src.backend.tensorflow import distribution_lib as tf_distribution
result["do_not_use"] = "DO NOT USE" in inspect.getsource(tf_distribution)
result["distribute_value_stub"] = tf_distribution.distribute_value(tf.ones((2, 2)), None) is None
result["tf_keras_dtensor"] = hasattr(tf.keras, "dtensor")
"""


@pytest.mark.processes
def test_keras_distribution_with_tensorflow_fails_or_shards_nothing():
    """Keras 3.13 (Colab's) can't build ModelParallel on TensorFlow; Keras 3.15 builds it, trains, splits nothing."""
    result = run_fresh(KERAS, timeout=300)["result"]
    assert result["backend"] == "tensorflow" and len(result["devices"]) == 8
    if result["version"].startswith("3.13"):
        assert "num_processes" in result["build_error"]
    if "build_error" not in result:
        assert result["asked"] == [None, "model"] and result["trained"] == 1
        assert result["is_dtensor"] is False and result["device"].endswith("CPU:0")
        assert result["distribute_tensor"] == "AttributeError"
    assert result["do_not_use"] and result["distribute_value_stub"] and not result["tf_keras_dtensor"]


@pytest.mark.processes  # the module's 8-device process
def test_bad_layouts_and_inputs_get_clear_errors(dtensor_run):
    errors = dtensor_run["errors"]
    assert errors["axis"].startswith("BadArgument") and "'data' is not on this mesh" in errors["axis"]
    assert "same mesh axis" in errors["twice"]
    assert "6 doesn't divide into 4 equal parts" in errors["uneven"]
    assert "needs a layout of rank 2" in errors["rank"]
    assert errors["plain"].startswith("RuntimeError") and "must be DTensors" in errors["plain"]
    # traced without AutoGraph (the docstring says why): a Python `if` on a tensor's value is refused
    assert errors["python_if"].startswith("OperatorNotAllowedInGraphError"), errors["python_if"]


def test_make_mesh_checks_its_axes_before_tensorflow():
    with pytest.raises(BadArgument, match="make a mesh of 6 devices"):
        meshes.make_mesh({"batch": 2, "model": 3}, devices=["/device:CPU:0"] * 8)
    with pytest.raises(BadArgument, match="dict of axis name"):
        meshes.make_mesh([("batch", 8)], devices=["/device:CPU:0"] * 8)
    with pytest.raises(BadArgument, match="short word"):
        meshes.make_mesh({"the batch": 8}, devices=["/device:CPU:0"] * 8)


def test_holders_arithmetic():
    assert meshes.holders({"batch": 2, "model": 4}, [None, None], [4, 4]) == {(0, 0): list(range(8))}
    assert meshes.holders({"batch": 2, "model": 4}, [None, "batch"], [4, 4]) == {(0, 0): [0, 1, 2, 3],
                                                                                  (0, 1): [4, 5, 6, 7]}
    assert meshes.holders({"x": 8}, ["x"], [16]) == {(i,): [i] for i in range(8)}


@pytest.mark.parametrize(("call", "words"), [
    (lambda: meshes.holders({"batch": 2}, ["model"], [4]), "'model' is not on this mesh"),
    (lambda: meshes.holders({"batch": 2}, ["batch", None], [4]), "2 dimensions"),
])
def test_bad_inputs_say_what_to_do(call, words):
    with pytest.raises(BadArgument, match=words):
        call()


def test_record_collectives_after_tensorflow_started_says_restart(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow", object())
    monkeypatch.delenv("MGPU_EDU_DTENSOR_DUMPS", raising=False)
    with pytest.raises(RuntimeError, match="Restart the kernel"):
        meshes.record_collectives()
