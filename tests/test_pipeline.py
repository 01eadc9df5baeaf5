"""Pipeline schedules (pure arithmetic), the layer split and pipelined step, and tensor-parallel Dense."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import models, pipeline
from mgpu_edu.parallelism.pipeline import (
    bubble_fraction,
    gpipe_schedule,
    idle_fraction,
    in_flight_peaks,
    one_f_one_b_schedule,
    stage_order,
)


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 16, 32])
def test_gpipe_schedule_invariants(p, m):
    events = gpipe_schedule(p, m)
    assert len(events) == 2 * p * m
    assert {(e.stage, e.micro_batch, e.phase) for e in events} == {
        (s, i, ph) for s in range(p) for i in range(m) for ph in "FB"}
    assert all(e.end - e.start == 1 for e in events)
    at = {(e.stage, e.micro_batch, e.phase): e for e in events}
    for s in range(p):  # one event at a time per stage
        mine = sorted((e.start, e.end) for e in events if e.stage == s)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:], strict=False))
    for i in range(m):
        for s in range(1, p):  # forward after the previous stage's forward
            assert at[(s, i, "F")].start >= at[(s - 1, i, "F")].end
        for s in range(p - 1):  # backward in reverse stage order
            assert at[(s, i, "B")].start >= at[(s + 1, i, "B")].end
    last_forward = max(e.end for e in events if e.phase == "F")
    assert min(e.start for e in events if e.phase == "B") >= last_forward  # all forwards, then all backwards
    assert max(e.end for e in events) == 2 * (m + p - 1)
    assert idle_fraction(events) == pytest.approx(bubble_fraction(p, m))
    assert bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("m", range(1, 33))
def test_one_f_one_b_schedule_invariants(p, m):
    events = one_f_one_b_schedule(p, m)
    assert len(events) == 2 * p * m  # each (stage, micro-batch, phase) exactly once
    assert {(e.stage, e.micro_batch, e.phase) for e in events} == {
        (s, i, ph) for s in range(p) for i in range(m) for ph in "FB"}
    assert all(e.end - e.start == 1 for e in events)
    at = {(e.stage, e.micro_batch, e.phase): e for e in events}
    for s in range(p):  # one event at a time per stage, in the stage's 1F1B order
        mine = sorted((e for e in events if e.stage == s), key=lambda e: e.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False))
        assert [(e.phase, e.micro_batch) for e in mine] == stage_order("1f1b", s, p, m)
    for i in range(m):  # dependencies: forward after the previous stage's, backward after the next stage's
        for s in range(1, p):
            assert at[(s, i, "F")].start >= at[(s - 1, i, "F")].end
        for s in range(p):
            assert at[(s, i, "B")].start >= at[(s, i, "F")].end
            if s < p - 1:
                assert at[(s, i, "B")].start >= at[(s + 1, i, "B")].end
    assert max(e.end for e in events) == 2 * (m + p - 1)  # the same makespan, so the same bubble, as GPipe
    assert idle_fraction(events) == pytest.approx(bubble_fraction(p, m))
    assert in_flight_peaks(events) == [min(p - s, m) for s in range(p)]  # at most P − s in flight
    assert in_flight_peaks(gpipe_schedule(p, m)) == [m] * p  # GPipe keeps all M


def test_stage_order_and_in_flight_examples():
    assert stage_order("gpipe", 1, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert stage_order("1f1b", 1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    with pytest.raises(ValueError, match="schedule='zb'"):
        stage_order("zb", 0, 2, 2)
    with pytest.raises(ValueError, match="stage=2"):
        stage_order("1f1b", 2, 2, 2)


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, None])
def test_bad_arguments(bad):
    with pytest.raises(ValueError, match="whole number of at least 1"):
        gpipe_schedule(bad, 4)
    with pytest.raises(ValueError, match="whole number of at least 1"):
        gpipe_schedule(4, bad)
    with pytest.raises(ValueError, match="whole number of at least 1"):
        bubble_fraction(bad, 4)
    with pytest.raises(ValueError, match="whole number of at least 1"):
        one_f_one_b_schedule(4, bad)


def test_micro_batches_for_bubble():
    assert pipeline.micro_batches_for_bubble(4, 0.10) == 28
    assert bubble_fraction(4, 28) < 0.10 <= bubble_fraction(4, 27)
    with pytest.raises(ValueError, match="target=1.5"):
        pipeline.micro_batches_for_bubble(4, 1.5)


def _data(batch=24):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(size=(batch, 16)), tf.float32), tf.constant(rng.integers(0, 4, batch), tf.int32)


def _reference(model, loss_fn, x, y):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = x
        for block in model.blocks:
            logits = block(logits, training=True)
        loss = tf.reduce_mean(loss_fn(y, logits))
    return float(loss), tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("micro_batches", [1, 3, 5])
def test_pipelined_gradients_equal_unpipelined(four_devices, micro_batches):
    model = pipeline.StagedModel([16, 32, 32, 32, 4], four_devices, classes=4)
    assert [d.split("device:")[-1] for _, d in model.variable_devices()[::2]] == \
        [d.split("device:")[-1] for d in four_devices]
    loss_fn = models.per_example_loss()
    x, y = _data()
    loss, reference = _reference(model, loss_fn, x, y)
    run = pipeline.run_pipeline(model, loss_fn, x, y, micro_batches)
    assert run.loss == pytest.approx(loss, rel=1e-5)
    for g, r in zip(run.grads, reference, strict=True):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=1e-6)
    assert len(run.events) == 2 * 4 * micro_batches
    if micro_batches == 1:  # naive layer split: never two stages at once
        spans = sorted((e.start, e.end) for e in run.events)
        assert all(a[1] <= b[0] + 1e-4 for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize("micro_batches", [2, 6])
def test_one_f_one_b_run_equals_gpipe_and_holds_fewer_micro_batches(four_devices, micro_batches):
    model = pipeline.StagedModel([16, 32, 32, 32, 4], four_devices, classes=4)
    loss_fn = models.per_example_loss()
    x, y = _data()
    loss, reference = _reference(model, loss_fn, x, y)
    gpipe = pipeline.run_pipeline(model, loss_fn, x, y, micro_batches)
    ofob = pipeline.run_pipeline(model, loss_fn, x, y, micro_batches, schedule="1f1b")
    assert ofob.loss == pytest.approx(loss, rel=1e-5)
    for a, b, r in zip(ofob.grads, gpipe.grads, reference, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(a.numpy(), r.numpy(), rtol=1e-4, atol=1e-6)
    assert gpipe.peak_in_flight == [micro_batches] * 4
    assert ofob.peak_in_flight == [min(4 - s, micro_batches) for s in range(4)]
    for s in range(4):  # each stage really ran in its 1F1B order
        mine = sorted((e for e in ofob.events if e.stage == s), key=lambda e: e.start)
        assert [(e.phase, e.micro_batch) for e in mine] == stage_order("1f1b", s, 4, micro_batches)
    with pytest.raises(ValueError, match="schedule='pipedream'"):
        pipeline.run_pipeline(model, loss_fn, x, y, 2, schedule="pipedream")


def test_staged_model_errors(four_devices):
    with pytest.raises(ValueError, match="4 stages need at least 4 layers"):
        pipeline.StagedModel([16, 8, 4], four_devices, classes=4)
    with pytest.raises(ValueError, match="classes=3"):
        pipeline.StagedModel([16, 8, 8, 8, 4], four_devices, classes=3)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_tensor_parallel_dense_equals_dense(four_devices, n):
    import tensorflow as tf

    rng = np.random.default_rng(n)
    x = tf.constant(rng.normal(size=(5, 10)), tf.float32)
    kernel = tf.constant(rng.normal(size=(10, 7)), tf.float32)
    bias = tf.constant(rng.normal(size=7), tf.float32)
    expected = (x @ kernel + bias).numpy()
    np.testing.assert_allclose(pipeline.column_parallel_dense(x, kernel, bias, four_devices[:n]).numpy(), expected,
                               rtol=1e-5, atol=1e-5)
    for out, device in zip(pipeline.row_parallel_dense(x, kernel, bias, four_devices[:n]), four_devices, strict=False):
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
        assert out.device.endswith(device.split("device:")[-1])


def test_parallelism_costs_label_per_device_and_total_bytes():
    rows = {r["strategy"]: r for r in pipeline.parallelism_costs([64, 128, 10], batch=32, devices=2, optimizer="sgd")}
    weights = (64 * 128 + 128 + 128 * 10 + 10) * 4
    acts = 32 * (64 + 128 + 10) * 4  # the input and every layer's output, kept for the backward pass
    # data: each device sends 2(N−1)/N of the gradients; both together twice that
    assert rows["data"]["bytes_per_device"] == pytest.approx(2 * 1 / 2 * weights)
    assert rows["data"]["bytes_total"] == pytest.approx(2 * rows["data"]["bytes_per_device"])
    # one boundary: device 0 sends the activation forward, device 1 its gradient back
    assert rows["layer split"]["bytes_per_device"] == 32 * 128 * 4
    assert rows["layer split"]["bytes_total"] == 2 * 32 * 128 * 4
    # memory now counts gradients (SGD keeps no other state) and every device keeps all activations in tensor
    assert rows["data"]["memory_per_device"] == pytest.approx(2 * weights + acts / 2)
    assert rows["tensor"]["memory_per_device"] == pytest.approx(2 * weights / 2 + acts)
    assert rows["layer split"]["idle_fraction"] == 0.5 and rows["data"]["idle_fraction"] == 0
    adam = {r["strategy"]: r for r in pipeline.parallelism_costs([64, 128, 10], batch=32, devices=2)}
    assert adam["data"]["memory"] == {"weights": weights, "gradients": weights, "optimizer": 2 * weights,
                                      "activations": acts / 2}


def test_one_f_one_b_row_keeps_min_p_minus_s_of_m_micro_batches():
    """parallelism_costs' 1F1B row: stage s keeps min(P − s, M)/M of its activations, GPipe all of them; the
    same bytes and bubble. The 1F1B share is what lesson 07 measures (peak_in_flight = P − s)."""
    widths, batch, p, m = [64, 512, 512, 512, 10], 512, 4, 8
    rows = {r["strategy"]: r for r in pipeline.parallelism_costs(widths, batch, devices=p, micro_batches=m)}
    gpipe, ours = rows["GPipe (M=8)"], rows["1F1B (M=8)"]
    stages = pipeline.stage_memory(widths, batch, p)
    expected = max(st["total"] - st["activations"] * (1 - min(p - s, m) / m) for s, st in enumerate(stages))
    assert ours["memory_per_device"] == pytest.approx(expected)
    assert ours["memory_per_device"] < gpipe["memory_per_device"]
    assert (ours["bytes_per_device"], ours["bytes_total"], ours["idle_fraction"]) == (
        gpipe["bytes_per_device"], gpipe["bytes_total"], gpipe["idle_fraction"])
    one = {r["strategy"]: r for r in pipeline.parallelism_costs(widths, batch, devices=p, micro_batches=1)}
    assert one["1F1B (M=1)"]["memory_per_device"] == one["GPipe (M=1)"]["memory_per_device"]  # min(P − s, 1) = 1


def test_stage_memory_adds_up_to_the_whole_model():
    stages = pipeline.stage_memory([64, 512, 512, 512, 10], 512, 4)
    weights = (64 * 512 + 512 + 2 * (512 * 512 + 512) + 512 * 10 + 10) * 4
    assert sum(m["weights"] for m in stages) == weights
    assert all(m["optimizer"] == 2 * m["weights"] and m["gradients"] == m["weights"] for m in stages)
    # each stage keeps its input (for the kernel gradient) and its layer's output (for ReLU's)
    assert [m["activations"] for m in stages] == [512 * (i + o) * 4 for i, o in [(64, 512), (512, 512), (512, 512),
                                                                             (512, 10)]]


def test_traffic_crossover_is_where_the_layer_split_catches_up():
    widths = [64, 512, 512, 512, 10]
    for measure in ("bytes_per_device", "bytes_total"):
        b = pipeline.traffic_crossover(widths, 4, measure)
        before = {r["strategy"]: r[measure] for r in pipeline.parallelism_costs(widths, b - 1, 4)}
        at = {r["strategy"]: r[measure] for r in pipeline.parallelism_costs(widths, b, 4)}
        assert before["layer split"] < before["data"] and at["layer split"] >= at["data"]
    assert pipeline.traffic_crossover(widths, 4) == 826  # 2 × 512 × 4 bytes × B ≥ 1.5 × the gradient bytes
    with pytest.raises(ValueError, match="measure='bytes'"):
        pipeline.traffic_crossover(widths, 4, "bytes")
    with pytest.raises(ValueError, match="widths="):
        pipeline.parallelism_costs([64], 16, 2)


def test_a_failing_stage_raises_instead_of_hanging(four_devices):
    import tensorflow as tf

    model = pipeline.StagedModel([16, 8, 8, 8, 4], four_devices, classes=4)

    def broken_loss(y, logits):
        raise RuntimeError("this loss is broken on purpose")

    x, y = tf.zeros((6, 16)), tf.zeros(6, tf.int32)
    with pytest.raises(RuntimeError, match="broken on purpose"):
        pipeline.run_pipeline(model, broken_loss, x, y, micro_batches=3)


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 4, 2), (4, 16, 3), (8, 32, 4), (8, 16, 3)])
def test_the_interleaved_schedule_has_the_bubble_and_the_chunks_in_flight_the_planner_counts(p, m, v):
    """Megatron-LM's interleaved 1F1B, built slot by slot: its bubble is (P − 1)/(V·M) of the ideal 2·V·M chunk
    slots (pipeline.bubble_ratio, as Narayanan et al. and the Llama 3 paper write it), and each stage's most chunks
    in flight are V × memory.in_flight (2·(P − s − 1) + (V − 1)·P + 1, or every chunk when M = P), the count
    behind Korthikanti et al.'s factor (1 + (P − 1)/(P·V)) for the first stage."""
    from mgpu_edu import memory

    events = pipeline.interleaved_schedule(p, m, v)
    assert len(events) == 2 * p * v * m and {e.chunk for e in events} == set(range(v))
    slots = max(e.end for e in events)
    assert (slots - 2 * v * m) / (2 * v * m) == pipeline.bubble_ratio(p, m, v)
    assert pipeline.in_flight_peaks(events) == [v * memory.in_flight(p, s, m, v) for s in range(p)]
    if m > p:
        assert pipeline.in_flight_peaks(events)[0] == pytest.approx(p * v * (1 + (p - 1) / (p * v)))
    for e in events:  # each chunk's backward after its forward, on the same stage
        forward = next(f for f in events if (f.stage, f.chunk, f.micro_batch, f.phase) == (e.stage, e.chunk,
                                                                                             e.micro_batch, "F"))
        assert e.phase == "F" or forward.end <= e.start


def test_the_interleaved_schedule_refuses_one_chunk_or_an_uneven_batch():
    with pytest.raises(ValueError, match="for one chunk, use one_f_one_b_schedule"):
        pipeline.interleaved_schedule(4, 8, 1)
    with pytest.raises(ValueError, match="micro_batches=6"):
        pipeline.interleaved_schedule(4, 6, 2)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 4, 8, 16])
def test_zero_bubble_against_the_papers_table(stages, micro_batches):
    """Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Table 2, with T_F = T_B = T_W = 1: 1F1B's bubble
    (P − 1)(T_F + T_B + T_W), ZB-H1's (P − 1)(T_F + T_B − T_W), both with a peak of P micro-batches' activations
    (P·M_B): 1F1B keeps P − s on stage s until its backward pass, ZB-H1 P on every stage until their W ("all
    workers maintain the same number of in-flight microbatches"). The table assumes M ≥ P; with fewer, ZB-H1 still
    does no worse."""
    p, m = stages, micro_batches
    whole, split = pipeline.zero_bubble_schedule(p, m, split=False), pipeline.zero_bubble_schedule(p, m)
    for events in (whole, split):
        assert sorted((e.stage, e.micro_batch, e.phase) for e in events) == sorted(
            (s, i, phase) for s in range(p) for i in range(m) for phase in "FBW")
        for s in range(p):  # one event at a time per stage
            slots = sorted(e.start for e in events if e.stage == s)
            assert len(slots) == len(set(slots)) == 3 * m
        done = {(e.stage, e.micro_batch, e.phase): e.end for e in events}
        for e in events:  # every event after what it needs
            needs = {"F": [(e.stage - 1, e.micro_batch, "F")] if e.stage else [],
                     "B": [(e.stage, e.micro_batch, "F")] + ([(e.stage + 1, e.micro_batch, "B")]
                                                             if e.stage < p - 1 else []),
                     "W": [(e.stage, e.micro_batch, "B")]}[e.phase]
            assert all(done[n] <= e.start for n in needs)
    for e in whole:  # a whole backward: W right after its B, and the stage before waits for both
        if e.phase == "B" and e.stage > 0:
            assert done_of(whole, e.stage, e.micro_batch, "W") <= start_of(whole, e.stage - 1, e.micro_batch, "B")
    assert pipeline.in_flight_peaks(whole, until="W") == [min(p - s, m) for s in range(p)]
    assert pipeline.in_flight_peaks(split, until="W") == [min(p, m)] * p
    makespan = {name: max(e.end for e in events) for name, events in (("1f1b", whole), ("zb-h1", split))}
    assert makespan["1f1b"] == 3 * m + 3 * (p - 1)
    assert makespan["zb-h1"] <= makespan["1f1b"]
    if m >= p:
        assert makespan["zb-h1"] == 3 * m + (p - 1)
        for name, ratio in (("1f1b", pipeline.zero_bubble_ratio(p, m, split=False)),
                            ("zb-h1", pipeline.zero_bubble_ratio(p, m))):
            assert (makespan[name] - 3 * m) / (3 * m) == pytest.approx(ratio)


def done_of(events, stage, micro_batch, phase):
    return next(e.end for e in events if (e.stage, e.micro_batch, e.phase) == (stage, micro_batch, phase))


def start_of(events, stage, micro_batch, phase):
    return next(e.start for e in events if (e.stage, e.micro_batch, e.phase) == (stage, micro_batch, phase))


def test_the_zero_bubble_formula_is_refused_where_the_paper_does_not_give_it():
    with pytest.raises(ValueError, match=r"zero_bubble_ratio\(stages=8, micro_batches=1.*at least as many micro"):
        pipeline.zero_bubble_ratio(8, 1)
    with pytest.raises(ValueError, match="weight_grad=2.5"):
        pipeline.zero_bubble_ratio(4, 8, weight_grad=2.5)
    assert pipeline.zero_bubble_ratio(8, 1, split=False) == 7.0  # 1F1B's (P − 1)/M holds for any M
