"""Hiding communication: the collective matmul against the all-gather and product it replaces."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import collectives, overlap, quiet

tf = quiet.import_tensorflow()


def shards(devices, rows=12, k=6, n_cols=5, seed=0, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows * len(devices), k))
    w = rng.standard_normal((k, n_cols * len(devices)))
    xs, ws = [], []
    for d, device in enumerate(devices):
        with tf.device(device):
            xs.append(tf.constant(x[d * rows:(d + 1) * rows], dtype))
            ws.append(tf.constant(w[:, d * n_cols:(d + 1) * n_cols], dtype))
    return x, w, xs, ws


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_collective_matmul_equals_gathering_then_multiplying(four_devices, n):
    x, w, xs, ws = shards(four_devices[:n])
    outputs, trace = overlap.collective_matmul(xs, ws, trace=True)
    gathered, gather_trace = collectives.all_gather(xs, trace=True)
    for d in range(n):
        np.testing.assert_allclose(outputs[d].numpy(), x @ w[:, d * 5:(d + 1) * 5], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outputs[d].numpy(), tf.matmul(gathered[d], ws[d]).numpy(), rtol=1e-6, atol=1e-6)
        assert outputs[d].device == xs[d].device
    assert trace.bytes_sent == gather_trace.bytes_sent == [(n - 1) * 12 * 6 * 4] * n  # an all-gather's bytes
    assert trace.sent_per_step == [12 * 6 * 4] * (n - 1) + [0]
    assert trace.flops_per_step == [2 * 12 * 6 * 5] * n and trace.overlapped_steps == n - 1


def test_uneven_columns_and_bad_shards(four_devices):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 3))
    xs, ws = [], []
    for d, (device, cols) in enumerate(zip(four_devices[:2], (2, 5), strict=True)):
        with tf.device(device):
            xs.append(tf.constant(x[d * 4:(d + 1) * 4], tf.float64))
            ws.append(tf.constant(rng.standard_normal((3, cols)), tf.float64))
    for d, out in enumerate(overlap.collective_matmul(xs, ws)):
        np.testing.assert_allclose(out.numpy(), x @ ws[d].numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="one input shard and one weight shard per device, got 2 and 1"):
        overlap.collective_matmul(xs, ws[:1])
    with pytest.raises(ValueError, match=r"every input shard must be \[rows/N, k\]"):
        overlap.collective_matmul([xs[0], xs[1][:3]], ws)


@pytest.mark.processes
def test_up_to_eight_devices_in_a_fresh_process():
    out = run_fresh("""
        import numpy as np
        import tensorflow as tf
        from mgpu_edu import overlap, setup_devices
        devices = list(setup_devices(8, verbose=False))
        rng = np.random.default_rng(2)
        worst, sent = 0.0, {}
        for n in (5, 6, 7, 8):
            x, w = rng.standard_normal((3 * n, 4)), rng.standard_normal((4, 2 * n))
            xs, ws = [], []
            for d in range(n):
                with tf.device(devices[d]):
                    xs.append(tf.constant(x[3 * d:3 * d + 3]))
                    ws.append(tf.constant(w[:, 2 * d:2 * d + 2]))
            outputs, trace = overlap.collective_matmul(xs, ws, trace=True)
            worst = max(worst, *(float(np.max(np.abs(o.numpy() - x @ w[:, 2 * d:2 * d + 2])))
                                 for d, o in enumerate(outputs)))
            sent[n] = trace.bytes_sent
        result = {"worst": worst, "sent": sent}
    """)
    assert out["result"]["worst"] < 1e-12
    for n, sent in out["result"]["sent"].items():
        assert sent == [(int(n) - 1) * 3 * 4 * 8] * int(n)


def test_gradient_readiness_counts_the_backward_work_each_gradient_does_not_wait_for(four_devices):
    """An MLP 64 → 32 → 16 → 10 on 8 examples: each layer's backward pass has two products, dX and dW, of
    2·b·in·out FLOPs each (the first layer needs no dX). A layer's weight gradient waits for its own dW and every
    later layer's dX; the rest can run while it is sent."""
    from mgpu_edu import data, models

    model = models.mlp(64, 10, hidden=(32, 16), seed=0)
    digits = data.digits()
    ready = overlap.gradient_readiness(model, models.per_example_loss(), tf.constant(digits.x_train[:8]),
                                       tf.constant(digits.y_train[:8]))
    product = {name: 2 * 8 * i * o for name, (i, o) in {"hidden0": (64, 32), "hidden1": (32, 16),
                                                          "logits": (16, 10)}.items()}
    total = 2 * product["logits"] + 2 * product["hidden1"] + product["hidden0"]
    waits = {"logits": product["logits"], "hidden1": product["logits"] + product["hidden1"],
             "hidden0": product["logits"] + product["hidden1"] + product["hidden0"]}
    by_name = {r.name: r for r in ready}
    for layer, waited in waits.items():
        kernel = by_name[f"mlp/{layer}/kernel"]
        assert kernel.remaining == total - waited
        assert kernel.nbytes == 4 * {"hidden0": 64 * 32, "hidden1": 32 * 16, "logits": 16 * 10}[layer]
    assert [r.remaining for r in ready] == sorted((r.remaining for r in ready), reverse=True)
    assert by_name["mlp/logits/bias"].remaining == total  # a bias's gradient sums the upstream: no product
    assert overlap.buckets(ready, 10**9) == [(sum(r.nbytes for r in ready), ready[-1].remaining)]  # one bucket
    assert [b for b, _ in overlap.buckets(ready, 1)] == [r.nbytes for r in ready]  # one per gradient
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        overlap.buckets(ready, 0)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_the_split_backward_adds_up_to_the_whole_backward(four_devices, layers):
    """Zero-bubble pipelines split the backward pass: B, every input gradient (and the weights that need no
    matrix product), then W, each weight matrix's xᵀ·dy from the factors B kept. On the tiny GPT, B + W is the
    whole backward pass, weight by weight, and the matrices' gradients come from W alone."""
    from mgpu_edu import data, gpt, models

    model = models.tiny_gpt(vocab=26, seq_len=16, hidden=32, heads=4, layers=layers, seed=layers)
    text = data.skip_text(n=16, length=16)
    tokens, targets = tf.constant(text.x_train[:4]), tf.constant(text.y_train[:4])
    weights = model.weights_by_name()
    with tf.GradientTape() as tape:
        tape.watch(list(weights.values()))
        loss = gpt.next_token_loss(gpt.forward(weights, tokens, 4), targets)
    whole = dict(zip(weights, tape.gradient(loss, list(weights.values())), strict=True))
    b_pass, w_pass = gpt.split_backward(weights, tokens, targets, heads=4)
    matrices = {f"block{i}/{name}" for i in range(layers) for name in ("wq", "wk", "wv", "wo", "w1", "w2")}
    assert set(w_pass) == matrices | {"lm_head"}
    for name in weights:
        b = tf.convert_to_tensor(b_pass[name])
        got = b + w_pass[name] if name in w_pass else b
        np.testing.assert_allclose(got.numpy(), tf.convert_to_tensor(whole[name]).numpy(), rtol=1e-6, atol=1e-7)
        if name in w_pass:
            assert not np.any(b.numpy())  # the B pass leaves every matrix's gradient to W
    assert not gpt._DEFERRED  # nothing left deferred after the call


def test_the_op_timeline_is_tensorflows_own_trace_of_the_ops(four_devices):
    """The collective matmul traced by TensorFlow's step stats: on each device N products, N − 1 copies in (its
    sends, each an Identity on the receiving device) and one concat; every op ends after it starts."""
    _, _, xs, ws = shards(four_devices, rows=32, k=16, n_cols=8)
    spans = overlap.op_timeline(lambda *a: overlap.collective_matmul(list(a[:4]), list(a[4:])), *xs, *ws)
    counts = {}
    for span in spans:
        counts[span.device, span.op] = counts.get((span.device, span.op), 0) + 1
        assert 0 <= span.start <= span.end
    short = [d.rsplit("device:", 1)[-1] for d in four_devices]
    assert counts == {**{(d, "MatMul"): 4 for d in short}, **{(d, "Identity"): 3 for d in short},
                      **{(d, "ConcatV2"): 1 for d in short}}
    assert min(s.start for s in spans) == 0
