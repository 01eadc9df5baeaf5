"""Mixture of experts: routing against a token-by-token loop, and the expert-parallel layer against one device."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import run_fresh
from mgpu_edu import experts, quiet

tf = quiet.import_tensorflow()


def weights(hidden=8, experts_=8, ffn=16, seed=0, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    return {"router": tf.constant(rng.standard_normal((hidden, experts_)), dtype),
            "w1": tf.constant(rng.standard_normal((experts_, hidden, ffn)) * 0.3, dtype),
            "b1": tf.constant(rng.standard_normal((experts_, ffn)) * 0.1, dtype),
            "w2": tf.constant(rng.standard_normal((experts_, ffn, hidden)) * 0.3, dtype)}


def loop_moe(x, w, top_k, capacity_factor, groups):
    """The layer one token and one choice at a time, in NumPy: what route + moe must equal."""
    x, w = np.asarray(x, np.float64), {k: np.asarray(v, np.float64) for k, v in w.items()}
    tokens, n_experts = x.shape[0], w["router"].shape[1]
    size = tokens // groups
    slots = math.ceil(capacity_factor * top_k * size / n_experts)
    out, dropped = np.zeros_like(x), 0
    for g in range(groups):
        rows = range(g * size, (g + 1) * size)
        logits = x[g * size:(g + 1) * size] @ w["router"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
        filled = [0] * n_experts
        for choice in range(top_k):  # every first choice before any second choice
            for t, row in enumerate(rows):
                e = order[t, choice]
                gate = probs[t, e] / (probs[t, order[t]].sum() if top_k > 1 else 1.0)
                if filled[e] >= slots:
                    dropped += 1
                    continue
                filled[e] += 1
                h = x[row] @ w["w1"][e] + w["b1"][e]
                h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
                out[row] += gate * (h @ w["w2"][e])
    return out, dropped


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25, 4.0])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_moe_equals_a_token_by_token_loop(four_devices, top_k, capacity_factor, groups):
    w = weights(dtype=tf.float64)
    x = tf.constant(np.random.default_rng(1).standard_normal((32, 8)), tf.float64)
    got, routing = experts.moe(x, w, top_k, capacity_factor, groups)
    want, dropped = loop_moe(x, w, top_k, capacity_factor, groups)
    # float64 throughout, but tf.nn.gelu in float64 differs from math.erf's GELU by ~1e-9 (measured), not 1e-15
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-7, atol=1e-8)
    assert routing.dropped == dropped
    assert routing.capacity == experts.capacity(32 // groups, 8, top_k, capacity_factor)
    assert int(tf.reduce_sum(routing.wanted)) == 32 * top_k
    assert float(tf.reduce_max(routing.kept)) <= routing.capacity


def test_the_auxiliary_loss_is_one_when_the_load_is_even_and_grows_when_it_is_not(four_devices):
    even = tf.constant(np.tile(np.eye(4) * 5.0, (4, 1)), tf.float32)  # 16 tokens, 4 each to 4 experts
    assert float(experts.route(even).aux_loss) == pytest.approx(1.0, abs=0.02)  # E · Σ (1/E)(≈1/E)
    skewed = tf.constant(np.tile([[5.0, 0, 0, 0]], (16, 1)), tf.float32)  # every token to expert 0
    assert float(experts.route(skewed).aux_loss) > 3.5  # → E as the router grows sure


def test_the_router_z_loss_is_the_mean_squared_log_sum_of_exp(four_devices):
    """ST-MoE's z-loss (Zoph et al. 2022, equation 5): (1/B) Σᵢ (log Σⱼ exp xᵢⱼ)², B tokens, x the router's logits;
    the same over any groups, as it is a mean over tokens."""
    logits = np.random.default_rng(6).standard_normal((32, 8)) * 3
    want = np.mean([np.log(np.sum(np.exp(row))) ** 2 for row in logits])
    for groups in (1, 4):
        got = float(experts.route(tf.constant(logits, tf.float64), groups=groups).z_loss)
        assert got == pytest.approx(want, rel=1e-12)
    assert float(experts.route(tf.constant(logits / 10, tf.float64)).z_loss) < want  # smaller logits, smaller loss


def test_the_coefficients_are_the_papers():
    """Switch Transformer (Fedus et al. 2021, §2.2, equation 4): "we use an α = 10⁻²" for the auxiliary loss;
    ST-MoE (Zoph et al. 2022, §3.3, equation 6): the z-loss weighted by c_z = 0.001, "based on the best model
    quality" in a sweep."""
    assert experts.AUX_COEFFICIENT == 1e-2 and experts.Z_COEFFICIENT == 1e-3


@pytest.mark.parametrize(("n", "degree"), [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)])
def test_expert_parallelism_inside_data_parallelism_equals_one_device(four_devices, n, degree):
    """N devices as N/e replicas of e: outputs and every gradient equal one device's (the router's losses
    included); each expert's gradient is summed over the replicas that hold it, the router's over all N."""
    w = weights()
    x = tf.constant(np.random.default_rng(2).standard_normal((32, 8)), tf.float32)
    upstream = tf.constant(np.random.default_rng(3).standard_normal((32, 8)), tf.float32)
    sources = [x, *w.values()]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        want, routing = experts.moe(x, w, 2, 1.0, groups=n)
        loss = (tf.reduce_sum(want * upstream) + experts.AUX_COEFFICIENT * routing.aux_loss
                + experts.Z_COEFFICIENT * routing.z_loss)
    wanted = dict(zip(["x", *w], tape.gradient(loss, sources), strict=True))
    run = experts.expert_data_parallel(x, w, four_devices[:n], degree, upstream, top_k=2, capacity_factor=1.0)
    np.testing.assert_allclose(run.output.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    assert run.gradients.keys() == wanted.keys()
    for name, g in run.gradients.items():
        np.testing.assert_allclose(g.numpy(), wanted[name].numpy(), rtol=1e-5, atol=2e-6)
    replicas, local = n // degree, 8 // degree
    assert run.replicas == [list(range(r * degree, (r + 1) * degree)) for r in range(replicas)]
    for d in range(n):  # every copy of one expert ends with the same gradient, on its own device
        shard = slice(d % degree * local, (d % degree + 1) * local)
        for name in experts.EXPERT_WEIGHTS:
            np.testing.assert_allclose(run.reduced[d][name].numpy(), wanted[name][shard].numpy(), rtol=1e-5, atol=2e-6)
            assert run.reduced[d][name].device.endswith(f"CPU:{d}")
        np.testing.assert_allclose(run.reduced[d]["router"].numpy(), wanted["router"].numpy(), rtol=1e-5, atol=2e-6)
    if replicas > 1:  # one replica's tokens alone give another gradient: the sum over replicas is needed
        assert np.max(np.abs(run.local[0]["w1"].numpy() - wanted["w1"][:local].numpy())) > 1e-3
    expert_bytes = local * (8 * 16 + 16 + 16 * 8) * 4  # w1, b1, w2 of E/e experts, float32
    assert run.reduced_bytes["experts"] == [2 * (replicas - 1) * expert_bytes // replicas] * n
    assert run.reduced_bytes["dense"] == [2 * (n - 1) * 8 * 8 * 4 // n] * n  # the router [8, 8], over all N


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_expert_parallel_equals_one_device(four_devices, n, top_k):
    w = weights()
    x = tf.constant(np.random.default_rng(2).standard_normal((32, 8)), tf.float32)
    upstream = tf.constant(np.random.default_rng(3).standard_normal((32, 8)), tf.float32)
    sources = [x, *w.values()]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(sources)
        want, routing = experts.moe(x, w, top_k, 1.0, groups=n)
        want_loss = tf.reduce_sum(want * upstream) + routing.aux_loss
        run = experts.expert_parallel(x, w, four_devices[:n], top_k, 1.0)
        got_loss = tf.reduce_sum(run.whole_output() * upstream) + tf.add_n([r.aux_loss for r in run.routings]) / n
    np.testing.assert_allclose(run.whole_output().numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    for g, h in zip(tape.gradient(got_loss, sources), tape.gradient(want_loss, sources), strict=True):
        np.testing.assert_allclose(g.numpy(), h.numpy(), rtol=1e-5, atol=2e-6)
    for d in range(n):  # every result on its own device
        assert run.outputs[d].device.endswith(f"CPU:{d}")


def test_tokens_and_bytes_sent(four_devices):
    w = weights()
    x = tf.constant(np.random.default_rng(4).standard_normal((32, 8)), tf.float32)
    run = experts.expert_parallel(x, w, four_devices, top_k=2, capacity_factor=1.25)
    slots = run.routings[0].capacity
    assert slots == experts.capacity(8, 8, 2, 1.25) == 3
    for i, routing in enumerate(run.routings):  # device j holds experts 2j and 2j+1
        kept = routing.kept.numpy()[0]
        assert run.tokens[i] == [int(kept[2 * j] + kept[2 * j + 1]) for j in range(4)]
    formula = experts.formula_bytes(4, experts=8, capacity=slots, hidden=8)
    assert run.dispatch.bytes_sent == run.combine.bytes_sent == [formula] * 4 == [3 * 2 * 3 * 8 * 4] * 4
    zero_first = tf.concat([tf.zeros([1, 8]), x[1:]], axis=0)  # a token of zeros still takes its slots
    run = experts.expert_parallel(zero_first, w, four_devices, top_k=2, capacity_factor=1.25)
    kept = run.routings[0].kept.numpy()[0]
    assert run.tokens[0] == [int(kept[2 * j] + kept[2 * j + 1]) for j in range(4)]


def test_bad_inputs_are_named(four_devices):
    w = weights()
    x = tf.ones([30, 8])
    with pytest.raises(ValueError, match="30 tokens don't cut into 4 equal groups"):
        experts.expert_parallel(x, w, four_devices)
    with pytest.raises(ValueError, match="8 experts don't spread evenly over 3 devices"):
        experts.expert_parallel(tf.ones([30, 8]), w, four_devices[:3])
    with pytest.raises(ValueError, match="top_k=3"):
        experts.route(tf.ones([8, 8]), top_k=3)
    with pytest.raises(ValueError, match="capacity_factor=0"):
        experts.route(tf.ones([8, 8]), capacity_factor=0)
    with pytest.raises(ValueError, match="groups=3"):
        experts.route(tf.ones([8, 8]), groups=3)
    with pytest.raises(ValueError, match=r"expert_degree=3 must divide the number of devices \(4\)"):
        experts.expert_data_parallel(tf.ones([32, 8]), w, four_devices, 3, tf.ones([32, 8]))
    with pytest.raises(ValueError, match="expert_degree=3 must divide the 6 experts|expert_degree=4 must divide the 6"):
        experts.expert_data_parallel(tf.ones([32, 8]), weights(experts_=6), four_devices, 4, tf.ones([32, 8]))
    with pytest.raises(ValueError, match="got 2 devices' weights for 4 devices"):
        experts.expert_parallel(tf.ones([32, 8]), [w, w], four_devices)


@pytest.mark.processes
def test_eight_devices_in_a_fresh_process():
    out = run_fresh("""
        import numpy as np
        import tensorflow as tf
        from mgpu_edu import experts, setup_devices
        layout = setup_devices(8, verbose=False)
        rng = np.random.default_rng(5)
        w = {"router": tf.constant(rng.standard_normal((4, 8)), tf.float64),
             "w1": tf.constant(rng.standard_normal((8, 4, 6)), tf.float64),
             "b1": tf.constant(rng.standard_normal((8, 6)), tf.float64),
             "w2": tf.constant(rng.standard_normal((8, 6, 4)), tf.float64)}
        x = tf.constant(rng.standard_normal((48, 4)), tf.float64)
        up = tf.constant(rng.standard_normal((48, 4)), tf.float64)
        worst = 0.0
        for n in (8,):
            for k in (1, 2):
                want, _ = experts.moe(x, w, k, 1.5, groups=n)
                got = experts.expert_parallel(x, w, list(layout)[:n], k, 1.5).whole_output()
                worst = max(worst, float(np.max(np.abs(got.numpy() - want.numpy()))))
        sources = [x, *w.values()]
        with tf.GradientTape() as tape:
            tape.watch(sources)
            want, routing = experts.moe(x, w, 2, 1.5, groups=8)
            loss = tf.reduce_sum(want * up) + 1e-2 * routing.aux_loss + 1e-3 * routing.z_loss
        wanted = dict(zip(["x", *w], tape.gradient(loss, sources)))
        for degree in (2, 4, 8):  # 4, 2 and 1 replicas
            run = experts.expert_data_parallel(x, w, list(layout), degree, up, top_k=2, capacity_factor=1.5)
            worst = max(worst, float(np.max(np.abs(run.output.numpy() - want.numpy()))),
                        *(float(np.max(np.abs(g.numpy() - wanted[name].numpy()))) for name, g in run.gradients.items()))
        result = worst
    """)
    assert out["result"] < 1e-9
