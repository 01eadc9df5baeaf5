"""Choose a layout for a training job: enumerate data × tensor × pipeline × context × expert degrees, ZeRO
stages, micro-batches and recomputation; keep those that fit; rank them by predicted step time.

Every prediction is a count, per device: the model states (:func:`memory.model_states`: values,
gradients, optimizer), the activations a stage keeps in flight (:func:`memory.transformer_activations`,
or only each stage's input with ``recompute="stage"``), and the bytes sent per step by each axis with
lesson 12's ring formulas: tensor parallelism's all-reduces of s·b·h, the pipeline's activations and
their gradients between stages, the data axis's gradient and weight traffic (:func:`sharding.bytes_per_device`),
context parallelism's key/value ring and expert parallelism's two all-to-alls. The step time is lesson 08's
cost model: the compute of 6 FLOPs per parameter per token (8 when the whole forward pass is recomputed;
selective recomputation's extra is small and left out) at a fraction of the
devices' peak, stretched by the pipeline's bubble, plus each axis's communication by lesson 03's α-β model,
at the bandwidth of the link that axis crosses (inside a node for tensor and expert parallelism when they
fit in one; between nodes otherwise), none of it overlapped. It is a model: it ranks layouts; it does not
promise seconds. Besides what is kept between a micro-batch's forward and backward passes, it counts the
working memory of the backward pass: the loss's float32 logits on the last stage and, with recomputation, one
layer's activations recomputed at a time ("working"). It leaves out ZeRO-3's gathered layer, communication
buffers, the CUDA context and fragmentation (the 10 % of memory it keeps spare stands for them), and overlap
of any kind. Pipeline traffic is charged at the link between nodes (conservative when stages share a node).
It models the course's layouts: each tensor rank sends its whole copy of a stage's output to the next stage
(Megatron-LM's scatter/gather optimisation sends 1/t of it).

The counts for the course's tiny GPT equal what lesson 16's 3-D run measured (the lesson asserts it); the
ZeRO paper's memory figures and published models' parameter counts are checked in tests/test_planner.py.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, positive_number, whole_number
from mgpu_edu.analysis import costmodel, memory
from mgpu_edu.parallelism import collectives, sharding

RECOMPUTE = ("none", "selective", "full", "stage")
PRECISION_BYTES = {"fp32": 4, "mixed": 2}


@dataclasses.dataclass(frozen=True)
class Model:
    """A decoder-only transformer as the course writes it (lesson 13's tiny GPT at any size).

    Each block: two LayerNorms (2·h each), query/key/value/output matrices (4·h²) and the output bias (h),
    an MLP of width ``ffn`` (h·ffn + ffn + ffn·h + h). Outside the blocks: token and position embeddings,
    a final LayerNorm, and an untied head (h·V). With ``experts`` > 1 every block's MLP is a mixture of
    that many experts, ``top_k`` of them per token (lesson 14), plus a router (h·E).
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

    @property
    def width(self) -> int:
        return self.ffn or 4 * self.hidden

    def block_params(self) -> tuple[int, int, int]:
        """One block's parameters: (split by tensor parallelism, held whole by every tensor rank, in experts)."""
        h, f = self.hidden, self.width
        split_attention = 4 * h * h
        mlp = h * f + f + f * h  # w1, b1, w2 (split); the output bias b2 stays whole
        whole = 2 * h + h + 2 * h + h  # LayerNorms, bo, b2
        if self.experts > 1:
            return split_attention, whole + h * self.experts, mlp * self.experts
        return split_attention + mlp, whole, 0

    @property
    def params(self) -> int:
        """Every parameter of the model."""
        split, whole, experts = self.block_params()
        outside = self.vocab * self.hidden * 2 + 2 * self.hidden + (self.seq * self.hidden if self.positions else 0)
        return self.layers * (split + whole + experts) + outside

    @property
    def active_params(self) -> int:
        """Parameters one token uses (a mixture of experts runs top_k of its experts)."""
        split, whole, experts = self.block_params()
        outside = self.params - self.layers * (split + whole + experts)
        return self.layers * (split + whole + experts * self.top_k // self.experts) + outside


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The devices: how many, memory each (bytes), per-device peak (FLOP/s), and the links inside and between
    nodes (bytes/s, with α the latency of one message)."""

    devices: int
    memory_bytes: float
    flops: float
    per_node: int = 8
    intra_bandwidth: float = 450e9
    inter_bandwidth: float = 50e9
    alpha_s: float = 5e-6
    efficiency: float = 0.4


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the job: the degree of each axis, the ZeRO stage, the micro-batch size, the number of
    micro-batches per step (a pipeline's, or gradient accumulation's), and what the backward pass recomputes."""

    data: int
    tensor: int
    pipeline: int
    context: int = 1
    expert: int = 1
    zero: int = 0
    micro_batch: int = 1
    micro_batches: int = 1
    recompute: str = "none"

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline * self.context

    def describe(self) -> str:
        parts = [f"DP {self.data}", f"TP {self.tensor}", f"PP {self.pipeline}"]
        parts += [f"CP {self.context}"] * (self.context > 1) + [f"EP {self.expert}"] * (self.expert > 1)
        return (" × ".join(parts) + f", ZeRO-{self.zero}, micro-batch {self.micro_batch} × {self.micro_batches}, "
                f"recompute {self.recompute}")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What a layout costs per device: bytes held (by kind) and sent per step (by axis), on the busiest device,
    and the predicted step time in seconds (``None`` when no cluster was given)."""

    layout: Layout
    params_per_device: int
    held: dict[str, float]
    sent: dict[str, float]
    seconds: float | None = None
    fits: bool | None = None

    @property
    def held_total(self) -> float:
        return sum(self.held.values())

    @property
    def sent_total(self) -> float:
        return sum(self.sent.values())


def _check(model: Model, layout: Layout) -> None:
    for name in ("data", "tensor", "pipeline", "context", "expert", "micro_batch", "micro_batches"):
        whole_number(name, getattr(layout, name))
    whole_number("zero", layout.zero, minimum=0, maximum=3, hint="ZeRO has stages 0 (none), 1, 2 and 3.")
    one_of("recompute", layout.recompute, RECOMPUTE)
    if model.layers % layout.pipeline:
        raise BadArgument(f"pipeline={layout.pipeline} doesn't divide the {model.layers} layers: pick a divisor.")
    if model.heads % layout.tensor or model.width % layout.tensor:
        raise BadArgument(f"tensor={layout.tensor} must divide the {model.heads} heads and the MLP's {model.width}.")
    if model.seq % layout.context:
        raise BadArgument(f"context={layout.context} must divide the sequence length {model.seq}.")
    if model.experts % layout.expert or (layout.expert > 1 and layout.data * layout.context % layout.expert):
        raise BadArgument(f"expert={layout.expert} must divide the {model.experts} experts and the data × context "
                          f"degree ({layout.data * layout.context}), whose devices it spreads them over.")


def params_per_device(model: Model, layout: Layout, stage: int = 0, split_embeddings: bool = False) -> int:
    """Parameters one device of pipeline stage ``stage`` holds (before ZeRO-3 divides them).

    The stage's blocks: the split parts divided by the tensor degree (experts by the expert degree too), the
    rest whole. The embeddings sit on the first stage, the final LayerNorm and head on the last; with
    ``split_embeddings`` (Megatron-LM's vocabulary-parallel embedding and head) the tensor ranks split them,
    otherwise (the course's layouts) each holds them whole.
    """
    _check(model, layout)
    whole_number("stage", stage, minimum=0, maximum=layout.pipeline - 1, hint="Stages are numbered from 0.")
    split, whole, experts = model.block_params()
    per_block = split // layout.tensor + whole + experts // (layout.tensor * layout.expert)
    count = per_block * model.layers // layout.pipeline
    h, v = model.hidden, model.vocab
    table = v * h // (layout.tensor if split_embeddings else 1)
    if stage == 0:
        count += table + (model.seq * h if model.positions else 0)
    if stage == layout.pipeline - 1:
        count += 2 * h + table
    return count


def predict(model: Model, layout: Layout, cluster: Cluster | None = None, precision: str = "mixed",
            split_embeddings: bool = False, stage: int | None = None) -> Prediction:
    """Bytes held and sent per step by a device of pipeline stage ``stage``, and with a ``cluster`` the predicted step
    time and whether it fits. With ``stage=None``, the worst over the stages: what the fullest stage holds, what
    the busiest sender sends (a middle stage sends both activations and gradients), and the slowest step.

    Example:
        >>> tiny = Model(layers=2, hidden=32, heads=4, seq=16, vocab=64)
        >>> p = predict(tiny, Layout(2, 2, 2, zero=1, micro_batches=4, recompute="stage"), precision="fp32", stage=0)
        >>> p.params_per_device, p.sent["tensor"], p.sent["pipeline"], p.sent["data"]
        (8960, 40960.0, 8192.0, 35840.0)
    """
    _check(model, layout)
    one_of("precision", precision, PRECISION_BYTES)
    if stage is not None:
        return _predict_stage(model, layout, cluster, precision, split_embeddings, stage)
    each = [_predict_stage(model, layout, cluster, precision, split_embeddings, s) for s in range(layout.pipeline)]
    fullest = max(each, key=lambda p: p.held_total)
    busiest = max(each, key=lambda p: p.sent_total)
    seconds = None if cluster is None else max(p.seconds for p in each)
    return Prediction(layout, fullest.params_per_device, fullest.held, busiest.sent, seconds, fullest.fits)


def _predict_stage(model: Model, layout: Layout, cluster: Cluster | None, precision: str, split_embeddings: bool,
                   stage: int) -> Prediction:
    value = PRECISION_BYTES[precision]
    count = params_per_device(model, layout, stage, split_embeddings)
    states = memory.model_states(count, layout.data * layout.context, layout.zero, "adam", precision)
    layers = model.layers // layout.pipeline
    first, last = stage == 0, stage == layout.pipeline - 1
    b, s, h, t = layout.micro_batch, model.seq // layout.context, model.hidden, layout.tensor
    m = layout.micro_batches
    in_flight = min(layout.pipeline - stage, m)
    if layout.recompute == "stage":  # only the stage's input, per micro-batch in flight
        kept = b * s * (4 if first else h * value)
    else:
        kept = layers * memory.transformer_activations(s, b, h, model.heads, t, False, layout.recompute, value)
    activations = kept * in_flight
    working = (b * s * model.vocab * 4 if last else 0)  # the loss's float32 logits
    if layout.recompute in ("full", "stage"):  # one layer's activations, recomputed during the backward pass
        working += memory.transformer_activations(s, b, h, model.heads, t, False, "none", value)
    boundary = s * b * h * value  # what crosses between stages, and what a tensor all-reduce sums
    # tensor: per block and micro-batch, 2 all-reduces forward and 2 backward (Megatron's g and f); recomputation
    # runs the forward again. Recomputing a whole stage, TensorFlow drops the stage's last all-reduce except on the
    # last stage: it makes the stage's output, which no backward op reads (a residual add's gradient needs no
    # forward values) but the last stage's final LayerNorm does. Megatron's per-layer recomputation reruns both.
    reduces = 4 * layers
    if layout.recompute == "full":
        reduces += 2 * layers
    elif layout.recompute == "stage":
        reduces += 2 * layers - (0 if last else 1)
    tensor_sent = m * reduces * collectives.formula_bytes("all_reduce", t, boundary)[0][0] if t > 1 else 0.0
    pipeline_sent = m * boundary * ((not last) + (not first)) if layout.pipeline > 1 else 0.0
    grad_bytes = count * (4 if precision == "fp32" else value)
    n = layout.data * layout.context
    data_sent = sharding.bytes_per_device(layout.zero, n, grad_bytes, m) if n > 1 else 0.0
    rerun = 1 if layout.recompute in ("full", "stage") else 0  # a recomputed forward sends its traffic again
    context_sent = 0.0
    if layout.context > 1:  # ring attention: C−1 sends of the key/value blocks forward; backward, the blocks and
        kv = 2 * b * (model.heads // t) * s * (h // model.heads) * value  # their gradients: 3 (C−1) in all
        context_sent = m * layers * (3 + rerun) * (layout.context - 1) * kv
    expert_sent = 0.0
    if layout.expert > 1 and model.experts > 1:  # two all-to-alls forward, two backward, of the routed tokens
        routed = b * s * model.top_k * h * value
        expert_sent = (m * layers * (4 + 2 * rerun)
                       * collectives.formula_bytes("all_to_all", layout.expert, routed)[0][0])
    held = {"weights": states.params, "gradients": states.grads, "optimizer": states.optimizer,
            "activations": float(activations), "working": float(working)}
    sent = {"tensor": tensor_sent, "pipeline": float(pipeline_sent), "data": float(data_sent),
            "context": context_sent, "expert": expert_sent}
    seconds = fits = None
    if cluster is not None:
        seconds = step_seconds(model, layout, cluster, sent, m, reduces)
        fits = sum(held.values()) <= memory.USABLE_FRACTION * cluster.memory_bytes
    return Prediction(layout, count, held, sent, seconds, fits)


def step_seconds(model: Model, layout: Layout, cluster: Cluster, sent: dict[str, float], micro_batches: int,
                 reduces: int) -> float:
    """Lesson 08's cost model: compute at ``efficiency`` of peak, stretched by the bubble, plus α-β communication."""
    tokens = layout.micro_batch * micro_batches * layout.data * model.seq
    per_token = costmodel.training_flops(model.active_params)  # 6 FLOPs per parameter a token uses
    if layout.recompute in ("full", "stage"):
        per_token += 2 * model.active_params  # the forward pass once more
    compute = per_token * tokens / (layout.devices * cluster.flops * cluster.efficiency)
    bubble = (layout.pipeline - 1) / (micro_batches + layout.pipeline - 1)
    compute /= 1 - bubble
    inside = layout.tensor * max(layout.expert, 1) <= cluster.per_node
    per_stage_layers = model.layers // layout.pipeline
    link = {"tensor": cluster.intra_bandwidth if layout.tensor <= cluster.per_node else cluster.inter_bandwidth,
            "expert": cluster.intra_bandwidth if inside else cluster.inter_bandwidth,
            "context": cluster.intra_bandwidth if layout.tensor * layout.context <= cluster.per_node
            else cluster.inter_bandwidth,
            "pipeline": cluster.inter_bandwidth,
            # devices are numbered tensor rank first, then context, then data: a data group fits in a node
            # when tensor · context · data devices do
            "data": cluster.intra_bandwidth if layout.tensor * layout.context * layout.data <= cluster.per_node
            else cluster.inter_bandwidth}
    messages = {"tensor": micro_batches * reduces * 2 * max(layout.tensor - 1, 0),
                "pipeline": 2 * micro_batches,
                "data": sharding.phases(layout.zero, micro_batches) * max(layout.data * layout.context - 1, 0),
                "context": micro_batches * per_stage_layers * 4 * max(layout.context - 1, 0),
                "expert": micro_batches * per_stage_layers * 6 * max(layout.expert - 1, 0)}
    communication = sum(sent[a] / link[a] + (messages[a] * cluster.alpha_s if sent[a] else 0.0) for a in sent)
    return compute + communication


def layouts(model: Model, devices: int, global_batch: int, zero_stages: tuple[int, ...] = (0, 1, 2, 3),
            recompute: tuple[str, ...] = ("none", "selective", "full"),
            micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
            max_tensor: int = 8) -> list[Layout]:
    """Every layout of ``devices`` devices for ``global_batch`` sequences per step that divides the model evenly."""
    whole_number("devices", devices)
    whole_number("global_batch", global_batch)
    found = []
    divisors = [k for k in range(1, devices + 1) if devices % k == 0]
    for tensor, pipeline, context in itertools.product(divisors, divisors, divisors):
        if tensor > max_tensor or devices % (tensor * pipeline * context):
            continue
        data = devices // (tensor * pipeline * context)
        expert_options = [e for e in divisors if e <= data * context and model.experts % e == 0] if model.experts > 1 \
            else [1]
        for expert, zero, rec, m in itertools.product(expert_options, zero_stages, recompute, micro_batches):
            if global_batch % (data * m):
                continue
            layout = Layout(data, tensor, pipeline, context, expert, zero, global_batch // (data * m), m, rec)
            try:
                _check(model, layout)
            except BadArgument:
                continue
            found.append(layout)
    return found


def plan(model: Model, cluster: Cluster, global_batch: int, max_sent: float | None = None,
         precision: str = "mixed", **options: Any) -> list[Prediction]:
    """The layouts that fit (and send at most ``max_sent`` bytes per device per step), fastest first."""
    positive_number("global_batch", global_batch)
    kept = []
    for layout in layouts(model, cluster.devices, global_batch, **options):
        prediction = predict(model, layout, cluster, precision)
        if prediction.fits and (max_sent is None or prediction.sent_total <= max_sent):
            kept.append(prediction)
    return sorted(kept, key=lambda p: (p.seconds, p.held_total))


def why_not(model: Model, layout: Layout, cluster: Cluster, max_sent: float | None = None,
            precision: str = "mixed") -> str:
    """Why a layout fails a job, in a sentence (an empty string when it doesn't)."""
    if layout.devices != cluster.devices:
        return (f"it uses {layout.devices} devices (data × tensor × pipeline × context), but the job has "
                f"{cluster.devices}.")
    try:
        prediction = predict(model, layout, cluster, precision)
    except BadArgument as error:
        return str(error)
    if not prediction.fits:
        held = prediction.held
        worst = max(held, key=held.get)
        n = layout.data * layout.context
        further = "more tensor or pipeline parallelism divides it further"
        remedy = {"optimizer": f"a ZeRO stage of 1 or more splits it over the {n} data-parallel devices"
                               if layout.zero < 1 or n == 1 else f"it is split {n} ways already: {further}",
                  "gradients": f"ZeRO-2 or 3 splits them over the {n} data-parallel devices"
                               if layout.zero < 2 or n == 1 else f"they are split {n} ways already: {further}",
                  "weights": "ZeRO-3, or more tensor or pipeline parallelism, splits them" if layout.zero < 3
                             else f"they are split {n} ways already: {further}",
                  "activations": "recomputation or a smaller micro-batch (more micro-batches) shrinks them"
                                 if layout.recompute == "none" else "a smaller micro-batch, or tensor or context "
                                                                    "parallelism, shrinks them",
                  "working": "a smaller micro-batch, or tensor or context parallelism, shrinks it"}[worst]
        return (f"it needs {prediction.held_total / 2**30:,.1f} GiB on its fullest device, more than "
                f"{memory.USABLE_FRACTION:.0%} of {cluster.memory_bytes / 2**30:,.0f} GiB; the largest part is "
                f"{worst} ({held[worst] / 2**30:,.1f} GiB): {remedy}.")
    if max_sent is not None and prediction.sent_total > max_sent:
        axis = max(prediction.sent, key=prediction.sent.get)
        remedy = {"tensor": "a lower tensor degree (its all-reduces grow with every token of every micro-batch)",
                  "data": "ZeRO-1 or plain data parallelism (ZeRO-2 and 3 send per micro-batch), or fewer "
                          "data-parallel devices",
                  "pipeline": "fewer pipeline stages or a smaller micro-batch",
                  "context": "a lower context degree", "expert": "a lower expert degree"}[axis]
        return (f"its busiest device sends {prediction.sent_total / 1e9:,.2f} GB per step, more than the "
                f"{max_sent / 1e9:,.2f} GB allowed; most of it on the {axis} axis: try {remedy}.")
    return ""


#: The course's puzzles: a model, a cluster, a global batch (sequences per step), and at most how many bytes
#: each device may send per step (None: no limit).
PUZZLES: dict[str, tuple[Model, Cluster, int, float | None]] = {
    "65B on 64 H100s": (Model(layers=80, hidden=8192, heads=64, seq=4096, vocab=32000),
                        Cluster(devices=64, memory_bytes=80 * 2**30, flops=989e12), 1024, 50e9),
    "6.7B on 8 T4s": (Model(layers=32, hidden=4096, heads=32, seq=2048, vocab=32000),
                    Cluster(devices=8, memory_bytes=15 * 2**30, flops=65e12, intra_bandwidth=16e9,
                            inter_bandwidth=16e9), 64, None),  # PCIe 3.0 x16: about 16 GB/s each way
}


def judge(puzzle: str, layout: Any, precision: str = "mixed") -> str:
    """Why ``layout`` fails the puzzle (a sentence), or an empty string when it solves it."""
    one_of("puzzle", puzzle, PUZZLES)
    model, cluster, global_batch, max_sent = PUZZLES[puzzle]
    if not isinstance(layout, Layout):
        return f"expected a planner.Layout(data=…, tensor=…, pipeline=…, …), got {type(layout).__name__}."
    batch = layout.data * layout.micro_batch * layout.micro_batches
    if batch != global_batch:
        return (f"it trains on data × micro-batch × micro-batches = {layout.data} × {layout.micro_batch} × "
                f"{layout.micro_batches} = {batch} sequences per step; the job's global batch is {global_batch}.")
    return why_not(model, layout, cluster, max_sent, precision)
