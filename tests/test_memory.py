"""Memory per device: the ZeRO paper's figures, Keras's own optimizer and gradient sizes, activation
formulas, and a whole layout."""

from __future__ import annotations

import numpy as np
import pytest

from mgpu_edu import memory, models


def test_zero_paper_example():
    """7.5 B parameters, 64 GPUs, mixed-precision Adam (K = 12): 120, 31.4, 16.6 and 1.9 GB (Rajbhandari et al.)."""
    totals = [memory.model_states(7_500_000_000, 64, stage).total / 1e9 for stage in memory.ZERO_STAGES]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize(("optimizer", "state"), [("adam", 8), ("momentum", 4), ("sgd", 0)])
def test_oracle_fp32_state_is_what_keras_allocates(four_devices, optimizer, state):
    """Bytes per weight of optimizer state, and of gradients, as Keras really allocates them (float32)."""
    import keras
    import tensorflow as tf

    model = models.mlp(64, 10, hidden=(32,))
    params = model.count_params()
    opt = {"adam": keras.optimizers.Adam(), "momentum": keras.optimizers.SGD(momentum=0.9),
           "sgd": keras.optimizers.SGD()}[optimizer]
    opt.build(model.trainable_variables)
    slots = [v for v in opt.variables if v.shape != ()]
    assert sum(int(np.prod(v.shape)) * 4 for v in slots) == memory.model_states(params, optimizer=optimizer,
                                                                                 precision="fp32").optimizer
    assert state == memory.OPTIMIZER_STATE["fp32"][optimizer]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.zeros((2, 64))))
    grads = tape.gradient(loss, model.trainable_variables)
    assert sum(g.numpy().nbytes for g in grads) == memory.model_states(params, precision="fp32").grads


def test_oracle_keras_mixed_precision_keeps_the_same_16_bytes_split_differently(four_devices):
    """Keras's mixed policies keep float32 weights: 4 + 4 + 8 bytes per weight with Adam, the same total as the
    ZeRO paper's 2 + 2 + 12."""
    import keras

    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = models.mlp(64, 10, hidden=(32,))
        opt = keras.optimizers.Adam()
        opt.build(model.trainable_variables)
        weights = sum(v.numpy().nbytes for v in model.trainable_variables)
        state = sum(v.numpy().nbytes for v in opt.variables if v.shape != ())
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    params = model.count_params()
    assert (weights, state) == (4 * params, 8 * params)
    assert weights + 4 * params + state == memory.model_states(params, precision="mixed").total


def test_layer_activations_count_the_input_and_every_output(four_devices):
    mlp = memory.layer_activations(models.mlp(64, 10, hidden=(32,)), 16)
    assert mlp == [("input", 16 * 64 * 4), ("hidden0", 16 * 32 * 4), ("logits", 16 * 10 * 4)]
    cnn = dict(memory.layer_activations(models.small_cnn((8, 8, 1), 10), 2))
    assert "flatten" not in cnn  # a reshape keeps nothing new
    assert cnn["input"] == 2 * 64 * 4 and sum(cnn.values()) == 2 * 4 * (64 + 8 * 8 * 32 + 4 * 4 * 32 + 64 + 10)


def test_transformer_activations_follow_korthikanti():
    s, b, h, a = 2048, 4, 8192, 64
    base = memory.transformer_activations(s, b, h, a)
    assert base == s * b * h * (34 + 5 * a * s / h)
    t = 8
    assert memory.transformer_activations(s, b, h, a, t) == s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert memory.transformer_activations(s, b, h, a, t, sequence_parallel=True) == pytest.approx(
        base / t)  # sequence parallelism shards the rest too
    assert memory.transformer_activations(s, b, h, a, t, True, "selective") == 34 * s * b * h / t
    assert memory.transformer_activations(s, b, h, a, recompute="full") == 2 * s * b * h
    with pytest.raises(ValueError, match="recompute='some'"):
        memory.transformer_activations(s, b, h, a, recompute="some")


def test_float32_activations_double_the_values_not_the_dropout_masks():
    """Korthikanti's 34 = 32 bytes of 16-bit values + 2 one-byte dropout masks (and 5 = 4 + 1 for the scores)."""
    s, b, h, a, t = 2048, 2, 4096, 32, 4
    assert memory.transformer_activations(s, b, h, a, bytes_per_value=4) == s * b * h * 66 + 9 * a * s * s * b
    assert memory.transformer_activations(s, b, h, a, t, bytes_per_value=4) == pytest.approx(
        s * b * h * (18 + 48 / t) + 9 * a * s * s * b / t)
    assert memory.transformer_activations(s, b, h, a, recompute="full", bytes_per_value=4) == 4 * s * b * h
    seven_b = memory.TRANSFORMERS["7B transformer (32 layers, hidden 4096)"]
    mixed = memory.transformer_memory(seven_b, 1)
    fp32 = memory.transformer_memory(seven_b, 1, precision="fp32")
    assert fp32.activations == 32 * memory.transformer_activations(2048, 1, 4096, 32, bytes_per_value=4)
    assert 1.8 < fp32.activations / mixed.activations < 2  # the masks stay 1 byte


def test_without_dropout_no_masks_and_no_dropout_output():
    s, b, h, a, t = 2048, 2, 4096, 32, 4
    assert memory.transformer_activations(s, b, h, a, dropout=False) == s * b * h * 32 + 2 * a * s * s * b
    assert memory.transformer_activations(s, b, h, a, t, bytes_per_value=4, dropout=False) == pytest.approx(
        s * b * h * (16 + 48 / t) + 4 * a * s * s * b / t)
    assert memory.transformer_activations(s, b, h, a, t, True, bytes_per_value=4, dropout=False) == pytest.approx(
        (s * b * h * 64 + 4 * a * s * s * b) / t)


def test_activations_of_a_whole_model(four_devices):
    seven_b = memory.TRANSFORMERS["7B transformer (32 layers, hidden 4096)"]
    assert memory.activations(seven_b, 2, 2, tensor_parallel=8, recompute="selective") == (
        32 * memory.transformer_activations(2048, 2, 4096, 32, 8, recompute="selective"))
    mlp = models.mlp(64, 10, hidden=(32,))
    assert memory.activations(mlp, 16) == 16 * 4 * (64 + 32 + 10)
    with pytest.raises(ValueError, match="apply to transformers"):
        memory.activations(mlp, 16, tensor_parallel=2)


def test_model_states_count_trainable_weights(four_devices):
    import keras

    resnet = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    assert resnet.count_params() - memory.trainable_params(resnet) == 53_120  # BatchNormalization's statistics
    assert memory.model_states(7.5e9).total == memory.model_states(7_500_000_000).total  # 7.5e9 as written


def test_fits_leaves_a_tenth_of_the_card_spare():
    h100 = memory.GPU_MEMORY_MIB["H100 80GB"] * 2**20
    assert memory.fits(0.9 * h100, "H100 80GB") and not memory.fits(0.9 * h100 + 1, "H100 80GB")
    with pytest.raises(ValueError, match="gpu='V100'"):
        memory.fits(1, "V100")


def test_per_device_layout():
    seven_b = memory.per_device(7_000_000_000, 0, data_parallel=8, zero_stage=3)
    assert seven_b.total == pytest.approx(7e9 * 16 / 8)
    split = memory.per_device(8_000_000_000, 1e9, data_parallel=2, tensor_parallel=2, pipeline_parallel=4,
                              accumulation=8)
    assert split.params == pytest.approx(2 * 8e9 / 8) and split.activations == 4e9  # 4 micro-batches in flight
    last = memory.per_device(8_000_000_000, 1e9, pipeline_parallel=4, accumulation=8, pipeline_stage=3)
    assert last.activations == 1e9  # the last stage keeps one
    assert memory.per_device(1000, 1e9, accumulation=8).activations == 1e9  # accumulation: one at a time


@pytest.mark.parametrize(("call", "message"), [
    (lambda: memory.model_states(100, zero_stage=4), "zero_stage=4"),
    (lambda: memory.model_states(100, precision="fp8"), "precision='fp8'"),
    (lambda: memory.model_states(100, optimizer="lion"), "optimizer='lion'"),
    (lambda: memory.model_states(0), "params=0"),
    (lambda: memory.per_device(100, -1), "activations=-1"),
    (lambda: memory.per_device(100, 0, pipeline_parallel=2, pipeline_stage=2), "pipeline_stage=2"),
    (lambda: memory.model_states(7.5e9 + 0.5), "params=7500000000.5"),
    (lambda: memory.transformer_activations(2048, 1, 4096, 32, tensor_parallel=3), "tensor_parallel=3 must divide"),
    (lambda: memory.transformer_activations(2048, 1, 4096, 32, bytes_per_value=1), "bytes_per_value=1"),
])
def test_bad_inputs_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.widgets
def test_memory_calculator_widget(four_devices):
    from mgpu_edu.display.widgets import MemoryCalculator

    model = models.mlp(64, 10, hidden=(64,))
    calculator = MemoryCalculator(course_model=model, devices=4, micro_batch=32)
    assert "mgpu-memory" in calculator.root._dom_classes and calculator.image.value[:4] == b"\x89PNG"
    assert calculator.tensor.disabled and calculator.pipeline.disabled  # not for a Keras model here
    states = memory.model_states(model.count_params(), 4, 2, precision="fp32")
    calculator.zero.value = 2
    [stage] = calculator.stages()
    assert (stage.params, stage.grads, stage.optimizer) == (states.params, states.grads, states.optimizer)
    fp32_activations = stage.activations
    calculator.precision.value = "mixed"  # Keras's mixed precision: float32 model states, 16-bit activations
    [stage] = calculator.stages()
    assert (stage.params, stage.grads, stage.optimizer) == (states.params, states.grads, states.optimizer)
    assert stage.activations == fp32_activations / 2
    calculator.preset.value = "7B transformer (32 layers, hidden 4096)"
    assert not calculator.tensor.disabled
    calculator.micro_batch.value, calculator.precision.value, calculator.pipeline.value = 1, "mixed", 4
    assert len(calculator.stages()) == 4 and "stage 0" not in calculator.info.value
    assert "GiB" in calculator.info.value and "H100 80GB" in calculator.info.value
    mixed = calculator.stages()[0].activations
    calculator.precision.value = "fp32"  # float32 activations: about twice the 16-bit ones
    assert 1.8 < calculator.stages()[0].activations / mixed < 2
    calculator.pipeline.value = 3  # 32 layers on 3 stages: 10, 11 and 11, the first stage also holds the embedding
    first, second, last = calculator.stages()
    model = memory.TRANSFORMERS["7B transformer (32 layers, hidden 4096)"]
    assert first.params == 4 * memory.stage_params(model, 1, 3, 0) and second.params < last.params  # fp32
    calculator.tensor.value = 3  # doesn't divide 32 heads: explained, no exception
    assert "tensor_parallel=3 must divide" in calculator.info.value
    with pytest.raises(ValueError, match="preset='GPT-5'"):
        MemoryCalculator(preset="GPT-5")


def test_memory_bars_read_in_the_unit_the_numbers_need():
    """A 110 KiB model's bars on a KiB axis (not a sliver on a GiB one); a 100 GiB one's in GiB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mgpu_edu import viz

    small = memory.model_states(4810, optimizer="adam", precision="fp32")
    for states, unit in ((small, "KiB"), (memory.model_states(7e9), "GiB")):
        fig, ax = plt.subplots()
        device = memory.DeviceMemory(states.params, states.grads, states.optimizer, 0)
        viz.draw_memory_bars([("device 0", device)], {"T4": memory.GPU_MEMORY_MIB["T4"] * 2**20}, ax)
        assert ax.get_ylabel() == f"{unit} per device"
        assert 1 <= ax.get_ylim()[1] < 1024  # the bars fill the axis
        texts = [t.get_text() for t in ax.texts]
        if unit == "KiB":  # the T4's line is far above a 110 KiB bar: named with its size, not drawn
            assert texts == ["off the scale: T4 (15.0 GiB)"] and not ax.get_lines()
        else:  # 7B's states (112 GB) tower over the T4's 15 GiB: its line is drawn, labelled inside the axes
            assert len(ax.get_lines()) == 1 and texts == ["T4 "]
        plt.close(fig)


def test_layer_activations_explains_a_model_it_cannot_count():
    import keras

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="has no symbolic inputs.*keras.Input"):
        memory.layer_activations(Subclassed(), 8)
