"""Ring attention (context parallelism) against one device's attention: outputs, gradients, bytes, work, memory."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import context, gpt, quiet

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


@pytest.mark.processes
def test_up_to_eight_devices_in_a_fresh_process():
    out = run_fresh("""
        import numpy as np
        import tensorflow as tf
        from mgpu_edu import context, gpt, setup_devices
        layout = setup_devices(8, verbose=False)
        rng = np.random.default_rng(4)
        q, k, v = (tf.constant(rng.standard_normal((1, 2, 48, 4)), tf.float64) for _ in range(3))
        worst = 0.0
        for n in (5, 6, 8):
            for layout_name in ("contiguous", "zigzag"):
                if 48 % (n if layout_name == "contiguous" else 2 * n):
                    continue
                got = context.ring_attention(q, k, v, list(layout)[:n], layout=layout_name)
                worst = max(worst, float(np.max(np.abs(got.numpy() - gpt.attention(q, k, v).numpy()))))
        result = worst
    """)
    assert out["result"] < 1e-12
