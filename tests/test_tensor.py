"""Tensor parallelism of the tiny GPT: outputs, every gradient and the bytes sent, against one device."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import models, quiet, tensor

tf = quiet.import_tensorflow()


@pytest.fixture(scope="module")
def model_and_batch(four_devices):
    model = models.tiny_gpt(vocab=32, seq_len=16, hidden=32, heads=4, layers=2, seed=3)
    rng = np.random.default_rng(0)
    tokens = tf.constant(rng.integers(0, 32, size=(2, 16)), tf.int32)
    targets = tf.constant(rng.integers(0, 32, size=(2, 16)), tf.int32)
    return model, tokens, targets, tensor.model_gradients(model, tokens, targets)


@pytest.fixture(scope="module")
def traced_steps(model_and_batch, four_devices):
    """Every traced step the tests below read, traced once each: {(t, sequence_parallel): tensor.TracedStep}."""
    model, tokens, targets, _ = model_and_batch
    return {(t, sp): tensor.trace_step(model, tokens, targets, four_devices[:t], sp)
            for t, sp in [(1, False), (2, False), (4, False), (2, True), (4, True)]}


def reference_slice(name, grad, t, d):
    """Device d's part of the one-device gradient of ``name``: its columns, its rows, or all of it."""
    cut = tensor.CUT[name.split("/")[1]] if "/" in name else "copied"
    if cut == "columns":
        size = grad.shape[-1] // t
        return grad[..., d * size:(d + 1) * size]
    if cut == "rows":
        size = grad.shape[0] // t
        return grad[d * size:(d + 1) * size]
    return grad


@pytest.mark.parametrize("t", [1, 2, 4])
def test_split_model_equals_one_device(four_devices, model_and_batch, t):
    model, tokens, targets, (logits, loss, grads) = model_and_batch
    run = tensor.forward_and_gradients(model, tokens, targets, four_devices[:t])
    assert run.loss == pytest.approx(loss, rel=1e-6)
    for d in range(t):
        np.testing.assert_allclose(run.logits[d].numpy(), logits.numpy(), rtol=1e-5, atol=1e-6)
        assert set(run.gradients[d]) == set(grads)  # every weight has its gradient on every device
        for name, grad in run.gradients[d].items():
            want = reference_slice(name, grads[name].numpy(), t, d)
            assert grad.shape == want.shape, name
            np.testing.assert_allclose(grad.numpy(), want, rtol=1e-4, atol=1e-7, err_msg=f"{name} on device {d}")
        assert all(v.device == run.shards[d]["lm_head"].device for v in run.shards[d].values())  # all on device d


@pytest.mark.parametrize("t", [2, 4])
def test_bytes_per_block_equal_the_formula(four_devices, model_and_batch, t):
    model, tokens, targets, _ = model_and_batch
    run = tensor.forward_and_gradients(model, tokens, targets, four_devices[:t])
    expected = tensor.formula_bytes_per_block(t, seq=16, batch=2, hidden=32)
    for block in range(2):
        for direction in ("forward", "backward"):
            assert run.log.count(direction, block) == 2  # two all-reduces each way: Megatron's g's, then f's
            assert run.log.bytes_sent(direction, block) == [expected] * t


def test_the_model_is_causal(four_devices, model_and_batch):
    model, tokens, *_ = model_and_batch
    changed = tokens.numpy().copy()
    changed[:, 10:] = (changed[:, 10:] + 1) % 32  # change only positions 10 and later
    before, after = model(tokens).numpy(), model(tf.constant(changed)).numpy()
    np.testing.assert_array_equal(before[:, :10], after[:, :10])  # earlier positions see no future token
    assert not np.allclose(before[:, 10:], after[:, 10:])


def test_degrees_that_do_not_divide_are_refused(four_devices, model_and_batch):
    model, tokens, targets, _ = model_and_batch
    with pytest.raises(ValueError, match=r"heads=4 doesn't divide by 3\. Pick t among \[1, 2, 4\]"):
        tensor.forward_and_gradients(model, tokens, targets, four_devices[:3])
    with pytest.raises(ValueError, match=r"hidden=30 must divide into heads=4"):
        models.tiny_gpt(hidden=30, heads=4)
    with pytest.raises(ValueError, match="t=0"):
        tensor.check_degree(0, 32, 4)
    with pytest.raises(ValueError, match="empty list"):
        tensor.forward_and_gradients(model, tokens, targets, [])


def test_shards_put_back_together_are_the_block(model_and_batch):
    model, *_ = model_and_batch
    weights = {n: w.numpy() for n, w in model.blocks[0].weights_by_name().items()}
    shards = tensor.shard_block(weights, 4, heads=4)
    for name, whole in weights.items():
        cut = tensor.CUT[name]
        if cut == "copied":
            assert all(np.array_equal(s[name], whole) for s in shards)
        else:
            axis = -1 if cut == "columns" else 0
            np.testing.assert_array_equal(np.concatenate([s[name] for s in shards], axis=axis), whole)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_sequence_parallel_model_equals_one_device(four_devices, model_and_batch, t):
    model, tokens, targets, (logits, loss, grads) = model_and_batch
    run = tensor.forward_and_gradients(model, tokens, targets, four_devices[:t], sequence_parallel=True)
    assert run.loss == pytest.approx(loss, rel=1e-5)
    assert [tuple(x.shape) for x in run.logits] == [(2, 16 // t, 32)] * t  # each device: its chunk of the sequence
    np.testing.assert_allclose(run.whole_logits().numpy(), logits.numpy(), rtol=1e-5, atol=1e-6)
    for d in range(t):
        for name, grad in run.gradients[d].items():
            want = reference_slice(name, grads[name].numpy(), t, d)
            np.testing.assert_allclose(grad.numpy(), want, rtol=1e-4, atol=1e-7, err_msg=f"{name} on device {d}")


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_sends_what_tensor_parallel_sends(four_devices, model_and_batch, t):
    model, tokens, targets, _ = model_and_batch
    run = tensor.forward_and_gradients(model, tokens, targets, four_devices[:t], sequence_parallel=True)
    expected = tensor.formula_bytes_per_block(t, seq=16, batch=2, hidden=32)
    for block in range(2):
        for direction in ("forward", "backward"):
            assert run.log.count(direction, block) == 4  # two all-gathers and two reduce-scatters each way
            assert run.log.bytes_sent(direction, block) == [expected] * t
    kinds = {trace.algorithm for way, block, _, trace in run.log.records if block >= 0}
    assert kinds == {"all_gather", "reduce_scatter"}


def test_sequence_that_does_not_divide_is_refused(four_devices, model_and_batch):
    model, tokens, targets, _ = model_and_batch
    with pytest.raises(ValueError, match=r"sequence length 15 doesn't divide by 2"):
        tensor.forward_and_gradients(model, tokens[:, :15], targets[:, :15], four_devices[:2], sequence_parallel=True)


def test_the_block_picture_names_each_devices_share():
    import matplotlib

    matplotlib.use("Agg")
    from mgpu_edu import viz

    ax = viz.draw_tensor_parallel_block(4, heads=8, sequence_parallel=True)
    texts = {text.get_text() for text in ax.texts}
    assert {"heads 0–1\nwhole seq", "heads 6–7\nwhole seq", "seq chunk 3", "columns 4/4\nwhole seq",
            "back: all-gather", "reduce-scatter"} <= texts
    assert "whole seq" in {text.get_text() for text in viz.draw_tensor_parallel_block(2).texts}
    with pytest.raises(ValueError, match="heads=4 doesn't divide by t=3"):
        viz.draw_tensor_parallel_block(3)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_every_result_stays_on_its_device(four_devices, model_and_batch, sequence_parallel):
    """Eagerly, what each device computes lands on that device: outputs and every gradient (a region operator
    written as one custom-gradient op over all devices would hand every output to the default device)."""
    model, tokens, targets, _ = model_and_batch
    run = tensor.forward_and_gradients(model, tokens, targets, four_devices, sequence_parallel=sequence_parallel)
    for d in range(4):
        assert run.logits[d].device.endswith(f"/device:CPU:{d}")
        assert {g.device.rsplit("/", 1)[-1] for g in run.gradients[d].values()} == {f"device:CPU:{d}"}


@pytest.mark.parametrize(("t", "sequence_parallel"), [(2, False), (4, False), (2, True), (4, True)])
def test_only_the_collectives_cross_devices(traced_steps, t, sequence_parallel):
    """In TensorFlow's traced graph of a whole step, the bytes each device receives from the others are exactly
    those the collectives' log counts: no hidden copy anywhere."""
    step = traced_steps[t, sequence_parallel]
    received, log = step.received, step.log
    logged = [sum(trace.bytes_received[d] for *_, trace in log.records) for d in range(t)]
    assert logged[0] > 0
    assert [received[f"CPU:{d}"] for d in range(t)] == logged


def test_kept_activations_split_as_korthikanti_et_al_say(traced_steps):
    """Per device, in block 0: tensor parallelism divides what the split regions keep by t and leaves the copied
    regions whole; sequence parallelism divides those too; the split regions' inputs stay whole either way
    (the all-gathered input, which Megatron-LM gathers again in the backward pass instead of keeping)."""
    s, b, h = 16, 2, 32

    def regions(t, sequence_parallel):
        per = {}
        for k in traced_steps[t, sequence_parallel].kept:
            if k.scope(0) == "block0":
                per.setdefault(k.device, {}).setdefault(k.scope(1), 0)
                per[k.device][k.scope(1)] += k.nbytes
        assert set(per) == {f"CPU:{d}" for d in range(t)} and all(p == per["CPU:0"] for p in per.values())
        return per["CPU:0"]

    one = regions(1, False)
    assert set(one) == {"copied", "edge", "split"} and one["edge"] == 2 * s * b * h * 4
    for t in (2, 4):
        assert regions(t, False) == {"copied": one["copied"], "edge": one["edge"], "split": one["split"] // t}
        assert regions(t, True) == {"copied": one["copied"] // t, "edge": one["edge"], "split": one["split"] // t}


def test_a_custom_gradient_over_every_device_lands_on_one(four_devices):
    """Lesson 13 §2, why the regions' edges are not one tf.custom_gradient op: TensorFlow passes its outputs
    through identity ops run under the caller's device scope, so, eagerly with none, all land on device 0."""
    xs = []
    for d, device in enumerate(four_devices):
        with tf.device(device):
            xs.append(tf.fill([3], float(d)))

    @tf.custom_gradient
    def identity(*values):
        return list(values), lambda *upstream: list(upstream)

    outputs = identity(*xs)
    assert [x.device.rsplit(":", 1)[-1] for x in xs] == ["0", "1", "2", "3"]
    assert {y.device.rsplit(":", 1)[-1] for y in outputs} == {"0"}
