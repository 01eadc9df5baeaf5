"""Memory per device, as arithmetic: the weights, their gradients and the optimizer's state.

The accounting follows the ZeRO paper (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models"). Every parameter costs bytes for its value, its
gradient and the optimizer's state:

| precision | value | gradient | optimizer state (Adam / SGD with momentum / SGD) |
|---|---:|---:|---|
| ``"fp32"`` | 4 | 4 | 8 / 4 / 0 (Adam's two moments; the momentum) |
| ``"mixed"`` | 2 | 2 | 12 / 8 / 4 (an fp32 master copy of the weights, plus the above) |

Mixed-precision Adam keeps K = 12 bytes of optimizer state per parameter: 16 bytes in all.
ZeRO stage 1 shards the optimizer state over the data-parallel devices, stage 2 the gradients
too, stage 3 the values too. Activations come from the layers' shapes (:func:`layer_activations`) or, for transformer
layers, from Korthikanti et al. (:func:`transformer_activations`); :func:`per_device` puts a
data × tensor × pipeline layout together. Pure arithmetic: no TensorFlow, no GPU.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, real_number, whole_number

#: Bytes per parameter for (value, gradient) in each precision.
PRECISIONS: dict[str, tuple[int, int]] = {"fp32": (4, 4), "mixed": (2, 2)}
#: Bytes of optimizer state per parameter, in each precision (mixed adds an fp32 master copy).
OPTIMIZER_STATE: dict[str, dict[str, int]] = {
    "fp32": {"adam": 8, "momentum": 4, "sgd": 0},
    "mixed": {"adam": 12, "momentum": 8, "sgd": 4},
}
ZERO_STAGES = (0, 1, 2, 3)


@dataclasses.dataclass(frozen=True)
class ModelStates:
    """Bytes one device holds for the model's states: values, gradients, optimizer state, and their sum."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_states(params: float, data_parallel: int = 1, zero_stage: int = 0, optimizer: str = "adam",
                 precision: str = "mixed") -> ModelStates:
    """Bytes per device for ``params`` parameters, with ZeRO ``zero_stage`` over ``data_parallel`` devices.

    Stage 0 is plain data parallelism: every device holds everything. Stage 1 divides the
    optimizer state by ``data_parallel``, stage 2 the gradients too, stage 3 the values too.
    It reproduces the ZeRO paper's example, 7.5 B parameters on 64 GPUs with mixed-precision
    Adam: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB for stages 0 to 3.

    Example:
        >>> [round(model_states(7_500_000_000, 64, stage).total / 1e9, 1) for stage in (0, 1, 2, 3)]
        [120.0, 31.4, 16.6, 1.9]
    """
    params = whole_number("params", params, float_ok=True)
    whole_number("data_parallel", data_parallel, example=8)
    whole_number("zero_stage", zero_stage, minimum=0, maximum=3, hint="ZeRO has stages 0 (none), 1, 2 and 3.")
    one_of("precision", precision, PRECISIONS, hint="'mixed' keeps 16-bit values and gradients.")
    one_of("optimizer", optimizer, OPTIMIZER_STATE[precision], hint="'momentum' is SGD with momentum.")
    value, grad = PRECISIONS[precision]
    state = OPTIMIZER_STATE[precision][optimizer]
    n = data_parallel
    return ModelStates(params * value / (n if zero_stage >= 3 else 1),
                       params * grad / (n if zero_stage >= 2 else 1),
                       params * state / (n if zero_stage >= 1 else 1))


# ----------------------------------------------------------------------------- activations

#: Layers whose output is a view of their input: they keep nothing new for the backward pass.
_VIEWS = ("Flatten", "Reshape", "InputLayer")


def trainable_params(model: Any) -> int:
    """The number of trainable weights of a Keras model: the ones with gradients and optimizer state.

    ``model.count_params()`` also counts non-trainable weights, such as BatchNormalization's
    moving statistics, which have neither (ResNet-50: 53,120 of its 25,636,712).
    """
    return sum(math.prod(v.shape) for v in model.trainable_weights)


def layer_activations(model: Any, batch: int, bytes_per_value: int = 4) -> list[tuple[str, int]]:
    """Bytes each layer of a built Keras model keeps for the backward pass, for a batch of ``batch``.

    Counted layer by layer: the model's input (a Dense or Conv layer's kernel gradient needs
    its input) and each layer's output (ReLU's gradient needs its output; the next layer's
    input). Layers that only reshape keep nothing new. Counted from the shapes, not measured,
    so it is an estimate: frameworks fuse some layers and free some outputs early, and a layer
    that keeps more inside it than its output (attention's scores, a recurrent layer's states)
    is undercounted. On a GPU, ``tf.config.experimental.get_memory_info`` reads what was really
    used. A Sequential (given a ``keras.Input``) or functional model only: a subclassed one
    raises ValueError.

    Example:
        >>> [name for name, _ in layer_activations(models.mlp(64, 10), 32)]  # doctest: +SKIP
        ['input', 'hidden0', 'logits']
    """
    whole_number("batch", batch, minimum=1)
    one_of("bytes_per_value", bytes_per_value, (2, 4), hint="2 for 16-bit activations, 4 for float32.")
    try:
        inputs = model.inputs
    except AttributeError:  # Keras raises it for a subclassed model, or a Sequential one never built
        inputs = None
    if not inputs:
        raise ValueError(f"{getattr(model, 'name', model)!r} has no symbolic inputs, so its layers' output shapes "
                         "can't be read: give a Sequential model a keras.Input first, or build a functional model "
                         "(a subclassed model isn't counted).")
    rows = [("input", batch * math.prod(inputs[0].shape[1:]) * bytes_per_value)]
    for layer in model.layers:
        if type(layer).__name__ in _VIEWS:
            continue
        rows.append((layer.name, batch * math.prod(layer.output.shape[1:]) * bytes_per_value))
    return rows


RECOMPUTE = ("none", "selective", "full")


def transformer_activations(seq: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                            sequence_parallel: bool = False, recompute: str = "none",
                            bytes_per_value: int = 2, dropout: bool = True) -> float:
    """Bytes one transformer layer keeps for the backward pass, per device.

    The per-layer formulas of Korthikanti et al. (2022, "Reducing Activation Recomputation in
    Large Transformer Models"), for 16-bit activations (``bytes_per_value=2``), with s = seq,
    b = batch, h = hidden, a = heads, t = tensor parallel:

    - no recomputation: s·b·h·(10 + 24/t + 5·a·s/(h·t)); with sequence parallelism s·b·h·(34 + 5·a·s/h)/t;
    - selective recomputation (the attention scores are recomputed): s·b·h·(10 + 24/t), or 34·s·b·h/t
      with sequence parallelism;
    - full recomputation (only each layer's input is kept): 2·s·b·h, or 2·s·b·h/t with sequence parallelism.

    The paper's terms are 16-bit values plus 1-byte dropout masks (2·s·b·h of the 10, and a·s²·b
    of the 5·a·s²·b). With ``bytes_per_value=4`` (float32 activations) the values double and the
    masks stay: s·b·h·(18 + 48/t) + 9·a·s²·b/t with no recomputation, 4·s·b·h for full. A model
    without dropout (``dropout=False``) keeps neither the masks nor dropout's output: s·b·h·(4 + 12/t)·v
    + a·s²·b·v/t (v = ``bytes_per_value``). This
    models Megatron-LM's kernels (1-byte masks, fused where it fuses): other frameworks keep a
    little more or less (TensorFlow's dropout keeps its mask in the values' dtype), so treat it
    as an estimate.

    Example:
        >>> transformer_activations(2048, 1, 4096, 32) / 2**20  # one layer of a 7B model, one sequence
        912.0
    """
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads),
                        ("tensor_parallel", tensor_parallel)):
        whole_number(name, value)
    one_of("recompute", recompute, RECOMPUTE)
    one_of("bytes_per_value", bytes_per_value, (2, 4), hint="2 for 16-bit activations, 4 for float32.")
    if heads % tensor_parallel or hidden % tensor_parallel:
        raise BadArgument(f"tensor_parallel={tensor_parallel} must divide heads={heads} and hidden={hidden}: "
                          "tensor parallelism splits the attention heads and the MLP's columns. Pick a common "
                          f"divisor, e.g. tensor_parallel={math.gcd(heads, hidden, 8)}.")
    s, b, h, a, t, v = seq, batch, hidden, heads, tensor_parallel, bytes_per_value
    replicated = 4 * v + (2 if dropout else 0)  # LayerNorm and linear inputs, two dropout masks (1 byte): 10 in 16-bit
    split = 12 * v  # Q, K, V, the projection's input and the MLP's two wide tensors: 24 in 16-bit
    scores = 2 * v + 1 if dropout else v  # softmax output, dropout output (values) and its mask: 5 in 16-bit
    if recompute == "full":
        return v * s * b * h / (t if sequence_parallel else 1)
    if sequence_parallel:
        return s * b * h * (replicated + split + (0 if recompute == "selective" else scores * a * s / h)) / t
    return s * b * h * (replicated + split / t + (0 if recompute == "selective" else scores * a * s / (h * t)))


def activations(model: Any, batch: int, bytes_per_value: int = 4, tensor_parallel: int = 1,
                sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes a whole model keeps for the backward pass, for a batch of ``batch``, on one device.

    A built Keras model is counted layer by layer (:func:`layer_activations`); a
    :class:`Transformer` as ``layers`` × :func:`transformer_activations` (tensor parallelism,
    sequence parallelism and recomputation apply to transformers only).

    Example:
        >>> round(activations(TRANSFORMERS["7B transformer (32 layers, hidden 4096)"], 1, 2) / 2**30, 1)
        28.5
    """
    if isinstance(model, Transformer):
        return model.layers * transformer_activations(model.seq, batch, model.hidden, model.heads, tensor_parallel,
                                                      sequence_parallel, recompute, bytes_per_value)
    if (tensor_parallel, sequence_parallel, recompute) != (1, False, "none"):
        raise BadArgument("tensor_parallel, sequence_parallel and recompute apply to transformers here: for a Keras "
                          "model, leave them at 1, False and 'none'.")
    return sum(nbytes for _, nbytes in layer_activations(model, batch, bytes_per_value))


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device holds while training: the model states and the activations in flight."""

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations


def per_device(params: float, activations: float, data_parallel: int = 1, tensor_parallel: int = 1,
               pipeline_parallel: int = 1, zero_stage: int = 0, accumulation: int = 1, optimizer: str = "adam",
               precision: str = "mixed", pipeline_stage: int = 0) -> DeviceMemory:
    """Memory per device for a data × tensor × pipeline layout with a ZeRO stage.

    ``params`` counts the whole model; tensor and pipeline parallelism each divide it, and ZeRO
    shards what is left over the data-parallel devices (:func:`model_states`). ``activations``
    is what one micro-batch keeps on one device for its share of the layers (for a transformer,
    ``layers ÷ pipeline × transformer_activations(...)``). ``accumulation`` is the number of
    micro-batches per step, whether gradient accumulation or a pipeline's micro-batches: with
    no pipeline they run one after another, so one is in flight; a 1F1B pipeline keeps up to
    P − s micro-batches in flight on stage s (``pipeline_stage``; fewer if there are fewer), so
    stage 0 holds the most. The global batch is micro-batch × ``accumulation`` × ``data_parallel``.

    Example:
        >>> round(per_device(7_000_000_000, 0, data_parallel=8, zero_stage=3).total / 1e9, 1)
        14.0
    """
    for name, value in (("data_parallel", data_parallel), ("tensor_parallel", tensor_parallel),
                        ("pipeline_parallel", pipeline_parallel), ("accumulation", accumulation)):
        whole_number(name, value)
    real_number("activations", activations, minimum=0)
    params = whole_number("params", params, float_ok=True)
    whole_number("pipeline_stage", pipeline_stage, minimum=0, maximum=pipeline_parallel - 1,
                 hint="Stages are numbered from 0.")
    shard = max(1, math.ceil(params / (tensor_parallel * pipeline_parallel)))
    states = model_states(shard, data_parallel, zero_stage, optimizer, precision)
    in_flight = min(pipeline_parallel - pipeline_stage, accumulation)
    return DeviceMemory(states.params, states.grads, states.optimizer, activations * in_flight)


# ----------------------------------------------------------------------------- presets for the calculator


@dataclasses.dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer's shape: its parameter count is about 12·L·h² + 2·V·h."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int

    @property
    def params(self) -> int:
        """Weights: 12·h² per layer (attention 4·h², MLP 8·h²), plus input and output embeddings (2·V·h)."""
        return 12 * self.layers * self.hidden ** 2 + 2 * self.vocab * self.hidden


#: Memory that ``nvidia-smi`` reports for each card, in MiB (a T4 on Colab, an H100 80GB HBM3, an A100 80GB).
GPU_MEMORY_MIB: dict[str, int] = {"T4": 15_360, "A100 80GB": 81_920, "H100 80GB": 81_559}

#: The share of a card's memory these counts may fill: the rest goes to what they leave out (the CUDA
#: context and the framework's reserve, the loss's logits, communication buffers, fragmentation). A rule of
#: thumb, not a measurement: ``tf.config.experimental.get_memory_info`` measures on a real GPU.
USABLE_FRACTION = 0.9


def fits(nbytes: float, gpu: str) -> bool:
    """Whether ``nbytes`` counted by this module fit on ``gpu`` (a key of GPU_MEMORY_MIB), leaving 10 % spare.

    Example:
        >>> fits(70 * 2**30, "H100 80GB"), fits(75 * 2**30, "H100 80GB")
        (True, False)
    """
    one_of("gpu", gpu, GPU_MEMORY_MIB)
    return nbytes <= USABLE_FRACTION * GPU_MEMORY_MIB[gpu] * 2**20


#: Transformers the calculator knows, by name.
TRANSFORMERS: dict[str, Transformer] = {
    "7B transformer (32 layers, hidden 4096)": Transformer(32, 4096, 32, 2048, 32_000),
    "70B transformer (80 layers, hidden 8192)": Transformer(80, 8192, 64, 4096, 32_000),
}


def transformer_memory(model: Transformer, micro_batch: int, data_parallel: int = 1, tensor_parallel: int = 1,
                       pipeline_parallel: int = 1, zero_stage: int = 0, accumulation: int = 1,
                       optimizer: str = "adam", precision: str = "mixed", recompute: str = "none",
                       sequence_parallel: bool = False, pipeline_stage: int = 0) -> DeviceMemory:
    """Memory per device for a transformer: its layers' activations (Korthikanti) and its model states.

    Activations are 16-bit with ``precision="mixed"`` and float32 with ``"fp32"``.

    Example:
        >>> m = transformer_memory(TRANSFORMERS["7B transformer (32 layers, hidden 4096)"], 1, data_parallel=8)
        >>> round(m.params / 1e9, 1), round(m.activations / 2**30, 1)  # 16-bit weights; 32 layers of one sequence
        (13.4, 28.5)
    """
    if model.layers % pipeline_parallel:
        raise BadArgument(f"pipeline_parallel={pipeline_parallel} doesn't divide the {model.layers} layers: pick "
                          f"a divisor of {model.layers}, so every stage holds the same number of layers.")
    per_layer = transformer_activations(model.seq, micro_batch, model.hidden, model.heads, tensor_parallel,
                                        sequence_parallel, recompute, 4 if precision == "fp32" else 2)
    return per_device(model.params, per_layer * model.layers / pipeline_parallel, data_parallel, tensor_parallel,
                      pipeline_parallel, zero_stage, accumulation, optimizer, precision, pipeline_stage)
