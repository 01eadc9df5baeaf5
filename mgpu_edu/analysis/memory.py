"""Memory per device, as arithmetic: the weights, their gradients and the optimizer's state.

The accounting follows the ZeRO paper (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models"). Every parameter costs bytes for its value, its
gradient and the optimizer's state:

| precision | value | gradient | optimizer state (Adam / SGD with momentum / SGD) |
|---|---:|---:|---|
| ``"fp32"`` | 4 | 4 | 8 / 4 / 0 (Adam's two moments; the momentum) |
| ``"mixed"`` | 2 | 2 | 12 / 8 / 4 (an fp32 master copy of the weights, plus the above) |
| ``"mixed_fp32_grads"`` | 2 | 2 + 4 | 12 / 8 / 4 (as mixed, plus an fp32 buffer the gradients accumulate in) |

Mixed-precision Adam keeps K = 12 bytes of optimizer state per parameter: 16 bytes in all.
ZeRO stage 1 shards the optimizer state over the data-parallel devices, stage 2 the gradients
too, stage 3 the values too. Activations come from the layers' shapes (:func:`layer_activations`) or, for transformer
layers, from Korthikanti et al. (:func:`transformer_activations`); :func:`per_device` puts a
data × tensor × pipeline layout together. Pure arithmetic: no TensorFlow, no GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, real_number, whole_number

#: Bytes per parameter for (value, gradient) in each precision. ``"mixed_fp32_grads"`` is mixed precision that
#: also keeps an fp32 buffer to accumulate the gradients in (2 + 4 bytes of gradient): the Ultra-Scale
#: Playbook's 20 bytes per parameter with Adam ("Memory usage in Transformers"), and Megatron-LM's default.
PRECISIONS: dict[str, tuple[int, int]] = {"fp32": (4, 4), "mixed": (2, 2), "mixed_fp32_grads": (2, 6)}
#: Bytes of optimizer state per parameter, in each precision (mixed adds an fp32 master copy).
OPTIMIZER_STATE: dict[str, dict[str, int]] = {
    "fp32": {"adam": 8, "momentum": 4, "sgd": 0},
    "mixed": {"adam": 12, "momentum": 8, "sgd": 4},
    "mixed_fp32_grads": {"adam": 12, "momentum": 8, "sgd": 4},
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
#: The attention kernels the activation counts know: one that keeps its softmax's output (and dropout's) for the
#: backward pass, as Megatron-LM's did in Korthikanti et al. and the course's GPT does; and a FlashAttention-style
#: kernel (Dao et al., 2022), which keeps only each query row's softmax statistics and recomputes the rest.
ATTENTION = ("materialised", "flash")
MLPS = ("gelu", "swiglu")


def transformer_activations(seq: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                            sequence_parallel: bool = False, recompute: str = "none",
                            bytes_per_value: int = 2, dropout: bool = True, *, kv_heads: int = 0, ffn: int = 0,
                            mlp: str = "gelu", context_parallel: int = 1,
                            attention: str = "materialised") -> float:
    """Bytes one transformer layer keeps for the backward pass, per device.

    The per-layer formulas of Korthikanti et al. (2022, "Reducing Activation Recomputation in
    Large Transformer Models", Table 2), for 16-bit activations (``bytes_per_value=2``), with s = seq,
    b = batch, h = hidden, a = heads, t = tensor parallel:

    - no recomputation: s·b·h·(10 + 24/t + 5·a·s/(h·t)); with sequence parallelism s·b·h·(34 + 5·a·s/h)/t;
    - selective recomputation (the attention scores are recomputed): s·b·h·(10 + 24/t), or 34·s·b·h/t
      with sequence parallelism;
    - full recomputation (only each layer's input is kept): 2·s·b·h, or 2·s·b·h/t with sequence parallelism.

    The paper's terms are 16-bit values plus 1-byte dropout masks (2·s·b·h of the 10, and a·s²·b
    of the 5·a·s²·b). With ``bytes_per_value=4`` (float32 activations) the values double and the
    masks stay: s·b·h·(18 + 48/t) + 9·a·s²·b/t with no recomputation, 4·s·b·h for full. A model
    without dropout (``dropout=False``) keeps neither the masks nor dropout's output: s·b·h·(4 + 12/t)·v
    + a·s²·b·v/t (v = ``bytes_per_value``).

    The paper's 24/t are the split tensors: the query and key (2·s·b·h each, in 16 bits), the values,
    the projection's input, and the MLP's two tensors of width 4h. Other blocks keep other widths, counted
    the same way: grouped-query attention (``kv_heads`` < ``heads``) keeps keys and values kv_heads/heads
    as wide; an MLP of width ``ffn`` (default 4h) keeps 2·ffn values per token with GeLU, and 3·ffn with
    SwiGLU (the gate's and the up projection's outputs, and their product). ``context_parallel`` C splits
    the sequence: every term but the scores is s/C tokens, and the scores are (s/C)·s per head, as ring
    attention keeps them under autodiff (lesson 14). ``attention="flash"`` keeps no scores, only each
    query row's softmax statistics (4 bytes per head). This models Megatron-LM's kernels (1-byte masks,
    fused where it fuses): other frameworks keep a little more or less (TensorFlow's dropout keeps its
    mask in the values' dtype), so treat it as an estimate.

    Example:
        >>> transformer_activations(2048, 1, 4096, 32) / 2**20  # one layer of a 7B model, one sequence
        912.0
    """
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads),
                        ("tensor_parallel", tensor_parallel), ("context_parallel", context_parallel)):
        whole_number(name, value)
    kv_heads = whole_number("kv_heads", kv_heads or heads, maximum=heads, hint="It is the number of key/value "
                            "heads (grouped-query attention); 0 means as many as the query heads.")
    one_of("recompute", recompute, RECOMPUTE)
    one_of("bytes_per_value", bytes_per_value, (2, 4), hint="2 for 16-bit activations, 4 for float32.")
    one_of("mlp", mlp, MLPS)
    one_of("attention", attention, ATTENTION)
    width = ffn or 4 * hidden
    if heads % tensor_parallel or hidden % tensor_parallel or kv_heads % tensor_parallel or width % tensor_parallel:
        raise BadArgument(f"tensor_parallel={tensor_parallel} must divide heads={heads}, kv_heads={kv_heads}, "
                          f"hidden={hidden} and the MLP's width {width}: tensor parallelism splits the attention "
                          f"heads and the MLP's columns. Pick a common divisor, e.g. "
                          f"tensor_parallel={math.gcd(heads, kv_heads, hidden, width, 8)}.")
    if seq % context_parallel:
        raise BadArgument(f"context_parallel={context_parallel} must divide seq={seq}: each device holds an equal "
                          f"part of the sequence. Pick a divisor, e.g. context_parallel={math.gcd(seq, 8)}.")
    return _layer_activations(seq, batch, hidden, heads, tensor_parallel, sequence_parallel, recompute,
                              bytes_per_value, dropout, kv_heads, width, mlp, context_parallel, attention)


def _layer_activations(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str, v: int, dropout: bool,
                       kv: int, f: int, mlp: str, c: int, attention: str) -> float:
    """:func:`transformer_activations` without the checks (the planner calls it for thousands of layouts)."""
    tokens = s / c * b  # this device's tokens
    if recompute == "full":
        return v * tokens * h / (t if sp else 1)
    replicated = (4 * v + (2 if dropout else 0)) * h  # LayerNorms' and linears' inputs, 2 dropout masks (1 byte)
    split = v * (2 + 2 * kv / a) * h + v * (3 if mlp == "swiglu" else 2) * f  # q, k, v, projection input; MLP
    if recompute == "selective":
        scores = 0.0
    elif attention == "flash":
        scores = 4 * a  # each query row's softmax statistics, fp32
    else:
        scores = (2 * v + 1 if dropout else v) * a * s  # softmax output, dropout output and its mask, per key
    if sp:
        return tokens * (replicated + split + scores) / t
    return tokens * (replicated + (split + scores) / t)


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
        return model.layers * model.layer_activations(batch, tensor_parallel, sequence_parallel, recompute,
                                                      bytes_per_value)
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

    ``params`` counts the whole model; tensor and pipeline parallelism each divide it evenly, and ZeRO
    shards what is left over the data-parallel devices (:func:`model_states`): a model whose stages
    hold equal shares. A transformer's first stage also holds the embedding and its last the head:
    :func:`transformer_memory` counts each stage. ``activations``
    is what one micro-batch keeps on one device for its share of the layers. ``accumulation`` is the number of
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
    kept = activations * in_flight(pipeline_parallel, pipeline_stage, accumulation)
    return DeviceMemory(states.params, states.grads, states.optimizer, kept)


# ----------------------------------------------------------------------------- a transformer's shape and stages


@dataclasses.dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer's shape, and its parameters counted weight by weight.

    Each block: two norms, the query, key, value and output matrices, and an MLP of width ``ffn``
    (default 4·hidden): two matrices with GeLU, three with SwiGLU (gate, up, down). With ``bias``
    (the course's GPT; GPT-2 and GPT-3 also have query, key and value biases, 3·h per block more) the norms
    are LayerNorms (a scale and a shift, 2·h each) and
    the output projection and the MLP have biases; without it (Llama) the norms are RMSNorms (a scale,
    h each) and no matrix has a bias. ``kv_heads`` < ``heads`` is grouped-query attention: the key and
    value matrices are kv_heads/heads as wide (0: as many as the query heads). With ``experts`` > 1
    every block's MLP is a mixture of that many experts, ``top_k`` of them per token (lesson 14), plus a
    router (h·E). Outside the blocks: the token embedding, learned positions (``positions``), a final
    norm, and the head (h·V), the embedding's own table when ``tied_embeddings``. ``attention`` is the
    kernel the activation counts assume (:data:`ATTENTION`).

    Example:
        >>> Transformer(layers=32, hidden=4096, heads=32, seq=8192, vocab=128_256, ffn=14_336, kv_heads=8,
        ...             mlp="swiglu", bias=False, positions=False).params  # Llama 3 8B
        8030261248
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int = 0
    experts: int = 1
    top_k: int = 1
    positions: bool = True
    kv_heads: int = 0
    mlp: str = "gelu"
    tied_embeddings: bool = False
    bias: bool = True
    attention: str = "materialised"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "vocab", "experts", "top_k"):
            whole_number(name, getattr(self, name), where="Transformer")
        whole_number("ffn", self.ffn, minimum=0, where="Transformer", hint="0 means 4 × hidden.")
        whole_number("kv_heads", self.kv_heads, minimum=0, maximum=self.heads, where="Transformer",
                     hint="0 means as many as the query heads.")
        one_of("mlp", self.mlp, MLPS)
        one_of("attention", self.attention, ATTENTION)
        if self.hidden % self.heads or self.heads % self.kv:
            raise BadArgument(f"Transformer: heads={self.heads} must divide hidden={self.hidden}, and "
                              f"kv_heads={self.kv} must divide heads: each key/value head serves a whole group of "
                              "query heads.")
        if self.top_k > self.experts:
            raise BadArgument(f"Transformer: top_k={self.top_k} must be at most experts={self.experts}.")

    @property
    def kv(self) -> int:
        """Key/value heads (as many as the query heads unless ``kv_heads`` says fewer)."""
        return self.kv_heads or self.heads

    @property
    def width(self) -> int:
        """The MLP's width."""
        return self.ffn or 4 * self.hidden

    def matrices(self) -> tuple[int, int]:
        """One block's matrix weights: (attention's four, one expert's or the MLP's)."""
        h = self.hidden
        return 2 * h * h + 2 * h * (h // self.heads * self.kv), (3 if self.mlp == "swiglu" else 2) * h * self.width

    def block_params(self) -> tuple[int, int, int]:
        """One block's parameters: (split by tensor parallelism, held whole by every tensor rank, in experts)."""
        return _block_params(self)

    def _block_params(self) -> tuple[int, int, int]:
        h, f = self.hidden, self.width
        attention, mlp = self.matrices()
        norm = 2 * h if self.bias else h
        if self.bias:  # the MLP's first biases are split with its columns; the output biases stay whole
            mlp += (2 if self.mlp == "swiglu" else 1) * f
        whole = 2 * norm + (2 * h if self.bias else 0)
        if self.experts > 1:
            return attention, whole + h * self.experts, mlp * self.experts
        return attention + mlp, whole, 0

    def outside_params(self) -> tuple[int, int, int]:
        """Parameters outside the blocks: (first stage's: embedding and positions, last stage's: final norm, the
        head's own table, 0 when tied)."""
        h, v = self.hidden, self.vocab
        return v * h + (self.seq * h if self.positions else 0), 2 * h if self.bias else h, \
            0 if self.tied_embeddings else v * h

    @property
    def params(self) -> int:
        """Every parameter of the model."""
        split, whole, experts = self.block_params()
        return self.layers * (split + whole + experts) + sum(self.outside_params())

    @property
    def active_params(self) -> int:
        """Parameters one token uses (a mixture of experts runs top_k of its experts)."""
        split, whole, experts = self.block_params()
        return self.layers * (split + whole + experts * self.top_k // self.experts) + sum(self.outside_params())

    def layer_activations(self, batch: int, tensor_parallel: int = 1, sequence_parallel: bool = False,
                          recompute: str = "none", bytes_per_value: int = 2, context_parallel: int = 1) -> float:
        """Bytes one of its layers keeps for the backward pass, per device (:func:`transformer_activations`)."""
        return transformer_activations(self.seq, batch, self.hidden, self.heads, tensor_parallel, sequence_parallel,
                                       recompute, bytes_per_value, kv_heads=self.kv, ffn=self.width, mlp=self.mlp,
                                       context_parallel=context_parallel, attention=self.attention)


@functools.cache
def _block_params(model: Transformer) -> tuple[int, int, int]:
    return model._block_params()  # a planner asks for it thousands of times per job


def stage_layers(layers: int, pipeline: int) -> list[int]:
    """How many blocks each of ``pipeline`` stages holds: as even as can be, one fewer on the outer stages first.

    The first stage also holds the embedding and the last the head, so where the blocks don't divide
    evenly the stages that hold fewer are the first and the last, then the second and the one before the
    last, and so on, as Llama 3 split 126 layers over 16 stages (Dubey et al., 2024, §3.3.2: one layer
    fewer on the first and the last stage).

    Example:
        >>> stage_layers(126, 16)
        [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]
    """
    whole_number("pipeline", pipeline, maximum=layers, hint=f"Each stage needs at least one of the {layers} layers.")
    return list(_stage_layers(layers, pipeline))


@functools.cache
def _stage_layers(layers: int, pipeline: int) -> tuple[int, ...]:
    most = -(-layers // pipeline)
    counts = [most] * pipeline
    for i in range(most * pipeline - layers):  # the outer stages first: 0, p−1, 1, p−2, ...
        counts[i // 2 if i % 2 == 0 else pipeline - 1 - i // 2] -= 1
    return tuple(counts)


def stage_params(model: Transformer, tensor_parallel: int = 1, pipeline_parallel: int = 1, stage: int = 0,
                 expert_parallel: int = 1, split_embeddings: bool = False) -> int:
    """Parameters one device of pipeline stage ``stage`` holds (before ZeRO-3 divides them over the data axis).

    The stage's blocks (:func:`stage_layers`): the split parts divided by the tensor degree (experts by
    the expert degree too), the rest whole. The embedding sits on the first stage, the final norm and head
    on the last; a tied head still needs the table on the last stage when there is more than one stage
    (Megatron-LM keeps a copy there and adds the two copies' gradients). With ``split_embeddings``
    (Megatron-LM's vocabulary-parallel embedding and head) the tensor ranks split the tables, otherwise
    (the course's layouts) each holds them whole.

    Example:
        >>> tiny = Transformer(layers=2, hidden=32, heads=4, seq=16, vocab=64)
        >>> stage_params(tiny, 2, 2, stage=0), stage_params(tiny, 2, 2, stage=1)
        (8960, 8512)
    """
    t = whole_number("tensor_parallel", tensor_parallel)
    p = whole_number("pipeline_parallel", pipeline_parallel, maximum=model.layers,
                     hint=f"Each stage needs at least one of the {model.layers} layers.")
    e = whole_number("expert_parallel", expert_parallel)
    whole_number("stage", stage, minimum=0, maximum=p - 1, hint="Stages are numbered from 0.")
    split, whole, experts = model.block_params()
    count = (split // t + whole + experts // (t * e)) * _stage_layers(model.layers, p)[stage]
    first, norm, head = model.outside_params()
    table = model.vocab * model.hidden
    shard = table // t if split_embeddings else table
    if stage == 0:
        count += first - table + shard
    if stage == p - 1:
        count += norm + (shard if head or p > 1 else 0)
    return count


def in_flight(pipeline: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """How many micro-batches' activations stage ``stage`` keeps at its peak, in a 1F1B schedule.

    A 1F1B pipeline (Narayanan et al., 2021) keeps min(P − s, M) micro-batches in flight on stage s.
    The interleaved schedule runs V chunks of L/(P·V) layers per stage and warms up with
    2·(P − s − 1) + (V − 1)·P chunks before its first backward (as Megatron-LM schedules it), so stage
    s keeps that many plus one chunks, V chunks being one micro-batch's worth of the stage's layers: on
    the first stage P + (P − 1)/V, 1F1B's P times Korthikanti et al.'s factor for the interleaved
    schedule, 1 + (P − 1)/(P·V) (§4.2.3); with M = P Megatron-LM runs every forward first, so all M are.
    :func:`mgpu_edu.parallelism.pipeline.interleaved_schedule` builds that schedule slot by slot and keeps
    exactly these.
    With no pipeline, gradient accumulation runs the micro-batches one after another: one.

    Example:
        >>> in_flight(4, 0, 8), in_flight(4, 3, 8), in_flight(4, 0, 8, virtual_stages=2)
        (4, 1, 5.5)
    """
    whole_number("pipeline", pipeline)
    whole_number("stage", stage, minimum=0, maximum=pipeline - 1, hint="Stages are numbered from 0.")
    whole_number("micro_batches", micro_batches)
    whole_number("virtual_stages", virtual_stages)
    if virtual_stages == 1:
        return min(pipeline - stage, micro_batches)
    if micro_batches == pipeline:  # Megatron-LM then runs every forward first: all of them are in flight
        return micro_batches
    chunks = 2 * (pipeline - stage - 1) + (virtual_stages - 1) * pipeline + 1
    return min(chunks, virtual_stages * micro_batches) / virtual_stages


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


def gathered_bytes(layer_params: Sequence[int], prefetch: bool = False, bytes_per_value: int = 4) -> int:
    """ZeRO-3's working buffer: the most bytes of gathered whole-layer weights a device holds at once, given each
    layer's parameters in the order the forward pass uses them. Without prefetching, one layer at a time; with
    it (the next layer gathered while this one computes), two consecutive layers.

    Example:
        >>> gathered_bytes([100, 300, 200]), gathered_bytes([100, 300, 200], prefetch=True)
        (1200, 2000)
    """
    sizes = [whole_number("layer_params", p, minimum=0) for p in layer_params]
    if not sizes:
        return 0
    pairs = [a + b for a, b in zip(sizes, sizes[1:], strict=False)] if prefetch and len(sizes) > 1 else sizes
    return max(pairs) * bytes_per_value


#: Transformers the calculator knows, by name.
TRANSFORMERS: dict[str, Transformer] = {
    "7B transformer (32 layers, hidden 4096)": Transformer(32, 4096, 32, 2048, 32_000),
    "70B transformer (80 layers, hidden 8192)": Transformer(80, 8192, 64, 4096, 32_000),
}


def transformer_memory(model: Transformer, micro_batch: int, data_parallel: int = 1, tensor_parallel: int = 1,
                       pipeline_parallel: int = 1, zero_stage: int = 0, accumulation: int = 1,
                       optimizer: str = "adam", precision: str = "mixed", recompute: str = "none",
                       sequence_parallel: bool = False, pipeline_stage: int = 0) -> DeviceMemory:
    """Memory per device of pipeline stage ``pipeline_stage`` for a transformer: its model states
    (:func:`stage_params`, the embedding on the first stage and the head on the last) and its layers'
    activations (Korthikanti), for the micro-batches a 1F1B pipeline keeps in flight there
    (:func:`stage_memory` counts them; the planner calls it too, with more axes).

    Activations are 16-bit with mixed precision and float32 with ``"fp32"``.

    Example:
        >>> m = transformer_memory(TRANSFORMERS["7B transformer (32 layers, hidden 4096)"], 1, data_parallel=8)
        >>> round(m.params / 1e9, 1), round(m.activations / 2**30, 1)  # 16-bit weights; 32 layers of one sequence
        (13.4, 28.5)
    """
    for name, value in (("data_parallel", data_parallel), ("accumulation", accumulation)):
        whole_number(name, value)
    whole_number("pipeline_parallel", pipeline_parallel, maximum=model.layers,
                 hint=f"Each stage needs at least one of the {model.layers} layers.")
    whole_number("pipeline_stage", pipeline_stage, minimum=0, maximum=pipeline_parallel - 1,
                 hint="Stages are numbered from 0.")
    one_of("precision", precision, PRECISIONS)
    one_of("optimizer", optimizer, OPTIMIZER_STATE[precision], hint="'momentum' is SGD with momentum.")
    whole_number("zero_stage", zero_stage, minimum=0, maximum=3, hint="ZeRO has stages 0 (none), 1, 2 and 3.")
    per_layer = model.layer_activations(micro_batch, tensor_parallel, sequence_parallel, recompute,
                                        PRECISIONS[precision][0])
    return stage_memory(model, per_layer, pipeline_stage, data_parallel, tensor_parallel, pipeline_parallel,
                        zero_stage, accumulation, optimizer, precision)


def stage_memory(model: Transformer, per_layer: float, stage: int, data_parallel: int, tensor_parallel: int,
                 pipeline_parallel: int, zero_stage: int, micro_batches: int, optimizer: str = "adam",
                 precision: str = "mixed", expert_parallel: int = 1, virtual_stages: int = 1,
                 split_embeddings: bool = False, reshard: bool = True, params: int | None = None) -> DeviceMemory:
    """What one device of pipeline stage ``stage`` holds: the model states of its ``params`` (counted by
    :func:`stage_params` unless given),
    ZeRO over ``data_parallel`` devices) and ``per_layer`` bytes of activations for each of its layers
    (:func:`stage_layers`), for the micro-batches it keeps in flight (:func:`in_flight`). ZeRO-3 with
    ``reshard=False`` holds the stage's gathered 16-bit weights whole. The counting core of
    :func:`transformer_memory` and the planner, which check their arguments first.

    Example:
        >>> tiny = Transformer(layers=2, hidden=32, heads=4, seq=16, vocab=64)
        >>> stage_memory(tiny, 1000.0, 0, 2, 2, 2, 1, 4, precision="fp32")
        DeviceMemory(params=35840.0, grads=35840.0, optimizer=35840.0, activations=2000.0)
    """
    if params is None:
        params = stage_params(model, tensor_parallel, pipeline_parallel, stage, expert_parallel, split_embeddings)
    states = model_states(params, data_parallel, zero_stage, optimizer, precision)
    weights = states.params if reshard else params * PRECISIONS[precision][0]
    kept = per_layer * _stage_layers(model.layers, pipeline_parallel)[stage] * in_flight(
        pipeline_parallel, stage, micro_batches, virtual_stages)
    return DeviceMemory(weights, states.grads, states.optimizer, kept)
