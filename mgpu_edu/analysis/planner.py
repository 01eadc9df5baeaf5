"""Choose a layout for a training job: enumerate data × tensor × pipeline × context × expert degrees, sequence
parallelism, interleaved pipeline stages, ZeRO stages, micro-batches and recomputation; keep those that fit;
rank them by predicted step time.

Every prediction is a count, per device, of the busiest stage: the model states (:func:`memory.stage_params`
through :func:`memory.model_states`: values, gradients, optimizer; the embedding on the first stage and the
head on the last, the blocks split over the stages as :func:`memory.stage_layers` says), the activations a
stage keeps in flight (:meth:`memory.Transformer.layer_activations` × :func:`memory.in_flight`, or only each
stage's input with ``recompute="stage"``), and the bytes sent per step by each axis with lesson 12's formulas:
tensor parallelism's all-reduces of s·b·h (or, with sequence parallelism, as many bytes in all-gathers and
reduce-scatters, and the two all-gathers per block that the backward pass repeats), the pipeline's activations
and their gradients between stages, the data axis's gradient and weight traffic
(:func:`sharding.bytes_per_device`), context parallelism's key/value ring and expert parallelism's two all-to-
alls. The step time is lesson 08's cost model: the stage's training FLOPs
(:func:`costmodel.transformer_flops`, recomputation's extra included) at a fraction of the devices' peak,
stretched by the pipeline's bubble, (P − 1)/(V·M) of the ideal time (Narayanan et al., 2021, §2.2), plus each
axis's communication by lesson 03's α-β model, at the bandwidth of the link that axis crosses (inside a node
for tensor and expert parallelism when they fit in one; between nodes otherwise), none of it overlapped unless
``overlap`` says which share of each axis's runs behind the computation. It is a model: it ranks layouts; it
does not promise seconds.

Besides what is kept between a micro-batch's forward and backward passes, it counts the working memory of the
backward pass: the loss's float32 logits on the last stage and, with recomputation, what one layer recomputes
at a time, its activations or (selective) its attention scores ("working"). It leaves out ZeRO-3's gathered
layer, communication buffers, the CUDA context and fragmentation (the 10 % of memory it keeps spare stands for
them). Pipeline traffic is charged at the link between nodes (conservative when
stages share a node). Without sequence parallelism each tensor rank sends its whole copy of a stage's output
to the next stage, as the course's layouts do; with it, its share.

The counts for the course's tiny GPT equal what lesson 16's 3-D run measured (the lesson asserts it); the
published figures it reproduces (the ZeRO paper, Narayanan et al., Korthikanti et al., Llama 3, the
Ultra-Scale Playbook) are checked in tests/test_published_runs.py, each beside its source.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, positive_number, real_number, whole_number
from mgpu_edu.analysis import costmodel, memory
from mgpu_edu.parallelism import pipeline, sharding

RECOMPUTE = ("none", "selective", "full", "stage")

#: A transformer's shape: the planner's and the memory calculator's are one class, so its parameters are
#: counted in one place (:class:`memory.Transformer`).
Model = memory.Transformer


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The devices: how many, memory each (bytes), per-device peak (FLOP/s), and the links inside and between
    nodes (bytes/s, with α the latency of one message); ``efficiency`` is the share of peak that the matrix
    products reach."""

    devices: int
    memory_bytes: float
    flops: float
    per_node: int = 8
    intra_bandwidth: float = 450e9
    inter_bandwidth: float = 50e9
    alpha_s: float = 5e-6
    efficiency: float = 0.4

    def __post_init__(self) -> None:
        whole_number("devices", self.devices, where="Cluster")
        whole_number("per_node", self.per_node, where="Cluster")
        for name in ("memory_bytes", "flops", "intra_bandwidth", "inter_bandwidth"):
            positive_number(name, getattr(self, name))
        real_number("efficiency", self.efficiency, 0, 1, above=True, hint="It is the share of peak reached.")
        real_number("alpha_s", self.alpha_s, minimum=0)


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the job: the degree of each axis, the ZeRO stage, the micro-batch size, the number of
    micro-batches per step (a pipeline's, or gradient accumulation's), and what the backward pass recomputes.

    ``sequence_parallel`` (Korthikanti et al., 2022) splits what tensor parallelism leaves whole along the
    sequence; it is on whenever ``tensor`` > 1 unless set False. ``virtual_stages`` V > 1 is the interleaved
    1F1B schedule: V chunks of layers per device, a bubble V times smaller, V times the pipeline's messages
    (Narayanan et al., 2021, §2.2.2); where a stage's layers don't split evenly into V chunks (Llama 3's 126
    layers on 16 stages), its chunks are counted at their average size. ``dataclasses.replace`` keeps the
    resolved ``sequence_parallel``: pass ``sequence_parallel=None`` with a new tensor degree to resolve it
    again. ``reshard=False`` keeps ZeRO-3's gathered weights from the forward pass for the backward (PyTorch
    FSDP's ``reshard_after_forward=False``): the stage's whole 16-bit weights held, and one gather per step
    (:func:`sharding.phases`).
    """

    data: int
    tensor: int
    pipeline: int
    context: int = 1
    expert: int = 1
    zero: int = 0
    micro_batch: int = 1
    micro_batches: int = 1
    recompute: str = "none"
    sequence_parallel: bool | None = None
    virtual_stages: int = 1
    reshard: bool = True

    def __post_init__(self) -> None:
        on = self.sequence_parallel is None or bool(self.sequence_parallel)
        object.__setattr__(self, "sequence_parallel", on and isinstance(self.tensor, int) and self.tensor > 1)

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline * self.context

    def describe(self) -> str:
        parts = [f"DP {self.data}", f"TP {self.tensor}" + (" (SP)" if self.sequence_parallel else ""),
                 f"PP {self.pipeline}" + (f" (×{self.virtual_stages} interleaved)" if self.virtual_stages > 1 else "")]
        parts += [f"CP {self.context}"] * (self.context > 1) + [f"EP {self.expert}"] * (self.expert > 1)
        zero = f"ZeRO-{self.zero}" + (" (no reshard)" if not self.reshard else "")
        return (" × ".join(parts) + f", {zero}, micro-batch {self.micro_batch} × {self.micro_batches}, "
                f"recompute {self.recompute}")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What a layout costs per device: bytes held (by kind) and sent per step (by axis), on the busiest device,
    the predicted step time in seconds, where it goes (``time``: the compute, the pipeline's bubble and each
    axis's communication, on the slowest stage) and the model-FLOPs utilisation it implies (``None`` when no
    cluster was given)."""

    layout: Layout
    params_per_device: int
    held: dict[str, float]
    sent: dict[str, float]
    seconds: float | None = None
    fits: bool | None = None
    mfu: float | None = None
    time: dict[str, float] | None = None

    @property
    def held_total(self) -> float:
        return sum(self.held.values())

    @property
    def sent_total(self) -> float:
        return sum(self.sent.values())


def _check(model: Model, layout: Layout) -> None:
    for name in ("data", "tensor", "pipeline", "context", "expert", "micro_batch", "micro_batches",
                 "virtual_stages"):
        whole_number(name, getattr(layout, name))
    whole_number("zero", layout.zero, minimum=0, maximum=3, hint="ZeRO has stages 0 (none), 1, 2 and 3.")
    one_of("recompute", layout.recompute, RECOMPUTE)
    t, p, v = layout.tensor, layout.pipeline, layout.virtual_stages
    if p > model.layers:
        raise BadArgument(f"pipeline={p} is more stages than the {model.layers} layers: each stage needs at least "
                          f"one; pick at most {model.layers}.")
    if model.heads % t or model.kv % t or model.width % t:
        raise BadArgument(f"tensor={t} must divide the {model.heads} heads, the {model.kv} key/value heads and the "
                          f"MLP's {model.width}: pick a common divisor.")
    if model.seq % layout.context:
        raise BadArgument(f"context={layout.context} must divide the sequence length {model.seq}.")
    if layout.sequence_parallel and model.seq // layout.context % t:
        raise BadArgument(f"sequence parallelism splits each device's {model.seq // layout.context} tokens over the "
                          f"tensor={t} ranks: pick a tensor degree that divides them, or sequence_parallel=False.")
    if model.experts % layout.expert or (layout.expert > 1 and layout.data * layout.context % layout.expert):
        raise BadArgument(f"expert={layout.expert} must divide the {model.experts} experts and the data × context "
                          f"degree ({layout.data * layout.context}), whose devices it spreads them over.")
    if v > 1 and (p == 1 or layout.micro_batches % p or min(memory.stage_layers(model.layers, p)) < v):
        raise BadArgument(f"virtual_stages={v} (the interleaved schedule) needs a pipeline, a number of micro-batches "
                          f"that is a multiple of pipeline={p} (it has {layout.micro_batches}), and at least {v} "
                          f"layers on every stage, one per chunk: use virtual_stages=1, or change those.")
    if v > 1 and layout.recompute == "stage":
        raise BadArgument(f"recompute='stage' keeps one input per stage, as the course's 3-D run does; with "
                          f"virtual_stages={v} each chunk keeps its own: use recompute='full'.")
    if not layout.reshard and layout.zero != 3:
        raise BadArgument(f"reshard=False keeps ZeRO-3's gathered weights; zero={layout.zero} gathers none: use "
                          "zero=3, or leave reshard=True.")


def params_per_device(model: Model, layout: Layout, stage: int = 0, split_embeddings: bool = False) -> int:
    """Parameters one device of pipeline stage ``stage`` holds before ZeRO-3 divides them: :func:`memory.stage_params`
    for the layout's tensor, pipeline and expert degrees."""
    _check(model, layout)
    return memory.stage_params(model, layout.tensor, layout.pipeline, stage, layout.expert, split_embeddings)


def predict(model: Model, layout: Layout, cluster: Cluster | None = None, precision: str = "mixed",
            split_embeddings: bool = False, stage: int | None = None,
            overlap: dict[str, float] | None = None) -> Prediction:
    """Bytes held and sent per step by a device of pipeline stage ``stage``, and with a ``cluster`` the predicted step
    time, the MFU it implies and whether it fits. With ``stage=None``, the worst over the stages: what the
    fullest stage holds, what the busiest sender sends (a middle stage sends both activations and gradients),
    and the slowest stage's step.

    ``precision`` is one of ``memory.PRECISIONS``: 16-bit activations unless ``"fp32"``. ``overlap`` gives, per
    axis (``"data"``, ``"tensor"``, ``"pipeline"``, ``"context"``, ``"expert"``), the share of its communication
    that runs behind computation: each axis's hidden part is taken from the stage's compute, in that order,
    until the compute is used up, and ``time`` then holds what is left exposed. None overlaps nothing.

    Example:
        >>> tiny = Model(layers=2, hidden=32, heads=4, seq=16, vocab=64)
        >>> layout = Layout(2, 2, 2, zero=1, micro_batches=4, recompute="stage", sequence_parallel=False)
        >>> p = predict(tiny, layout, precision="fp32", stage=0)
        >>> p.params_per_device, p.sent["tensor"], p.sent["pipeline"], p.sent["data"]
        (8960, 40960.0, 8192.0, 35840.0)
    """
    if not isinstance(model, Model) or not isinstance(layout, Layout) or not isinstance(cluster, Cluster | None):
        raise BadArgument(f"predict(model, layout, cluster) takes a planner.Model, a planner.Layout and a "
                          f"planner.Cluster (or None); got {type(model).__name__}, {type(layout).__name__} and "
                          f"{type(cluster).__name__}.")
    _check(model, layout)
    one_of("precision", precision, memory.PRECISIONS)
    whole_number("stage", 0 if stage is None else stage, minimum=0, maximum=layout.pipeline - 1,
                 hint="Stages are numbered from 0.")
    for axis, share in (overlap or {}).items():
        one_of("overlap axis", axis, OVERLAP_AXES)
        real_number(f"overlap[{axis!r}]", share, 0, 1, hint="It is the share of that axis's communication hidden.")
    return _predict(model, layout, cluster, precision, split_embeddings, stage, overlap=overlap)


#: The axes whose communication :func:`predict` can hide behind computation, in the order it hides them.
OVERLAP_AXES = ("data", "context", "tensor", "expert", "pipeline")


def _predict(model: Model, layout: Layout, cluster: Cluster | None, precision: str, split_embeddings: bool,
             stage: int | None, fitting: bool = False, overlap: dict[str, float] | None = None) -> Prediction | None:
    """:func:`predict` for a layout already checked; with ``fitting``, None for a layout that doesn't fit."""
    job = _Job(model, layout, cluster, precision, split_embeddings)
    job.overlap = dict(overlap or {})
    if stage is not None:
        return job.stage(stage)
    held = [job.held(s) for s in range(layout.pipeline)]
    if fitting and not all(job.fits(h) for _, h in held):
        return None
    each = [job.stage(s, h) for s, h in enumerate(held)]
    fullest = max(each, key=lambda p: p.held_total)
    busiest = max(each, key=lambda p: p.sent_total)
    if cluster is None:
        return Prediction(layout, fullest.params_per_device, fullest.held, busiest.sent)
    slowest = max(each, key=lambda p: p.seconds)
    return Prediction(layout, fullest.params_per_device, fullest.held, busiest.sent, slowest.seconds, fullest.fits,
                      slowest.mfu, slowest.time)


class _Job:
    """What every stage of one layout shares, worked out once; :meth:`stage` counts one stage."""

    def __init__(self, model: Model, layout: Layout, cluster: Cluster | None, precision: str,
                 split_embeddings: bool) -> None:
        self.model, self.layout, self.cluster = model, layout, cluster
        self.precision, self.split_embeddings = precision, split_embeddings
        self.overlap: dict[str, float] = {}  # per axis, the share of its communication hidden behind compute
        lay, t, c = layout, layout.tensor, layout.context
        self.value = memory.PRECISIONS[precision][0]
        self.layers = memory.stage_layers(model.layers, lay.pipeline)
        self.tokens = model.seq // c * lay.micro_batch  # one micro-batch's tokens on one device
        self.boundary = self.tokens * model.hidden * self.value  # a stage's output; what a tensor all-reduce sums
        recompute = "full" if lay.recompute == "stage" else lay.recompute  # a stage recomputes all its layers
        args = (lay.micro_batch, t, lay.sequence_parallel)
        self.kept_layer = model.layer_activations(*args, recompute, self.value, c)
        self.working_layer = model.layer_activations(*args, "none", self.value, c)
        self.flops = costmodel.transformer_flops(model, recompute)
        self.model_flops = costmodel.transformer_flops(model) if recompute != "none" else self.flops

    def held(self, stage: int) -> tuple[int, dict[str, float]]:
        """The parameters one device of ``stage`` holds, and its bytes held by kind (:func:`memory.stage_memory`)."""
        model, lay = self.model, self.layout
        t, p = lay.tensor, lay.pipeline
        first, last = stage == 0, stage == p - 1
        count = memory.stage_params(model, t, p, stage, lay.expert, self.split_embeddings)
        if lay.recompute == "stage":  # only the stage's input, per micro-batch in flight: a layer's worth on each
            kept = self.tokens * 4 if first else self.boundary / (t if lay.sequence_parallel else 1)
            per_layer = kept / self.layers[stage]
        else:
            per_layer = self.kept_layer
        held = memory.stage_memory(model, per_layer, stage, lay.data * lay.context, t, p, lay.zero, lay.micro_batches,
                                   "adam", self.precision, lay.expert, lay.virtual_stages, self.split_embeddings,
                                   lay.reshard, count)
        logits = self.tokens * model.vocab * 4 / (t if self.split_embeddings else 1)
        working = logits if last else 0.0  # the loss's float32 logits
        if lay.recompute in ("full", "stage"):  # one layer's activations, recomputed during the backward pass
            working += self.working_layer
        elif lay.recompute == "selective":  # one layer's attention scores, recomputed during the backward pass
            working += self.working_layer - self.kept_layer
        return count, {"weights": held.params, "gradients": held.grads, "optimizer": held.optimizer,
                       "activations": float(held.activations), "working": float(working)}

    def fits(self, held: dict[str, float]) -> bool:
        return sum(held.values()) <= memory.USABLE_FRACTION * self.cluster.memory_bytes

    def stage(self, stage: int, held: tuple[int, dict[str, float]] | None = None) -> Prediction:
        model, lay, value = self.model, self.layout, self.value
        t, p, v, m = lay.tensor, lay.pipeline, lay.virtual_stages, lay.micro_batches
        first, last = stage == 0, stage == p - 1
        layers = self.layers[stage]
        count, held = held or self.held(stage)
        n = lay.data * lay.context
        sp = lay.sequence_parallel
        # tensor: per block and micro-batch, 2 all-reduces forward and 2 backward (Megatron's g and f), or with
        # sequence parallelism an all-gather and a reduce-scatter for each, as many bytes, plus the all-gathers the
        # backward repeats (Megatron-LM keeps each linear's input split and gathers it again); recomputation runs the
        # forward again. Recomputing a whole stage, TensorFlow drops the stage's last all-reduce except on the last
        # stage: it makes the stage's output, which no backward op reads (a residual add's gradient needs no
        # forward values) but the last stage's final LayerNorm does. Megatron's per-layer recomputation reruns both.
        reduces = 4 * layers
        if lay.recompute == "full":
            reduces += 2 * layers
        elif lay.recompute == "stage":
            reduces += 2 * layers - (0 if last else 1)
        tensor_sent = m * reduces * 2 * (t - 1) / t * self.boundary
        if sp:  # the weights' gradients need each linear's whole input: gathered again in the backward pass
            tensor_sent += m * 2 * layers * (t - 1) / t * self.boundary
        # pipeline: each micro-batch's activations forward and gradients back, V times with V chunks per device
        pipeline_sent = 0.0
        if p > 1:
            pipeline_sent = m * (2 * v - last - first) * self.boundary / (t if sp else 1)
        grad_bytes = count * (2 if self.precision == "mixed" else 4)
        data_sent = sharding.bytes_per_device(lay.zero, n, grad_bytes, m, lay.reshard) if n > 1 else 0.0
        rerun = 1 if lay.recompute in ("full", "stage") else 0  # a recomputed forward sends its traffic again
        context_sent = 0.0
        if lay.context > 1:  # ring attention: C−1 sends of the key/value blocks forward; backward, the blocks and
            kv = 2 * self.tokens * (model.kv // t) * (model.hidden // model.heads) * value  # their gradients
            context_sent = m * layers * (3 + rerun) * (lay.context - 1) * kv
        expert_sent = 0.0
        if lay.expert > 1 and model.experts > 1:  # two all-to-alls forward, two backward, of the routed tokens
            routed = self.tokens * model.top_k * model.hidden * value
            expert_sent = m * layers * (4 + 2 * rerun) * (lay.expert - 1) / lay.expert * routed
        sent = {"tensor": tensor_sent, "pipeline": pipeline_sent, "data": float(data_sent),
                "context": context_sent, "expert": expert_sent}
        if self.cluster is None:
            return Prediction(lay, count, held, sent)
        time = self._seconds(layers, last, sent, reduces)
        seconds = sum(time.values())
        tokens_per_step = lay.micro_batch * m * lay.data * model.seq
        mfu = self.model_flops.total * tokens_per_step / (seconds * lay.devices * self.cluster.flops)
        return Prediction(lay, count, held, sent, seconds, self.fits(held), mfu, time)

    def _seconds(self, layers: int, last: bool, sent: dict[str, float], reduces: int) -> dict[str, float]:
        """Lesson 08's cost model for one stage, in seconds: its compute at ``efficiency`` of peak, the bubble, and
        each axis's α-β communication."""
        model, lay, cluster = self.model, self.layout, self.cluster
        m = lay.micro_batches
        flops = self.flops.layer * layers + (self.flops.head if last else 0.0)  # per token, the whole stage's
        per_device = flops * lay.micro_batch * model.seq / (lay.tensor * lay.context)  # one micro-batch
        bubble = pipeline.bubble_ratio(lay.pipeline, m, lay.virtual_stages)
        compute = per_device * m / (cluster.flops * cluster.efficiency)
        inside = lay.tensor * max(lay.expert, 1) <= cluster.per_node
        link = {"tensor": cluster.intra_bandwidth if lay.tensor <= cluster.per_node else cluster.inter_bandwidth,
                "expert": cluster.intra_bandwidth if inside else cluster.inter_bandwidth,
                "context": cluster.intra_bandwidth if lay.tensor * lay.context <= cluster.per_node
                else cluster.inter_bandwidth,
                "pipeline": cluster.inter_bandwidth,
                # devices are numbered tensor rank first, then context, then data: a data group fits in a node
                # when tensor · context · data devices do
                "data": cluster.intra_bandwidth if lay.tensor * lay.context * lay.data <= cluster.per_node
                else cluster.inter_bandwidth}
        messages = {"tensor": m * reduces * 2 * max(lay.tensor - 1, 0),
                    "pipeline": 2 * m * lay.virtual_stages,
                    "data": sharding.phases(lay.zero, m, lay.reshard) * max(lay.data * lay.context - 1, 0),
                    "context": m * layers * 4 * max(lay.context - 1, 0),
                    "expert": m * layers * 6 * max(lay.expert - 1, 0)}
        time = {a: sent[a] / link[a] + (messages[a] * cluster.alpha_s if sent[a] else 0.0) for a in sent}
        behind = compute  # what the hidden communication can run behind: the stage's computation, once
        for axis in OVERLAP_AXES:
            hidden = min(self.overlap.get(axis, 0.0) * time[axis], behind)
            time[axis] -= hidden
            behind -= hidden
        return {"compute": compute, "bubble": compute * bubble, **time}


def layouts(model: Model, devices: int, global_batch: int, zero_stages: tuple[int, ...] = (0, 1, 2, 3),
            recompute: tuple[str, ...] = ("none", "selective", "full"),
            micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), max_tensor: int = 8,
            sequence_parallel: tuple[bool, ...] = (True, False), virtual_stages: tuple[int, ...] = (1, 2)
            ) -> list[Layout]:
    """Every layout of ``devices`` devices for ``global_batch`` sequences per step that the model allows (with a
    single data-parallel device, only the first of ``zero_stages``: ZeRO then has nothing to split).

    Example:
        >>> tiny = Model(layers=2, hidden=32, heads=4, seq=16, vocab=64)
        >>> len(layouts(tiny, 4, 8, zero_stages=(0,), recompute=("none",), micro_batches=(1,)))
        13
    """
    whole_number("devices", devices)
    whole_number("global_batch", global_batch)
    found = []
    divisors = [k for k in range(1, devices + 1) if devices % k == 0]
    for tensor, stages, context in itertools.product(divisors, divisors, divisors):
        if tensor > max_tensor or devices % (tensor * stages * context):
            continue
        data = devices // (tensor * stages * context)
        expert_options = [e for e in divisors if e <= data * context and model.experts % e == 0] if model.experts > 1 \
            else [1]
        stages_of_zero = zero_stages if data * context > 1 else zero_stages[:1]  # one device: ZeRO splits nothing
        for expert, zero, rec, m, sp, v in itertools.product(expert_options, stages_of_zero, recompute, micro_batches,
                                                             sequence_parallel if tensor > 1 else (False,),
                                                             virtual_stages if stages > 1 else (1,)):
            if global_batch % (data * m):
                continue
            layout = Layout(data, tensor, stages, context, expert, zero, global_batch // (data * m), m, rec, sp, v)
            try:
                _check(model, layout)
            except BadArgument:
                continue
            found.append(layout)
    return found


def plan(model: Model, cluster: Cluster, global_batch: int, max_sent: float | None = None,
         precision: str = "mixed", split_embeddings: bool = False, **options: Any) -> list[Prediction]:
    """The layouts that fit (and send at most ``max_sent`` bytes per device per step), fastest first.

    ``options`` go to :func:`layouts` (e.g. ``sequence_parallel=(False,)`` to leave it out).
    """
    positive_number("global_batch", global_batch)
    kept = []
    one_of("precision", precision, memory.PRECISIONS)
    for layout in layouts(model, cluster.devices, global_batch, **options):  # each checked by layouts
        prediction = _predict(model, layout, cluster, precision, split_embeddings, None, fitting=True)
        if prediction is not None and (max_sent is None or prediction.sent_total <= max_sent):
            kept.append(prediction)
    return sorted(kept, key=lambda p: (p.seconds, p.held_total))


def why_not(model: Model, layout: Layout, cluster: Cluster, max_sent: float | None = None,
            precision: str = "mixed", split_embeddings: bool = False) -> str:
    """Why a layout fails a job, in a sentence (an empty string when it doesn't)."""
    if layout.devices != cluster.devices:
        return (f"it uses {layout.devices} devices (data × tensor × pipeline × context), but the job has "
                f"{cluster.devices}.")
    try:
        prediction = predict(model, layout, cluster, precision, split_embeddings)
    except BadArgument as error:
        return str(error)
    if not prediction.fits:
        held = prediction.held
        worst = max(held, key=held.get)
        n = layout.data * layout.context
        m, p = layout.micro_batches, layout.pipeline
        crowded = m < p  # the first stage keeps every micro-batch in flight: more of them don't shrink its share
        shrink = (["sequence parallelism"] if layout.tensor > 1 and not layout.sequence_parallel else []) + \
            (["recomputation"] if layout.recompute == "none" else []) + \
            (["a smaller micro-batch (more micro-batches)"] if layout.micro_batch > 1 and not crowded else []) + \
            ["spreading each sequence over more devices (tensor or context parallelism)"]
        note = "" if not crowded else (
            f"; with {m} micro-batch{'es' if m != 1 else ''} on {p} stages the first stage keeps every one in "
            "flight, so a split that only adds micro-batches leaves its share as it is until they outnumber the "
            "stages")
        def spread(it: str) -> str:  # every device holds a 1/N share already
            return (f"{it} split over all {layout.devices} devices already (ZeRO over the {n} data-parallel ones, "
                    "tensor and pipeline parallelism for the rest): make room in the other parts"
                    + (" (ZeRO-3 for the weights)" if layout.zero < 3 else "") + ", or use more devices")

        def alone(stage: int) -> str:  # ZeRO has a single data × context device to split over
            return ("ZeRO splits the model states over the data × context devices, and here there is one: trade "
                    f"some tensor or pipeline ranks for data or context ranks, with ZeRO-{stage}")

        remedy = {"optimizer": alone(1) if n == 1 else f"ZeRO-1 or more splits it over the {n} data-parallel "
                               "devices" if layout.zero < 1 else spread("it is"),
                  "gradients": alone(2) if n == 1 else f"ZeRO-2 or 3 splits them over the {n} data-parallel "
                               "devices" if layout.zero < 2 else spread("they are"),
                  "weights": alone(3) if n == 1 else "ZeRO-3, or more tensor or pipeline parallelism, splits them"
                             if layout.zero < 3 else spread("they are"),
                  "activations": ", ".join(shrink[:-1]) + (" or " if len(shrink) > 1 else "") + shrink[-1]
                                 + " shrinks them" + note,
                  "working": "fewer tokens per device shrink it: a smaller micro-batch, or context parallelism"}[worst]
        return (f"it needs {prediction.held_total / 2**30:,.1f} GiB on its fullest device, more than "
                f"{memory.USABLE_FRACTION:.0%} of {cluster.memory_bytes / 2**30:,.0f} GiB; the largest part is "
                f"{worst} ({held[worst] / 2**30:,.1f} GiB): {remedy}.")
    if max_sent is not None and prediction.sent_total > max_sent:
        axis = max(prediction.sent, key=prediction.sent.get)
        remedy = {"tensor": "a lower tensor degree (its all-reduces grow with every token of every micro-batch)",
                  "data": "ZeRO-1 or plain data parallelism (ZeRO-2 and 3 send per micro-batch), or fewer "
                          "data-parallel devices",
                  "pipeline": "fewer pipeline stages, fewer interleaved chunks, or a smaller micro-batch",
                  "context": "a lower context degree", "expert": "a lower expert degree"}[axis]
        return (f"its busiest device sends {prediction.sent_total / 1e9:,.2f} GB per step, more than the "
                f"{max_sent / 1e9:,.2f} GB allowed; most of it on the {axis} axis: try {remedy}.")
    return ""


def _llama3_405b(seq: int) -> Model:
    """Llama 3 405B's shape (the Llama 3 paper, Table 3), with a FlashAttention-style kernel."""
    return Model(layers=126, hidden=16384, heads=128, seq=seq, vocab=128_000, ffn=53248, kv_heads=8, mlp="swiglu",
                 bias=False, positions=False, attention="flash")


#: The course's puzzles: a model, a cluster, a global batch (sequences per step), and at most how many bytes
#: each device may send per step (None: no limit).
PUZZLES: dict[str, tuple[Model, Cluster, int, float | None]] = {
    "65B on 64 H100s": (Model(layers=80, hidden=8192, heads=64, seq=4096, vocab=32000),
                        Cluster(devices=64, memory_bytes=80 * 2**30, flops=989e12), 1024, 50e9),
    "6.7B on 8 T4s": (Model(layers=32, hidden=4096, heads=32, seq=2048, vocab=32000),
                      Cluster(devices=8, memory_bytes=15 * 2**30, flops=65e12, intra_bandwidth=16e9,
                              inter_bandwidth=16e9), 64, None),  # PCIe 3.0 x16: about 16 GB/s each way
    "1.4B on 4 T4s": (Model(layers=24, hidden=2048, heads=16, seq=2048, vocab=50257),
                      Cluster(devices=4, memory_bytes=15 * 2**30, flops=65e12, intra_bandwidth=16e9,
                              inter_bandwidth=16e9), 32, None),  # a Colab-sized job: 4 T4s on PCIe
    "13B on 16 T4s": (Model(layers=40, hidden=5120, heads=40, seq=2048, vocab=32000),
                      Cluster(devices=16, memory_bytes=15 * 2**30, flops=65e12, intra_bandwidth=16e9,
                              inter_bandwidth=12.5e9), 64, None),  # two nodes of 8, 100 Gb/s between them
    "65B at 32K tokens on 64 H100s": (Model(layers=80, hidden=8192, heads=64, seq=32768, vocab=32000),
                                      Cluster(devices=64, memory_bytes=80 * 2**30, flops=989e12), 64, None),
    "Llama 3 405B at 128K tokens on 16,384 H100s": (_llama3_405b(131072),
                                                     Cluster(devices=16384, memory_bytes=80 * 2**30, flops=989e12),
                                                     128, None),
}
#: How a puzzle's job keeps its states and its embedding, where not as :func:`predict`'s defaults.
PUZZLE_OPTIONS: dict[str, dict[str, Any]] = {
    "Llama 3 405B at 128K tokens on 16,384 H100s": {"precision": "mixed_fp32_grads", "split_embeddings": True},
}
#: The jobs the Planner widget offers (the others are exercises whose answers it would show).
WIDGET_JOBS = ("65B on 64 H100s", "1.4B on 4 T4s")


def judge(puzzle: str, layout: Any) -> str:
    """Why ``layout`` fails the puzzle (a sentence), or an empty string when it solves it (counted with the
    puzzle's :data:`PUZZLE_OPTIONS`)."""
    one_of("puzzle", puzzle, PUZZLES)
    model, cluster, global_batch, max_sent = PUZZLES[puzzle]
    if not isinstance(layout, Layout):
        return f"expected a planner.Layout(data=…, tensor=…, pipeline=…, …), got {type(layout).__name__}."
    batch = layout.data * layout.micro_batch * layout.micro_batches
    if batch != global_batch:
        return (f"it trains on data × micro-batch × micro-batches = {layout.data} × {layout.micro_batch} × "
                f"{layout.micro_batches} = {batch} sequences per step; the job's global batch is {global_batch}.")
    return why_not(model, layout, cluster, max_sent, **PUZZLE_OPTIONS.get(puzzle, {}))


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A training run as its paper reports it: the model, the layout, the devices, and what was measured.

    ``step_seconds`` (a measured step), ``tflops_per_device`` (the model's FLOPs per second and device that the
    paper reports) and ``mfu`` are the paper's figures, ``None`` where it gives none; ``source`` says where each
    comes from. ``precision`` and ``split_embeddings`` are how the run kept its states and its embedding.
    """

    model: Model
    layout: Layout
    cluster: Cluster
    global_batch: int
    precision: str
    split_embeddings: bool
    step_seconds: float | None
    tflops_per_device: float | None
    mfu: float | None
    source: str

    def predict(self, layout: Layout | None = None, overlap: dict[str, float] | None = None) -> Prediction:
        """The planner's counts and step time for this run's layout, or for ``layout`` on the same job (``overlap``:
        as :func:`predict` takes it)."""
        return predict(self.model, layout or self.layout, self.cluster, self.precision, self.split_embeddings,
                       overlap=overlap)

    @property
    def reported_seconds(self) -> float:
        """The step time the paper reports, or the one its FLOPs per second and device imply (the model's FLOPs
        for a step's tokens, :func:`costmodel.transformer_flops`, over the devices' reported rate)."""
        if self.step_seconds is not None:
            return self.step_seconds
        tokens = self.global_batch * self.model.seq
        return costmodel.transformer_flops(self.model).total * tokens / (self.cluster.devices * self.tflops_per_device
                                                                           * 1e12)


_A100 = {"memory_bytes": 80 * 2**30, "flops": 312e12, "intra_bandwidth": 300e9, "inter_bandwidth": 25e9}
_H100 = {"memory_bytes": 80 * 2**30, "flops": 989e12, "intra_bandwidth": 450e9, "inter_bandwidth": 50e9}

#: Published runs lesson 17 reads, each as its paper gives it where the paper says (tests/test_published_runs.py
#: checks every figure against its source). Links: NVLink inside a node of 8 GPUs, InfiniBand between nodes
#: (A100: 300 and 25 GB/s, one way per GPU; H100: 450 and 50).
PUBLISHED: dict[str, PublishedRun] = {
    "GPT-3 175B on 64 A100s (Megatron-LM)": PublishedRun(
        Model(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, tied_embeddings=True),
        Layout(1, 8, 8, micro_batch=1, micro_batches=64, recompute="selective", virtual_stages=3),
        Cluster(devices=64, **_A100), 64, "mixed", True, 13.75, None, 0.514,
        "Korthikanti et al. (2022), Table 3 (the layout: TP 8, PP 8, global batch 64, micro-batch 1; §6: three "
        "interleaved stages, s = 2048, v = 51200) and Table 5 (13.75 s a step with sequence parallelism and "
        "selective recomputation, MFU 51.4 %)"),
    "Llama 3 405B on 8,192 H100s, 8K context": PublishedRun(
        _llama3_405b(8192), Layout(64, 8, 16, zero=3, reshard=False, micro_batch=1, micro_batches=32),
        Cluster(devices=8192, **_H100), 2048, "mixed_fp32_grads", True, None, 430.0, 0.43,
        "Llama Team (2024), Table 3 (the shape), Table 4 (TP 8, CP 1, PP 16, DP 64, 8,192 tokens, 32 sequences "
        "per DP group, 430 TFLOPs/GPU, MFU 43 %) and §3.3.2 (FSDP without resharding after the forward pass, "
        "fp32 gradient accumulation, no activation checkpointing at 8K). Its interleaved schedule is its own and "
        "gives no number of chunks: here the pipeline runs plain 1F1B"),
}
