"""Trading compute for memory, checked against TensorFlow and Keras: tf.recompute_grad gives the same
gradients, by-hand accumulation takes the whole batch's step, and Keras 3's gradient_accumulation_steps
averages the micro-batches' means (a different step when they differ in size)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import memory, models, recovery, tradeoffs


def _data(n, seed=0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    return tf.constant(rng.normal(size=(n, 64)), tf.float32), tf.constant(rng.integers(0, 10, n), tf.int32)


@pytest.mark.parametrize("segment", [1, 2, 3, 9])
def test_recomputed_gradients_equal_plain_ones_and_the_forward_runs_again(segment):
    model = models.mlp(64, 10, hidden=(32,) * 8, seed=0)
    x, y = _data(40)
    loss_fn = models.per_example_loss()
    plain_loss, plain = tradeoffs.checkpointed_step(model, loss_fn, x, y)
    runs = []
    loss, recomputed = tradeoffs.checkpointed_step(model, loss_fn, x, y, segment=segment, forward_runs=runs)
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    for a, b in zip(plain, recomputed, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    groups = len(tradeoffs.segments(model, segment))
    assert runs == list(range(groups)) + list(reversed(range(groups)))  # every segment, forward again in reverse


def test_kept_activations_counts():
    model = models.mlp(64, 10, hidden=(256,) * 8, seed=0)
    rows = [n for _, n in memory.layer_activations(model, 512)]
    assert tradeoffs.kept_activations(model, 512) == sum(rows)
    # segments of 3 over 9 layers: the forward pass keeps each segment's input (rows 0, 3, 6) and the logits (row 9)
    assert tradeoffs.kept_activations(model, 512, segment=3) == sum(rows[i] for i in (0, 3, 6, 9)) == 1_200_128
    assert tradeoffs.kept_activations(model, 512, segment=9) == rows[0] + rows[9]
    with pytest.raises(ValueError, match="segment=10"):
        tradeoffs.kept_activations(model, 512, segment=10)


def _fit(x, y, batch_size, accumulate=None):
    import keras

    net = models.mlp(64, 10, hidden=(32,), seed=0)
    net.compile(optimizer=keras.optimizers.SGD(0.5, gradient_accumulation_steps=accumulate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    net.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return net.get_weights()


def _by_hand(x, y, micro_batch, divide_by):
    import keras

    net = models.mlp(64, 10, hidden=(32,), seed=0)
    grads = tradeoffs.accumulated_gradients(net, models.per_example_loss(), x, y, micro_batch, divide_by)
    keras.optimizers.SGD(0.5).apply_gradients(zip(grads, net.trainable_variables, strict=True))
    return net.get_weights()


def _gap(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize(("n", "even"), [(96, True), (80, False)])
def test_keras_gradient_accumulation_averages_the_micro_batches_means(n, even):
    x, y = _data(n)
    whole = _fit(x.numpy(), y.numpy(), n)
    keras_acc = _fit(x.numpy(), y.numpy(), 32, accumulate=3)
    assert _gap(_by_hand(x, y, 32, "examples"), whole) < 1e-6  # by hand: the whole batch's step, always
    assert _gap(keras_acc, _by_hand(x, y, 32, "micro_batches")) < 1e-6  # Keras: (g1 + g2 + g3) / 3
    if even:
        assert _gap(keras_acc, whole) < 1e-6
    else:  # [32, 32, 16]: the short micro-batch's examples count double
        assert _gap(keras_acc, whole) > 1e-3


def test_accumulation_arguments():
    x, y = _data(10)
    model = models.mlp(64, 10, hidden=(8,), seed=0)
    loss_fn = models.per_example_loss()
    with pytest.raises(ValueError, match="micro_batch=11"):
        tradeoffs.accumulated_gradients(model, loss_fn, x, y, 11)
    with pytest.raises(ValueError, match="divide_by='mean'"):
        tradeoffs.accumulated_gradients(model, loss_fn, x, y, 5, divide_by="mean")
    with pytest.raises(ValueError, match="x has 10 examples and y 9"):
        tradeoffs.accumulated_gradients(model, loss_fn, x, y[:9], 5)
    assert tradeoffs.micro_batch_sizes(80, 32) == [32, 32, 16] and tradeoffs.micro_batch_sizes(96, 32) == [32] * 3


def test_recovery_arithmetic():
    assert recovery.last_checkpoint(137, 50) == 100 and recovery.last_checkpoint(150, 50) == 150
    assert recovery.last_checkpoint(49, 50) == 0
    assert recovery.checkpoint_interval(30, 28_800) == pytest.approx(1314.53, abs=0.01)
    assert recovery.machines_mtbf(3.6e6, 1000) == 3600
    with pytest.raises(ValueError, match="every=0"):
        recovery.last_checkpoint(10, 0)
    with pytest.raises(ValueError, match="save_seconds=0"):
        recovery.checkpoint_interval(0, 100)


@pytest.mark.processes
def test_recomputation_measured_with_tensorflows_allocator():
    """Lesson 10's numbers, read from TensorFlow's own CPU allocator (TF_CPU_ALLOCATOR_USE_BFC makes
    get_memory_info count on a CPU), as step_memory reads them.

    The lesson's model (8 hidden layers of 256, batch 512, segments of 3): what the forward pass keeps
    falls to about a quarter, as kept_activations counts, but the step's peak doesn't fall at all: it
    moves from the start of the backward pass (every activation still held) to its end (every weight's
    gradient held, plus a rebuilt segment and the gradients flowing through it). A deeper model on a
    bigger batch (16 layers, batch 2048, segments of 4), whose activations dwarf its weights, sees the
    peak fall. The readings repeat closely in a fresh process: the step runs eagerly."""
    out = run_fresh("""
        import os
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        from mgpu_edu import data, devices, models, tradeoffs
        devices.setup_devices(4, verbose=False)
        import tensorflow as tf
        digits = data.digits()
        loss_fn = models.per_example_loss()
        result = {}
        for name, depth, batch, segment in (("lesson", 8, 512, 3), ("deep", 16, 2048, 4)):
            deep = models.mlp(64, 10, hidden=(256,) * depth, seed=0)
            x = tf.constant(tf.tile(digits.x_train[:512], [batch // 512, 1]))
            y = tf.constant(tf.tile(digits.y_train[:512], [batch // 512]))
            runs = [[tradeoffs.step_memory(deep, loss_fn, x, y, segment=s) for s in (None, segment)] for _ in range(2)]
            result[name] = {
                "readings": [[(m.kept, m.peak, m.gradients) for m in run] for run in runs],
                "peak_phase": [max(m.timeline, key=lambda r: r[2])[0] for m in runs[-1]],
                "counted": [tradeoffs.kept_activations(deep, batch, s) - x.numpy().nbytes for s in (None, segment)],
                "weights": sum(v.numpy().nbytes for v in deep.trainable_variables),
            }
    """)["result"]
    for name, row in out.items():
        first, second = row["readings"]
        for a, b in zip(sum(first, []), sum(second, []), strict=True):
            assert abs(a - b) <= 0.01 * b, name  # eager readings repeat, to a few hundred bytes
        (plain_kept, plain_peak, plain_grads), (kept, peak, grads) = second
        for measured, counted in zip((plain_kept, kept), row["counted"], strict=True):
            assert abs(measured - counted) < 0.05 * row["counted"][0], name  # the count is what TensorFlow keeps
        assert kept < 0.3 * plain_kept, name  # the forward pass keeps about a quarter
        assert plain_grads == grads and abs(grads - row["weights"]) < 0.1 * row["weights"], name  # the gradients
    lesson, deep = out["lesson"]["readings"][1], out["deep"]["readings"][1]
    assert lesson[1][1] >= lesson[0][1]  # the lesson's model: the peak doesn't fall
    assert deep[1][1] < 0.7 * deep[0][1]  # activations that dwarf the weights: it falls
    assert out["lesson"]["peak_phase"] == ["backward", "backward"]


@pytest.mark.processes
@pytest.mark.parametrize("onednn, bfc", [("1", False), ("0", False), ("0", True)])
def test_step_memory_on_a_cpu_says_what_the_allocator_misses(onednn, bfc):
    """What TensorFlow 2.21's CPU allocator counts depends on how TensorFlow started. Without
    TF_CPU_ALLOCATOR_USE_BFC, on oneDNN (on by default on Linux x86 CPUs with AVX-512 VNNI or BF16, AVX-VNNI or
    AMX; TF_ENABLE_ONEDNN_OPTS sets it either way): allocations of 256 KiB and up only, so a 64 KiB tensor adds
    nothing and a 256 KiB one 262,144 bytes, and step_memory warns how to count everything. Without oneDNN: no
    counts, get_memory_info raises, and so does step_memory, saying how to count. With the variable: every
    allocation, and no warning. A device TensorFlow doesn't know gets TensorFlow's own error."""
    out = run_fresh(f"""
        import os, warnings
        os.environ.pop("TF_CPU_ALLOCATOR_USE_BFC", None)
        if {bfc}:
            os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "{onednn}"
        from mgpu_edu import data, devices, models, tradeoffs
        devices.setup_devices(2, verbose=False)
        import tensorflow as tf
        info = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
        keep, added, errors = [], [], []
        try:
            for n in (16_384, 65_536):  # 64 KiB and 256 KiB of float32
                before = info()
                keep.append(tf.ones((n,)))
                added.append(info() - before)
        except ValueError as error:
            errors.append(str(error))
        digits = data.digits()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                tradeoffs.step_memory(models.mlp(64, 10, seed=0), models.per_example_loss(),
                                      tf.constant(digits.x_train[:8]), tf.constant(digits.y_train[:8]))
            except ValueError as error:
                errors.append(str(error))
        try:
            tradeoffs.step_memory(None, None, None, None, device="CPU:7")
        except ValueError as error:
            unknown = str(error)
        result = {{"added": added, "errors": errors, "warnings": [str(w.message) for w in caught],
                   "unknown": unknown}}
    """)["result"]
    assert "CPU:7" in out["unknown"] and "keeps no memory counts" not in out["unknown"]
    if bfc:
        assert out["added"] == [65_536, 262_144] and out["errors"] == [] and out["warnings"] == []
    elif onednn == "1":
        assert out["added"] == [0, 262_144] and out["errors"] == []
        assert any("256 KiB" in w and "TF_CPU_ALLOCATOR_USE_BFC=true" in w for w in out["warnings"])
    else:
        assert out["added"] == [] and len(out["errors"]) == 2 and out["warnings"] == []
        tensorflows, ours = out["errors"]
        assert "Allocator stats not available" in tensorflows
        assert "device='CPU:0'" in ours and "keeps no memory counts" in ours and "TF_CPU_ALLOCATOR_USE_BFC=true" in ours


@pytest.mark.processes
def test_selective_recomputation_of_the_tiny_gpt_measured_with_tensorflows_allocator():
    """Lesson 13's numbers. Recomputing the attention cores (selective) or whole blocks (full) leaves every
    gradient as it was. Traced, selective recomputation frees exactly the formula's 5·a·s/h term, one block of
    scores (the softmax) per transformer block; eagerly, read from the allocator, it frees about three per block,
    the tensors an eager tape keeps around the scores: the unscaled scores (a division's gradient reads its
    dividend), the scaled ones (an addition that may broadcast reads its inputs' shapes) and the softmax (read by
    its own gradient); a softmax's input and a division's output are not kept. The allocator rounds each tensor
    up to a chunk of its pool, so eager readings are checked loosely; after a first step, they repeat."""
    out = run_fresh("""
        import os
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        from mgpu_edu import data, devices, gpt, graphs, memory, models, tradeoffs
        devices.setup_devices(4, verbose=False)
        import tensorflow as tf
        S, B, H, A, L = 128, 8, 32, 4, 2
        model = models.tiny_gpt(vocab=26, seq_len=S, hidden=H, heads=A, layers=L, seed=0)
        text = data.skip_text(n=16, length=S)
        tokens, targets = tf.constant(text.x_train[:B]), tf.constant(text.y_train[:B])
        weights = model.weights_by_name()
        names = list(weights)
        grads, traced, formula = {}, {}, {}
        for recompute in gpt.RECOMPUTE:
            def step(*values, recompute=recompute):
                with tf.GradientTape() as tape:
                    tape.watch(values)
                    loss = gpt.next_token_loss(gpt.forward(dict(zip(names, values)), tokens, A, recompute), targets)
                return tape, loss, values
            tape, loss, values = step(*weights.values())
            grads[recompute] = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, list(values))]
            kept = graphs.kept_for_backward(step, lambda r: r[0].gradient(r[1], list(r[2])), *weights.values())
            traced[recompute] = sum(k.nbytes for k in kept)
            formula[recompute] = L * memory.transformer_activations(S, B, H, A, recompute=recompute,
                                                                    bytes_per_value=4, dropout=False)
        worst = max(float(abs(a - b).max()) for r in gpt.RECOMPUTE for a, b in zip(grads[r], grads["none"]))
        tradeoffs.gpt_step_memory(model, tokens, targets)  # the one-time buffers
        runs = [[tradeoffs.gpt_step_memory(model, tokens, targets, r).kept for r in gpt.RECOMPUTE] for _ in range(2)]
        x, mask = tf.random.normal([B, A, S, S]), tf.random.normal([S, S])
        ops = {"scale, mask": lambda x: x / 3.0 + mask, "scale, softmax": lambda x: tf.nn.softmax(x / 3.0),
               "mask, softmax": lambda x: tf.nn.softmax(x + mask), "product, scale": lambda x: tf.matmul(x, x) / 3.0}
        kept_ops = {name: tradeoffs.kept_by(fn, x) for name, fn in ops.items()}
        result = {"worst": worst, "traced": traced, "formula": formula, "runs": runs, "ops": kept_ops,
                  "scores": B * A * S * S * 4, "layers": L}
    """)["result"]
    assert out["worst"] < 1e-6
    traced, formula, scores, layers = out["traced"], out["formula"], out["scores"], out["layers"]
    assert traced["none"] - traced["selective"] == formula["none"] - formula["selective"] == layers * scores
    assert traced["full"] < traced["selective"]
    first, second = out["runs"]
    for a, b in zip(first, second, strict=True):
        assert abs(a - b) <= 0.01 * b  # eager readings repeat
    none, selective, full = second
    assert full < 0.2 * selective < 0.7 * 0.2 * none
    assert 2.5 < (none - selective) / (layers * scores) < 4  # about three per block
    ops = {name: round(kept / scores, 1) for name, kept in out["ops"].items()}
    assert ops == {"scale, mask": 1.0, "scale, softmax": 0.0, "mask, softmax": 0.0, "product, scale": 1.0}
