"""Ring attention (context parallelism) against one device's attention: outputs, gradients, bytes, work, memory."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import context, gpt, graphs, planner, quiet

tf = quiet.import_tensorflow()


def qkv(seq, dtype=tf.float32, seed=0, batch=2, heads=3, dim=8):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.standard_normal((batch, heads, seq, dim)), dtype) for _ in range(3)]


def outputs_and_gradients(fn, q, k, v):
    weights = tf.constant(np.random.default_rng(9).standard_normal(q.shape), q.dtype)
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = fn(q, k, v)
        loss = tf.reduce_sum(out * weights)
    return out, tape.gradient(loss, [q, k, v])


@pytest.mark.parametrize("layout", context.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_attention_equals_one_device(four_devices, n, causal, layout):
    q, k, v = qkv(24)  # 24 cuts into N blocks and into 2N chunks for N = 1…4
    want, want_grads = outputs_and_gradients(lambda *x: gpt.attention(*x, causal=causal), q, k, v)
    got, grads = outputs_and_gradients(
        lambda *x: context.ring_attention(*x, four_devices[:n], causal=causal, layout=layout), q, k, v)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=2e-6)
    for g, w in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("layout", context.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_backward_ring_equals_one_device(four_devices, n, causal, layout):
    """ring_attention_backward's gradients against a tape's over the one-device attention; its bytes are twice
    the forward's, and both are what formula_bytes says."""
    q, k, v = qkv(24, seed=n)
    upstream = tf.constant(np.random.default_rng(9).standard_normal(q.shape), q.dtype)
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = gpt.attention(q, k, v, causal=causal)
    want = tape.gradient(out, [q, k, v], output_gradients=upstream)
    got, trace = context.ring_attention_backward(q, k, v, upstream, four_devices[:n], causal=causal, layout=layout,
                                                 trace=True)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=2e-6)
    _, forward = context.ring_attention(q, k, v, four_devices[:n], causal=causal, layout=layout, trace=True)
    kv_block = 2 * 2 * 3 * (24 // n) * 8 * 4  # one device's keys and values, float32
    assert forward.bytes_sent == [(n - 1) * kv_block] * n == [context.formula_bytes(n, 2, 3, 24, 8)] * n
    assert trace.bytes_sent == trace.bytes_received == [2 * (n - 1) * kv_block] * n
    assert trace.bytes_sent == [context.formula_bytes(n, 2, 3, 24, 8, backward=True)] * n
    assert trace.blocks == forward.blocks and trace.steps == (n if n > 1 else 0)


def test_the_backward_ring_runs_on_every_device_and_sends_what_its_trace_says(four_devices):
    """Traced by TensorFlow: every device runs gradient ops (a tape's name no device), and the bytes each device
    receives from the others are the recomputed forward ring's and the backward ring's, plus, on device 0, the
    gradients' chunks it puts together; less one key/value block, as both rings' first step sends the same
    tensor, which a graph copies once."""
    q, k, v = qkv(32)
    upstream = tf.constant(np.random.default_rng(9).standard_normal(q.shape), q.dtype)
    ops = graphs.op_devices(lambda *x: x, lambda x: context.ring_attention_backward(*x, four_devices), q, k, v,
                            upstream, scope="block_gradients")
    assert set(ops["backward"]) == {graphs.short_device(d) for d in four_devices}  # the gradients' products
    per_device = [ops["backward"][graphs.short_device(d)] for d in four_devices]  # causal: 1, 2, 3, 4 products,
    diagonal, other = per_device[0], per_device[1] - per_device[0]  # the first with the mask's ops
    assert other > 0 and per_device == [diagonal + (b - 1) * other for b in context.blocks_computed(4)]
    received = graphs.bytes_between_devices(lambda *x: context.ring_attention_backward(*x, four_devices), q, k, v,
                                            upstream)
    _, forward = context.ring_attention(q, k, v, four_devices, trace=True)
    _, backward = context.ring_attention_backward(q, k, v, upstream, four_devices, trace=True)
    ring = [f + b for f, b in zip(forward.bytes_received, backward.bytes_received, strict=True)]
    chunk = 2 * 3 * 8 * 8 * 4  # one device's share of dq, dk or dv; its keys and values are two
    assert ring == [3 * 2 * chunk + 6 * 2 * chunk] * 4  # forward: 3 blocks; backward: 3 blocks and 3 gradients
    assert [received[graphs.short_device(d)] for d in four_devices] == [
        ring[0] - 2 * chunk + 3 * 3 * chunk, *(r - 2 * chunk for r in ring[1:])]


def test_the_planners_context_bytes_are_the_rings_forward_and_backward(four_devices):
    """The planner counts 3(C − 1) key/value blocks per layer: one round forward, two backward."""
    q, k, v = qkv(32, batch=1, heads=4, dim=8)
    _, forward = context.ring_attention(q, k, v, four_devices, trace=True)
    _, backward = context.ring_attention_backward(q, k, v, q, four_devices, trace=True)
    model = planner.Model(layers=1, hidden=32, heads=4, seq=32, vocab=64)
    sent = planner.predict(model, planner.Layout(1, 1, 1, context=4), precision="fp32").sent["context"]
    assert sent == forward.bytes_sent[0] + backward.bytes_sent[0] == 3 * forward.bytes_sent[0]


def test_float64_agrees_to_rounding(four_devices):
    q, k, v = qkv(16, tf.float64, seed=3)
    got = context.ring_attention(q, k, v, four_devices, layout="zigzag")
    np.testing.assert_allclose(got.numpy(), gpt.attention(q, k, v).numpy(), rtol=0, atol=1e-13)


@pytest.mark.parametrize(("layout", "blocks"), [("contiguous", [1, 2, 3, 4]), ("zigzag", [9, 9, 9, 9])])
def test_bytes_and_work_per_device(four_devices, layout, blocks):
    q, k, v = qkv(32, batch=2, heads=4, dim=8)
    _, trace = context.ring_attention(q, k, v, four_devices, layout=layout, trace=True)
    formula = context.formula_bytes(4, batch=2, heads=4, seq=32, head_dim=8)
    assert trace.bytes_sent == trace.bytes_received == [formula] * 4 == [3 * 2 * 2 * 4 * 8 * 8 * 4] * 4
    assert trace.steps == 3 and trace.blocks == blocks == context.blocks_computed(4, layout=layout)
    _, trace = context.ring_attention(q, k, v, four_devices, causal=False, layout=layout, trace=True)
    assert trace.blocks == context.blocks_computed(4, causal=False, layout=layout) == [4 * len(blocks) // 4 * (
        1 if layout == "contiguous" else 4)] * 4


def test_work_formulas_for_any_n():
    for n in range(1, 9):
        contiguous = context.blocks_computed(n)
        assert contiguous == list(range(1, n + 1))  # device d sees blocks 0…d
        assert context.blocks_computed(n, layout="zigzag") == [2 * n + 1] * n  # balanced
        assert sorted(c for d in range(n) for c in context.chunks_of(d, n, "zigzag")) == list(range(2 * n))


def test_memory_kept_per_device(four_devices):
    """The score blocks kept for the backward pass shrink as 1/N (or follow the work under causal masking);
    the blocks shaped like q, k, v don't: autodiff keeps every key and value block that passed through, with
    the device's queries and output, 2N + 2 blocks of s/N positions."""
    q, k, v = qkv(64, batch=2, heads=4, dim=16)
    one = context.kept_per_device(q, k, v, four_devices[:1], causal=False)[0]
    for n in (1, 2, 4):
        kept = context.kept_per_device(q, k, v, four_devices[:n], causal=False)
        block = 2 * 4 * (64 // n) * 16 * 4
        assert [d["scores"] for d in kept] == [one["scores"] // n] * n
        assert [d["blocks"] for d in kept] == [(2 * n + 2) * block] * n
    score_block = 2 * 4 * 8 * 8 * 4  # one chunk × chunk product's scores, zig-zag over 4 devices (chunks of 8)
    kept = context.kept_per_device(q, k, v, four_devices, causal=True, layout="zigzag")
    assert [d["scores"] for d in kept] == [9 * score_block] * 4  # one tensor (the exp) per product, 9 each
    kept = context.kept_per_device(q, k, v, four_devices, causal=True)
    assert [d["scores"] for d in kept] == [(d + 1) * 4 * score_block for d in range(4)]


def test_per_step_work_and_the_zigzag_speed_up(four_devices):
    """Each step waits for its busiest device: summed over the steps, the zig-zag's slowest path is 4N/(2N+1) times
    shorter than the contiguous split's, in (query, key) pairs."""
    q, k, v = qkv(64)
    slowest = {}
    for layout in context.LAYOUTS:
        _, trace = context.ring_attention(q, k, v, four_devices, layout=layout, trace=True)
        chunk = 64 // len(context.chunks_of(0, 4, layout)) // 4
        assert [sum(step[d] for step in trace.per_step) for d in range(4)] == trace.blocks
        slowest[layout] = sum(max(step) * chunk * chunk for step in trace.per_step)
    assert slowest["contiguous"] * (2 * 4 + 1) == slowest["zigzag"] * 4 * 4


def test_bad_inputs_are_named(four_devices):
    q, k, v = qkv(10)
    with pytest.raises(ValueError, match="sequence length 10, which doesn't cut into N = 4 blocks"):
        context.ring_attention(q, k, v, four_devices)
    with pytest.raises(ValueError, match=r"2N = 4 chunks \(zig-zag\).*e\.g\. 8"):
        context.ring_attention(q, k, v, four_devices[:2], layout="zigzag")
    with pytest.raises(ValueError, match="layout='diagonal'"):
        context.ring_attention(q, k, v, four_devices[:2], layout="diagonal")
    with pytest.raises(ValueError, match="one shape"):
        context.ring_attention(q, k[:, :, :8], v, four_devices[:2])
    with pytest.raises(ValueError, match="at least one device"):
        context.ring_attention(q, k, v, [])
    with pytest.raises(ValueError, match="sequence length 10, which doesn't cut into N = 4 blocks"):
        context.ring_attention_backward(q, k, v, q, four_devices)
    with pytest.raises(ValueError, match=r"gradient, shaped like q \[2, 3, 10, 8\]; got \[2, 3, 8, 8\]"):
        context.ring_attention_backward(q, k, v, q[:, :, :8], four_devices[:2])


@pytest.mark.processes
def test_up_to_eight_devices_in_a_fresh_process():
    """N = 5 to 8, both layouts, causal and not: outputs and the backward ring's gradients against one device."""
    out = run_fresh("""
        import numpy as np
        import tensorflow as tf
        from mgpu_edu import context, gpt, setup_devices
        devices = list(setup_devices(8, verbose=False))
        rng = np.random.default_rng(4)
        worst, sent = 0.0, {}
        for n in (5, 6, 7, 8):
            seq = 4 * n  # cuts into N blocks and 2N chunks
            q, k, v, up = (tf.constant(rng.standard_normal((1, 2, seq, 4)), tf.float64) for _ in range(4))
            for layout_name in ("contiguous", "zigzag"):
                for causal in (True, False):
                    with tf.GradientTape() as tape:
                        tape.watch([q, k, v])
                        want = gpt.attention(q, k, v, causal=causal)
                    wants = tape.gradient(want, [q, k, v], output_gradients=up)
                    got = context.ring_attention(q, k, v, devices[:n], causal=causal, layout=layout_name)
                    grads, trace = context.ring_attention_backward(q, k, v, up, devices[:n], causal=causal,
                                                                   layout=layout_name, trace=True)
                    worst = max(worst, float(np.max(np.abs(got.numpy() - want.numpy()))),
                                *(float(np.max(np.abs(g.numpy() - w.numpy()))) for g, w in zip(grads, wants)))
                    sent[n] = trace.bytes_sent
        result = {"worst": worst, "sent": sent}
    """)
    assert out["result"]["worst"] < 1e-12
    for n, sent in out["result"]["sent"].items():  # (N − 1) blocks and their gradients, 2 · 1 · 2 · 4 · 4 values each
        assert sent == [2 * (int(n) - 1) * 2 * 2 * 4 * 4 * 8] * int(n)
