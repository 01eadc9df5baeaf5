"""Model parallelism: split a model's layers over devices, pipeline micro-batches, split a layer.

- :class:`StagedModel` places consecutive blocks of a model on different devices (a layer
  split) and runs forward and backward one stage at a time, so each stage's work can be timed.
- :func:`gpipe_schedule` and :func:`bubble_fraction`: the ideal GPipe schedule and its idle time.
- :func:`one_f_one_b_schedule`: the 1F1B schedule, same bubble, fewer micro-batches in flight
  (:func:`in_flight_peaks`).
- :func:`run_pipeline` runs either schedule for real, one thread per stage, and measures it.
- :func:`column_parallel_dense` and :func:`row_parallel_dense`: one Dense layer split across
  devices (tensor parallelism).
- :func:`parallelism_costs`: memory per device and bytes moved per step, for each strategy.

Everything runs on logical CPUs when there is no GPU; the timings then share the same cores.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from mgpu_edu._validate import BadArgument, one_of, positive_number, real_number, whole_number
from mgpu_edu.analysis.memory import PRECISIONS, model_states
from mgpu_edu.parallelism.allreduce import ring_allreduce
from mgpu_edu.parallelism.parallel import shard_sizes, split_batch
from mgpu_edu.runtime import quiet


class Stage(NamedTuple):
    """What a stage's forward pass keeps for its backward pass: its input (copied onto its device) and output."""

    inputs: Any
    outputs: Any


class InFlight(NamedTuple):
    """A micro-batch a stage has run forward and not yet backward: its Stage, its tape, and (last stage
    only) the gradient of the loss with respect to the logits."""

    stage: Stage
    tape: Any
    loss_grad: Any


class Event(NamedTuple):
    """One slot of a pipeline schedule: a stage runs a micro-batch's forward ("F") or backward ("B"); with the
    backward pass split (:func:`zero_bubble_schedule`), "B" is its input gradient and "W" its weights'."""

    stage: int
    micro_batch: int
    phase: str
    start: float
    end: float


def _count(name: str, value: Any) -> int:
    return whole_number(name, value, example=4)


def gpipe_schedule(stages: int, micro_batches: int) -> list[Event]:
    """The ideal GPipe schedule with unit-time slots: all forwards, then all backwards.

    Micro-batch m's forward on stage s runs in slot s + m (after stage s − 1 finished it);
    backwards run in reverse stage order once every forward is done. Each stage runs one
    event at a time. Pure arithmetic: no TensorFlow, no devices.

    Example:
        >>> [(e.stage, e.micro_batch, e.phase, e.start) for e in gpipe_schedule(2, 2)][:4]
        [(0, 0, 'F', 0), (0, 1, 'F', 1), (1, 0, 'F', 1), (1, 1, 'F', 2)]
        >>> max(e.end for e in gpipe_schedule(2, 2))  # 2 (M + P − 1) slots
        6
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    forward_end = m + p - 1
    events = [Event(s, i, "F", s + i, s + i + 1) for s in range(p) for i in range(m)]
    events += [Event(s, i, "B", forward_end + (p - 1 - s) + i, forward_end + (p - 1 - s) + i + 1)
               for s in reversed(range(p)) for i in range(m)]
    return sorted(events, key=lambda e: (e.phase == "B", e.start, e.stage if e.phase == "F" else -e.stage))


#: The schedules :func:`run_pipeline` runs: all forwards then all backwards, or one forward one backward.
SCHEDULES = ("gpipe", "1f1b")


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order in which one stage runs its forwards ("F") and backwards ("B"), micro-batch by micro-batch.

    - GPipe: every forward, then every backward.
    - 1F1B: min(P − 1 − s, M) warm-up forwards, then one forward and one backward in turn,
      then the remaining backwards. Stage s never holds more than P − s micro-batches that
      it has run forward and not yet backward. The last stage runs each backward right after
      its forward.

    Example:
        >>> stage_order("1f1b", 0, 3, 4)
        [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3)]
    """
    one_of("schedule", schedule, SCHEDULES)
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    whole_number("stage", stage, minimum=0, maximum=p - 1, hint=f"Stages are numbered 0 to {p - 1}.")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm_up = min(p - 1 - stage, m)
    order = [("F", i) for i in range(warm_up)]
    for i in range(m - warm_up):
        order += [("F", warm_up + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm_up, m)]


def one_f_one_b_schedule(stages: int, micro_batches: int) -> list[Event]:
    """The ideal 1F1B schedule with unit-time slots (PipeDream-Flush, as Megatron-LM runs it).

    Each stage runs its :func:`stage_order`, every event as early as its stage is free and
    its inputs are ready: a forward needs the previous stage's forward of the same
    micro-batch, a backward needs this stage's forward and the next stage's backward. The
    makespan is 2(M + P − 1) slots, as GPipe's, so the bubble is the same; what changes is
    memory: stage s keeps at most min(P − s, M) micro-batches in flight, GPipe M.

    Example:
        >>> max(e.end for e in one_f_one_b_schedule(4, 8))  # 2 (M + P − 1) slots, as GPipe
        22
        >>> in_flight_peaks(one_f_one_b_schedule(4, 8)), in_flight_peaks(gpipe_schedule(4, 8))
        ([4, 3, 2, 1], [8, 8, 8, 8])
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    orders = [stage_order("1f1b", s, p, m) for s in range(p)]

    def needs(s: int, event: tuple[str, int]) -> list[tuple]:
        phase, i = event
        if phase == "F":
            return [(s - 1, "F", i)] if s > 0 else []
        return [(s, "F", i)] + ([(s + 1, "B", i)] if s < p - 1 else [])

    return sorted((Event(s, i, phase, start, start + 1)
                   for s, (phase, i), start in _as_early_as_possible(orders, needs)), key=lambda e: (e.start, e.stage))


def _as_early_as_possible(orders: list[list[tuple]], needs: Any) -> list[tuple[int, tuple, int]]:
    """Run each stage's events in its order (``orders[s]``, each event a tuple starting with its phase), every one
    in a unit-time slot as early as its stage is free and the events ``needs(s, event)`` names, as (stage, *event),
    have ended. Returns (stage, event, start slot) for every event."""
    done: dict[tuple, int] = {}  # (stage, *event) -> the slot it ends
    free, position, out = [0] * len(orders), [0] * len(orders), []
    total = sum(len(order) for order in orders)
    while len(out) < total:
        for s, order in enumerate(orders):  # each stage runs its next events while their inputs are ready
            while position[s] < len(order):
                event = order[position[s]]
                waits = needs(s, event)
                if any(n not in done for n in waits):
                    break
                start = max([free[s]] + [done[n] for n in waits])
                done[(s, *event)] = free[s] = start + 1
                out.append((s, event, start))
                position[s] += 1
    return out


class ChunkEvent(NamedTuple):
    """One slot of an interleaved schedule: a stage runs one chunk of its layers for a micro-batch, forward or back."""

    stage: int
    chunk: int
    micro_batch: int
    phase: str
    start: float
    end: float


def interleaved_schedule(stages: int, micro_batches: int, virtual_stages: int) -> list[ChunkEvent]:
    """The interleaved 1F1B schedule (Narayanan et al., 2021, §2.2.2) with unit-time slots for each chunk's pass.

    Each of the P stages holds V chunks of layers: chunk c of stage s is the model's (c·P + s)-th piece, so a
    micro-batch crosses every stage V times. Each stage runs its chunks in Megatron-LM's order (groups of P
    micro-batches, chunk by chunk), warming up with 2·(P − s − 1) + (V − 1)·P forwards (every forward when
    M = P), then one forward and one backward in turn, each event as early as its inputs are ready. A
    chunk's pass takes 1/V of a whole stage's, so against 1F1B's unit slots this schedule's slots are V
    times as many and V times shorter; its bubble is (P − 1)/(V·M) of the ideal time (:func:`bubble_ratio`)
    and stage s keeps the chunks :func:`mgpu_edu.memory.in_flight` counts. M must be a multiple of P, as
    Megatron-LM requires.

    Example:
        >>> events = interleaved_schedule(4, 8, 2)
        >>> max(e.end for e in events), in_flight_peaks(events)  # 2·V·M + 2·(P − 1) slots; chunks in flight
        (38, [11, 9, 7, 5])
    """
    p, m, v = _count("stages", stages), _count("micro_batches", micro_batches), _count("virtual_stages", virtual_stages)
    if v < 2 or m % p:
        raise BadArgument(f"interleaved_schedule(stages={p}, micro_batches={m}, virtual_stages={v}) needs at least "
                          "2 chunks per stage and a number of micro-batches that is a multiple of the stages: for "
                          "one chunk, use one_f_one_b_schedule.")
    total = v * m

    def forward(k: int) -> tuple[int, int]:  # the k-th forward a stage runs: (chunk, micro-batch)
        return (k // p) % v, (k // (p * v)) * p + k % p

    def backward(k: int) -> tuple[int, int]:
        chunk, micro_batch = forward(k)
        return v - 1 - chunk, micro_batch

    orders = []
    for s in range(p):
        warm_up = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)
        order = [("F", *forward(k)) for k in range(warm_up)]
        for k in range(total - warm_up):
            order += [("F", *forward(warm_up + k)), ("B", *backward(k))]
        orders.append(order + [("B", *backward(k)) for k in range(total - warm_up, total)])

    def needs(s: int, event: tuple[str, int, int]) -> list[tuple]:
        phase, c, i = event
        if phase == "F":  # the previous piece of the model: the stage before, or the last stage's chunk c − 1
            return [(s - 1, "F", c, i)] if s > 0 else ([(p - 1, "F", c - 1, i)] if c > 0 else [])
        later = [(s + 1, "B", c, i)] if s < p - 1 else ([(0, "B", c + 1, i)] if c < v - 1 else [])
        return [(s, "F", c, i), *later]

    return sorted((ChunkEvent(s, c, i, phase, start, start + 1)
                   for s, (phase, c, i), start in _as_early_as_possible(orders, needs)),
                  key=lambda e: (e.start, e.stage))


def zero_bubble_schedule(stages: int, micro_batches: int, split: bool = True) -> list[Event]:
    """A pipeline schedule whose backward pass is split in two, unit time each: "B", the input gradient the
    previous stage waits for, and "W", the weights' gradient, which nothing downstream waits for.

    With ``split`` (ZB-H1, Qi et al., 2024, "Zero Bubble Pipeline Parallelism", §2.1), stage s runs 1F1B's order
    of forwards and B's (min(P − s, M) forwards before its first B), and puts the W of micro-batch j − s right
    after B_j (W waits s micro-batches on stage s, filling the slots 1F1B would leave idle); the W's still owed
    come last. Without ``split``, it is 1F1B with the backward pass whole: each W right after
    its B, and the previous stage's B waits for both. Every event runs as early as its stage is free and its
    inputs are ready. With T_F = T_B = T_W = 1 and M ≥ P the makespans are 3M + 3(P − 1) and 3M + (P − 1)
    slots: bubbles (P − 1)(T_F + T_B + T_W) and (P − 1)(T_F + T_B − T_W), a third of it, as the paper's Table 2
    says (:func:`zero_bubble_ratio`). A micro-batch's activations stay until its W: 1F1B keeps P − s on stage s,
    ZB-H1 P on every stage, the same peak, P·M_B (:func:`in_flight_peaks` until "W").

    Example:
        >>> [max(e.end for e in zero_bubble_schedule(4, 8, split)) for split in (False, True)]  # 3M + 3(P−1), 3M + P−1
        [33, 27]
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    orders = []
    for s in range(p):
        if split:
            warm_up = min(p - s, m)
            order = [("F", i) for i in range(warm_up)]
            for j in range(m):
                order += [("B", j)] + [("W", j - s)] * (j >= s) + [("F", warm_up + j)] * (warm_up + j < m)
            order += [("W", i) for i in range(max(0, m - s), m)]
        else:
            order = [(phase, i) for phase, i in stage_order("1f1b", s, p, m) for phase in
                     ((phase,) if phase == "F" else ("B", "W"))]
        orders.append(order)

    def needs(s: int, event: tuple[str, int]) -> list[tuple]:
        phase, i = event
        return {"F": [(s - 1, "F", i)] if s > 0 else [], "W": [(s, "B", i)],
                "B": [(s, "F", i)] + ([(s + 1, "B" if split else "W", i)] if s < p - 1 else [])}[phase]

    return sorted((Event(s, i, phase, start, start + 1)
                   for s, (phase, i), start in _as_early_as_possible(orders, needs)), key=lambda e: (e.start, e.stage))


def zero_bubble_ratio(stages: int, micro_batches: int, split: bool = True, forward: float = 1.0,
                      input_grad: float = 1.0, weight_grad: float = 1.0) -> float:
    """The bubble as a share of the ideal time, Qi et al.'s Table 2: (P − 1)(T_F + T_B − T_W) for ZB-H1, against
    (P − 1)(T_F + T_B + T_W) for 1F1B (``split=False``), over the ideal M·(T_F + T_B + T_W). ZB-H1's holds for
    M ≥ P and T_W ≤ T_F (a clear error says so otherwise).

    Example:
        >>> zero_bubble_ratio(4, 8, split=False), zero_bubble_ratio(4, 8)  # (P − 1)/M, and a third of it
        (0.375, 0.125)
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    for name, value in (("forward", forward), ("input_grad", input_grad), ("weight_grad", weight_grad)):
        positive_number(name, value)
    if split and (m < p or weight_grad > forward):
        raise BadArgument(f"zero_bubble_ratio(stages={p}, micro_batches={m}, weight_grad={weight_grad:g}, "
                          f"forward={forward:g}): Qi et al.'s ZB-H1 bubble holds for at least as many micro-batches "
                          "as stages and a weight-gradient pass no longer than the forward; count the bubble of "
                          "zero_bubble_schedule's events otherwise.")
    ideal = m * (forward + input_grad + weight_grad)
    return (p - 1) * (forward + input_grad + (-weight_grad if split else weight_grad)) / ideal


def in_flight_peaks(events: Sequence[Event | ChunkEvent], until: str = "B") -> list[int]:
    """For each stage, the most micro-batches (chunks, in an interleaved schedule) it has run forward and whose
    ``until`` phase it has not yet run, at once.

    Each of them keeps its activations on the stage's device until then, so this is the schedule's activation
    memory, in micro-batches: until the backward pass ("B"), or, with the backward pass split
    (:func:`zero_bubble_schedule`), until the weight gradient ("W").

    Example:
        >>> in_flight_peaks(gpipe_schedule(2, 3))
        [3, 3]
        >>> in_flight_peaks(zero_bubble_schedule(4, 8), "W"), in_flight_peaks(zero_bubble_schedule(4, 8, False), "W")
        ([4, 4, 4, 4], [4, 3, 2, 1])
    """
    peaks = []
    for s in sorted({e.stage for e in events}):
        held = peak = 0
        for e in sorted((e for e in events if e.stage == s), key=lambda e: e.start):
            held += 1 if e.phase == "F" else -1 if e.phase == until else 0
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def bubble_ratio(stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The bubble as a share of the ideal time: (P − 1)/(V·M), with V chunks per device in the interleaved 1F1B.

    1F1B's bubble is GPipe's: P − 1 slots of forward and backward against the M that do work, (P − 1)/M
    of the ideal time (:func:`bubble_fraction` is the same bubble as a share of the whole). Interleaving
    V chunks of layers per device makes each slot V times shorter (Narayanan et al., 2021, §2.2.2; the
    Llama 3 paper, §3.3.2, writes it (PP − 1)/(V·M)).

    Example:
        >>> bubble_ratio(8, 32), bubble_ratio(8, 32, virtual_stages=8)  # the Ultra-Scale Playbook's figure
        (0.21875, 0.02734375)
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    return (p - 1) / (_count("virtual_stages", virtual_stages) * m)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Share of stage-time the GPipe schedule leaves idle: (P − 1) / (M + P − 1).

    Example:
        >>> bubble_fraction(4, 1), bubble_fraction(4, 8)
        (0.75, 0.2727272727272727)
    """
    p, m = _count("stages", stages), _count("micro_batches", micro_batches)
    return (p - 1) / (m + p - 1)


def idle_fraction(events: Sequence[Event]) -> float:
    """Idle share of a schedule computed from its events: 1 − busy ÷ (stages × makespan)."""
    stages = {e.stage for e in events}
    start, end = min(e.start for e in events), max(e.end for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1 - busy / (len(stages) * (end - start))


def micro_batches_for_bubble(stages: int, target: float) -> int:
    """The fewest micro-batches that bring the bubble of a P-stage pipeline under target.

    Example:
        >>> micro_batches_for_bubble(4, 0.10)
        28
    """
    p = _count("stages", stages)
    real_number("target", target, 0, 1, example=0.1, hint="It is the bubble's share, above 0 and below 1.")
    if target in (0, 1):
        raise BadArgument(f"target={target!r} must be above 0 and below 1, e.g. target=0.1 for 10 %.")
    m = 1
    while bubble_fraction(p, m) >= target:
        m += 1
    return m


# ----------------------------------------------------------------------------- layer split


class StagedModel:
    """Consecutive blocks of a model, block s placed on device s (a layer split).

    Each block's variables are created on its device; :meth:`forward` and :meth:`backward`
    run one stage at a time, so a caller (or :func:`run_pipeline`) can time each stage's work.
    ``widths`` are the layer sizes: widths[0] inputs, then each Dense layer's units; the
    layers are dealt out to the stages in order.
    """

    def __init__(self, widths: Sequence[int], devices: Sequence[str], classes: int, seed: int = 0) -> None:
        tf = quiet.import_tensorflow()
        import keras

        self.devices = list(devices)
        layers_per_stage = _deal(len(widths) - 1, len(self.devices))
        keras.utils.set_random_seed(seed)
        self.blocks, self.boundaries = [], []
        index = 1
        for stage, (device, count) in enumerate(zip(self.devices, layers_per_stage, strict=True)):
            with tf.device(device):
                layers = [keras.Input((widths[index - 1],))]
                for _ in range(count):
                    last = index == len(widths) - 1 and stage == len(self.devices) - 1
                    layers.append(keras.layers.Dense(widths[index], activation=None if last else "relu"))
                    index += 1
                block = keras.Sequential(layers, name=f"stage{stage}")
                block.build((None, widths[index - count - 1]))
            self.blocks.append(block)
            self.boundaries.append(widths[index - 1])
        if widths[-1] != classes:
            raise ValueError(f"the last width {widths[-1]} must equal classes={classes} (the logits).")

    @property
    def trainable_variables(self) -> list[Any]:
        """Every stage's variables, stage 0 first."""
        return [v for block in self.blocks for v in block.trainable_variables]

    def variable_devices(self) -> list[tuple[str, str]]:
        """(variable path, device) for every trainable variable."""
        return [(v.path, v.value.device) for v in self.trainable_variables]

    def forward(self, stage: int, x: Any) -> tuple[Stage, Any]:
        """Run stage s on its device; returns (Stage(inputs, outputs), tape) for the backward pass."""
        tf = quiet.import_tensorflow()
        with tf.device(self.devices[stage]):
            x = tf.identity(x)  # the copy into this stage's device: what crosses the boundary
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = self.blocks[stage](x, training=True)
        return Stage(x, y), tape

    def backward(self, stage: int, saved: Stage, tape: Any, upstream: Any) -> tuple[Any, list[Any]]:
        """Backward through stage s: returns (gradient for the previous stage's output, variable grads)."""
        tf = quiet.import_tensorflow()
        with tf.device(self.devices[stage]):
            grads = tape.gradient(saved.outputs, [saved.inputs, *self.blocks[stage].trainable_variables],
                                  output_gradients=upstream)
        return grads[0], grads[1:]

    def __call__(self, x: Any) -> Any:
        """Plain forward through every stage (for predictions)."""
        tf = quiet.import_tensorflow()
        for device, block in zip(self.devices, self.blocks, strict=True):
            with tf.device(device):
                x = block(x, training=False)
        return x


def _deal(items: int, bins: int) -> list[int]:
    if bins > items:
        raise ValueError(f"{bins} stages need at least {bins} layers, got {items}. Use fewer devices or more layers.")
    return shard_sizes(items, bins)


_ABORT = object()  # put in every queue when a stage fails, so no other stage waits for ever


class _Abort(Exception):
    """Raised in a stage thread when another stage has failed."""


def _take(q: queue.Queue) -> Any:
    item = q.get(timeout=300)  # no stage waits for ever, even if a hand-over is lost
    if item is _ABORT:
        raise _Abort
    return item


@dataclasses.dataclass
class PipelineRun:
    """What one pipelined step produced: gradients, mean loss, the measured events (seconds), and for
    each stage the most micro-batches it held in flight (run forward, backward not yet run) at once."""

    grads: list[Any]
    loss: float
    events: list[Event]
    peak_in_flight: list[int]


def run_pipeline(model: StagedModel, loss_fn: Any, x: Any, y: Any, micro_batches: int,
                 schedule: str = "gpipe") -> PipelineRun:
    """One pipelined step for real: M micro-batches through P stages, one thread per stage.

    Each stage's thread runs its :func:`stage_order` (``schedule`` "gpipe" or "1f1b"): a
    forward as soon as the previous stage hands it that micro-batch's activation, a backward
    as soon as the next stage hands back its gradient. A stage keeps each micro-batch's
    tape (its activations) from its forward until its backward, then drops it; the most it
    held at once is ``peak_in_flight``. Gradients are summed over micro-batches and divided
    by the whole batch, so they equal the unpipelined step's. Events are measured with
    time.perf_counter. micro_batches=1 is the naive layer split: one stage busy at a time.
    """
    tf = quiet.import_tensorflow()
    m = _count("micro_batches", micro_batches)
    one_of("schedule", schedule, SCHEDULES)
    p = len(model.blocks)
    xs, ys = split_batch(x, m), split_batch(y, m)
    total = tf.cast(tf.shape(x)[0], tf.float32)
    forward_in = [queue.Queue() for _ in range(p + 1)]
    backward_in = [queue.Queue() for _ in range(p + 1)]
    events: list[Event] = []
    peaks = [0] * p
    grads: list[list[Any]] = [[] for _ in range(p)]
    losses: list[Any] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    origin = time.perf_counter()

    def stage_worker(s: int) -> None:
        try:
            in_flight: dict[int, InFlight] = {}
            for phase, i in stage_order(schedule, s, p, m):
                if phase == "F":
                    inputs = xs[i] if s == 0 else _take(forward_in[s])
                    start = time.perf_counter()
                    stage, tape = model.forward(s, inputs)
                    loss_grad = None
                    if s == p - 1:  # the loss and its gradient for the logits, on the last stage's device
                        with tf.device(model.devices[s]), tf.GradientTape() as loss_tape:
                            loss_tape.watch(stage.outputs)
                            loss = tf.reduce_sum(loss_fn(ys[i], stage.outputs)) / total
                        loss_grad = loss_tape.gradient(loss, stage.outputs)
                        losses.append(loss)
                    _ = stage.outputs.numpy()  # wait for the work, so the timing is real
                    end = time.perf_counter()
                    in_flight[i] = InFlight(stage, tape, loss_grad)
                    peaks[s] = max(peaks[s], len(in_flight))
                    with lock:
                        events.append(Event(s, i, "F", start - origin, end - origin))
                    if s < p - 1:
                        forward_in[s + 1].put(stage.outputs)
                    continue
                held = in_flight.pop(i)  # after its backward, nothing of this micro-batch is kept
                start = time.perf_counter()
                upstream = held.loss_grad if s == p - 1 else _take(backward_in[s])
                upstream_start = time.perf_counter() if s < p - 1 else start
                back, var_grads = model.backward(s, held.stage, held.tape, upstream)
                _ = back.numpy()
                end = time.perf_counter()
                grads[s].append(var_grads)
                with lock:
                    events.append(Event(s, i, "B", upstream_start - origin, end - origin))
                if s > 0:
                    backward_in[s - 1].put(back)
        except _Abort:
            return  # another stage failed; its error is re-raised below
        except BaseException as error:  # re-raised in the caller's thread
            errors.append(error)
            for q in (*forward_in, *backward_in):
                for _ in range(m):
                    q.put(_ABORT)

    threads = [threading.Thread(target=stage_worker, args=(s,), daemon=True) for s in range(p)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    summed = []
    for s in range(p):
        with tf.device(model.devices[s]):
            summed += [tf.add_n(list(parts)) for parts in zip(*grads[s], strict=True)]
    return PipelineRun(summed, float(tf.add_n(losses)), sorted(events, key=lambda e: e.start), peaks)


# ----------------------------------------------------------------------------- tensor parallelism


def column_parallel_dense(x: Any, kernel: Any, bias: Any, devices: Sequence[str]) -> Any:
    """Dense layer with its kernel split by output columns: device i computes x @ W[:, cols_i] + b_i.

    Every device needs all of x; the partial outputs are concatenated (an all-gather).
    """
    tf = quiet.import_tensorflow()
    columns = split_batch(tf.transpose(kernel), len(devices))
    biases = split_batch(bias, len(devices))
    parts = []
    for device, w, b in zip(devices, columns, biases, strict=True):
        with tf.device(device):
            parts.append(tf.matmul(x, w, transpose_b=True) + b)
    with tf.device(devices[0]):
        return tf.concat(parts, axis=1)


def row_parallel_dense(x: Any, kernel: Any, bias: Any, devices: Sequence[str]) -> list[Any]:
    """Dense layer with its kernel split by input rows: device i computes x[:, rows_i] @ W[rows_i, :].

    Each partial product has the full output shape; adding them needs an all-reduce (the ring
    from lesson 03). Returns the full output on every device; the bias is added once.
    """
    tf = quiet.import_tensorflow()
    rows = split_batch(kernel, len(devices))
    inputs = split_batch(tf.transpose(x), len(devices))
    partial = []
    for device, w, xt in zip(devices, rows, inputs, strict=True):
        with tf.device(device):
            partial.append(tf.matmul(xt, w, transpose_a=True))
    summed = ring_allreduce(partial)
    out = []
    for device, s in zip(devices, summed, strict=True):
        with tf.device(device):
            out.append(s + bias)
    return out


# ----------------------------------------------------------------------------- costs


def _layers(widths: Sequence[int]) -> list[tuple[int, int]]:
    widths = list(widths)
    if len(widths) < 2:
        raise BadArgument(f"widths={widths!r} must list at least two layer sizes (inputs, then each layer's "
                          "units), e.g. [64, 512, 10].")
    for width in widths:
        whole_number("widths", width, hint=f"In widths={widths!r}, each is a layer's size.")
    return list(zip(widths[:-1], widths[1:], strict=False))


def stage_memory(widths: Sequence[int], batch: int, devices: int, optimizer: str = "adam",
                 precision: str = "fp32") -> list[dict[str, float]]:
    """Bytes each device of a layer split holds: weights, gradients, optimizer state, activations.

    Layers are dealt out to the stages in order (as :class:`StagedModel` does). The model
    states come from :func:`mgpu_edu.memory.model_states` (Adam in fp32: 4 bytes of weights,
    4 of gradients and 8 of moments per parameter). The activations are what the backward
    pass needs, for the whole batch: a Dense layer's kernel gradient needs the layer's input
    (xᵀ·dy) and ReLU's gradient its output, so a stage keeps its input and every layer's
    output. Counted, not measured.

    Example:
        >>> [round(m["total"] / 2**20, 2) for m in stage_memory([64, 512, 10], 16, 2, optimizer="sgd")]
        [0.29, 0.07]
    """
    layers = _layers(widths)
    _count("batch", batch)
    per_stage = _deal(len(layers), _count("devices", devices))
    value_bytes = PRECISIONS.get(precision, (4, 4))[0]
    result, start = [], 0
    for count in per_stage:
        stage = layers[start:start + count]
        start += count
        states = model_states(sum(i * o + o for i, o in stage), optimizer=optimizer, precision=precision)
        activations = batch * (stage[0][0] + sum(o for _, o in stage)) * value_bytes
        result.append({"weights": states.params, "gradients": states.grads, "optimizer": states.optimizer,
                       "activations": activations, "total": states.total + activations})
    return result


def parallelism_costs(widths: Sequence[int], batch: int, devices: int, micro_batches: int = 4,
                      optimizer: str = "adam", precision: str = "fp32") -> list[dict[str, Any]]:
    """Memory per device and bytes moved per training step, for an MLP of the given widths, per strategy.

    Counted from the shapes, not measured. Memory is the busiest device's weights, gradients,
    optimizer state (:func:`mgpu_edu.memory.model_states`) and the activations it keeps for
    the backward pass (each layer's input and output, see :func:`stage_memory`). Traffic
    comes two ways, each labelled:
    ``bytes_per_device`` is what the busiest device sends in one step, ``bytes_total`` what all
    devices send together.

    - data: every device holds every weight and 1/N of the batch's activations; a ring
      all-reduce of the gradients sends 2(N−1)/N × the gradient bytes from each device.
    - layer split: each device holds its layers; at each boundary the activation goes forward
      and its gradient comes back, so a middle device sends one of each.
    - GPipe: the same bytes as the layer split, in M messages; all M micro-batches'
      activations are kept until the backward pass, so the same memory.
    - 1F1B: the same bytes and bubble as GPipe; stage s keeps at most min(P − s, M) of the M
      micro-batches' activations at once (:func:`stage_order`), so less memory.
    - tensor: every layer split by columns over N devices: 1/N of the model states each; each
      layer's output is all-gathered ((N−1)/N of it sent per device) to be the next layer's
      input, so every device keeps the whole batch's activations, as one device would; each
      layer's input gradient is all-reduced back.

    ``idle_fraction`` is the ideal share of device-time spent waiting: (P−1)/P for the layer
    split, the bubble for the pipelines, 0 for data and tensor parallelism.
    """
    n = _count("devices", devices)
    _count("batch", batch)
    layers = _layers(widths)
    value_bytes, grad_bytes = PRECISIONS.get(precision, (4, 4))
    params = sum(i * o + o for i, o in layers)
    acts = [batch * o * value_bytes for _, o in layers]  # each layer's output, crossing or all-gathered
    kept = batch * sum(widths) * value_bytes  # the input and every layer's output, for the whole batch
    states = model_states(params, optimizer=optimizer, precision=precision)
    stages = stage_memory(widths, batch, n, optimizer, precision)
    per_stage = _deal(len(layers), n)
    ends = [sum(per_stage[:s + 1]) for s in range(n)]  # layer index after each stage
    boundary = [acts[end - 1] for end in ends[:-1]]  # activation crossing from stage s to s + 1
    sent = [(boundary[s] if s < n - 1 else 0) + (boundary[s - 1] if s > 0 else 0) for s in range(n)]
    ring = 2 * (n - 1) / n
    tensor_sent = sum((n - 1) / n * a for a in acts) + sum(ring * a for a in acts[:-1])
    busiest = max(stages, key=lambda m: m["total"])
    held = [min(n - s, micro_batches) / micro_batches for s in range(n)]  # 1F1B: share of the batch's activations
    one_f_one_b = [{**m, "activations": m["activations"] * h, "total": m["total"] - m["activations"] * (1 - h)}
                   for m, h in zip(stages, held, strict=True)]
    busiest_1f1b = max(one_f_one_b, key=lambda m: m["total"])
    data_memory = {"weights": states.params, "gradients": states.grads, "optimizer": states.optimizer,
                   "activations": kept / n}
    tensor_memory = {"weights": states.params / n, "gradients": states.grads / n,
                     "optimizer": states.optimizer / n, "activations": kept}
    rows = [
        ("data", data_memory, ring * params * grad_bytes, n * ring * params * grad_bytes, 0.0),
        ("layer split", busiest, max(sent), sum(sent), bubble_fraction(n, 1)),
        (f"GPipe (M={micro_batches})", busiest, max(sent), sum(sent), bubble_fraction(n, micro_batches)),
        (f"1F1B (M={micro_batches})", busiest_1f1b, max(sent), sum(sent), bubble_fraction(n, micro_batches)),
        ("tensor", tensor_memory, tensor_sent, n * tensor_sent, 0.0),
    ]
    return [{"strategy": name, "memory_per_device": sum(v for k, v in memory.items() if k != "total"),
             "memory": {k: v for k, v in memory.items() if k != "total"},
             "bytes_per_device": per_device, "bytes_total": total, "idle_fraction": idle}
            for name, memory, per_device, total, idle in rows]


def traffic_crossover(widths: Sequence[int], devices: int, measure: str = "bytes_per_device") -> int:
    """The smallest batch at which a layer split sends at least as many bytes as data parallelism.

    Data parallelism moves gradients (fixed by the model); a layer split moves activations
    (growing with the batch). ``measure`` is ``"bytes_per_device"`` or ``"bytes_total"``.

    Example:
        >>> traffic_crossover([64, 512, 512, 512, 10], 4)
        826
    """
    one_of("measure", measure, ("bytes_per_device", "bytes_total"))

    def costs(batch: int) -> dict[str, float]:
        rows = {r["strategy"]: r[measure] for r in parallelism_costs(widths, batch, devices)}
        return rows

    low, high = 1, 1
    while costs(high)["layer split"] < costs(high)["data"]:
        low, high = high, high * 2
        if high > 2**40:
            raise ValueError(f"a layer split of widths={list(widths)} never sends as much as data parallelism.")
    while low < high:  # the layer split's bytes grow with the batch: bisect for the first batch that reaches
        mid = (low + high) // 2
        if costs(mid)["layer split"] >= costs(mid)["data"]:
            high = mid
        else:
            low = mid + 1
    return low
