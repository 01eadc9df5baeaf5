"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): each transformer block split over t devices.

Inside a block, attention is split by heads and the MLP column-then-row:

- ``wq``, ``wk``, ``wv`` and the MLP's ``w1`` (and ``b1``) are cut by columns, so device d computes
  its own heads, or its own quarter of the MLP's hidden units, from the whole input;
- ``wo`` and ``w2`` are cut by rows to match, so device d's product is a *partial* output: the
  block's output is the sum over devices, an all-reduce;
- LayerNorms, biases after an all-reduce, embeddings and the head are copied to every device.

Two operators join the regions (the paper's f and g, conjugate to each other):
:func:`copy_to_region` is the identity going forward and an all-reduce of the gradients going
back; :func:`reduce_from_region` is an all-reduce going forward and the identity going back. So a
block costs two all-reduces of its activations (b·s·h values) forward and two backward.

Everything runs in one Python process on logical devices with :mod:`mgpu_edu.collectives`. A
:class:`SplitTape` plays each GPU's own autodiff: every device records its work on its own
``tf.GradientTape``, and the operators at the regions' edges are explicit collectives going forward
and coming back, so a tensor crosses devices only inside a collective (:func:`trace_step` reads it from
TensorFlow's traced graph, to compare with the log). Each device keeps its own copy of the copied
weights and computes its own loss, as each GPU of a real job would, so the gradient each copy gets is
the gradient one device would get. :func:`forward_and_gradients` returns everything needed to compare
the split model with the one-device model, weight by weight; :func:`trace_step` also lists what
TensorFlow keeps for the backward pass on each device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, whole_number
from mgpu_edu.parallelism import collectives
from mgpu_edu.runtime import quiet

#: Which way each block weight is cut: by columns (its last axis), by rows (its first), or copied.
CUT = {"wq": "columns", "wk": "columns", "wv": "columns", "wo": "rows", "w1": "columns", "b1": "columns",
       "w2": "rows", "bo": "copied", "b2": "copied", "ln1_gamma": "copied", "ln1_beta": "copied",
       "ln2_gamma": "copied", "ln2_beta": "copied"}


@dataclasses.dataclass
class CommLog:
    """Every collective the split model ran: (direction "forward" or "backward", block, what, trace)."""

    records: list[tuple[str, int, str, Any]] = dataclasses.field(default_factory=list)

    def bytes_sent(self, direction: str, block: int | None = None) -> list[int]:
        """Bytes each device sent in that direction (in one block, or in all of them)."""
        totals: list[int] = []
        for way, index, _, trace in self.records:
            if way == direction and (block is None or index == block):
                totals = [a + b for a, b in zip(totals, trace.bytes_sent, strict=True)] if totals \
                    else list(trace.bytes_sent)
        return totals

    def count(self, direction: str, block: int | None = None) -> int:
        """How many collectives ran in that direction (in one block, or in all)."""
        return sum(1 for way, index, _, _ in self.records if way == direction and (block is None or index == block))


def check_degree(t: int, hidden: int, heads: int) -> None:
    """A clear error unless t devices can split ``heads`` heads and a ``hidden``-wide block evenly."""
    whole_number("t", t, minimum=1, maximum=64, hint="It is the tensor-parallel degree: the devices sharing a block.")
    if heads % t:
        raise BadArgument(f"tensor parallelism over t={t} devices splits attention by heads, but heads={heads} "
                          f"doesn't divide by {t}. Pick t among {[d for d in range(1, heads + 1) if heads % d == 0]}.")
    if (4 * hidden) % t:
        raise BadArgument(f"tensor parallelism over t={t} devices cuts the MLP's 4 × hidden = {4 * hidden} units, "
                          f"which doesn't divide by {t}. Pick a t that divides it.")


def shard_block(weights: dict[str, Any], t: int, heads: int) -> list[dict[str, Any]]:
    """Device d's slice of one block's weights (names as ``gpt.BLOCK_WEIGHTS``): see :data:`CUT`.

    Columns of wq, wk, wv are cut into t groups of whole heads; rows of wo into the same groups;
    w1, b1 by columns and w2 by rows into t equal parts. Works on NumPy arrays or tensors.

    Example:
        >>> shards = shard_block(model.blocks[0].weights_by_name(), 2, heads=4)  # doctest: +SKIP
        >>> shards[1]["wq"].shape  # doctest: +SKIP
        TensorShape([32, 16])
    """
    hidden = int(weights["wq"].shape[0])
    check_degree(t, hidden, heads)
    pieces: list[dict[str, Any]] = [{} for _ in range(t)]
    for name, value in weights.items():
        cut = CUT[name]
        size = int(value.shape[-1] if cut == "columns" else value.shape[0]) // t
        for d in range(t):
            if cut == "columns":
                pieces[d][name] = value[..., d * size:(d + 1) * size]
            elif cut == "rows":
                pieces[d][name] = value[d * size:(d + 1) * size]
            else:
                pieces[d][name] = value
    return pieces


def placed_like(values: Sequence[Any], like: Sequence[Any]) -> list[Any]:
    """``values[d]`` on the device of ``like[d]``."""
    tf = quiet.import_tensorflow()
    out = []
    for ref, value in zip(like, values, strict=True):
        with tf.device(ref.device):
            out.append(tf.identity(value))
    return out


class SplitTape:
    """Reverse mode over t devices, as t GPUs run it: each device records its own work on its own
    ``tf.GradientTape``, and every collective between devices is an explicit call, going forward and coming back.

    :meth:`compute` runs ``fn(d, *inputs)`` on each device d, under that device's tape;
    :meth:`exchange` runs a collective now and keeps its mirror image for the way back;
    :meth:`gradient` walks back from the losses, last step first: each device's tape gives the
    gradients of its own step, and each exchange runs its mirror collective on them. Every
    collective goes into :attr:`log`. Nothing is computed on a device other than its own: a tensor
    crosses devices only inside a collective, whose bytes the log counts.
    """

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = list(devices)
        self.log = CommLog()
        self._steps: list[tuple[Any, ...]] = []

    def compute(self, fn: Any, *inputs: Sequence[Any]) -> list[Any]:
        """``fn(d, inputs[0][d], …)`` on each device d, recorded on that device's tape; one result per device
        (a tensor, or a tuple of them)."""
        tf = quiet.import_tensorflow()
        results = []
        for d, device in enumerate(self.devices):
            args = [items[d] for items in inputs]
            with tf.device(device), tf.GradientTape() as tape:
                tape.watch(args)
                result = fn(d, *args)
            outputs = list(result) if isinstance(result, tuple) else [result]
            self._steps.append(("compute", d, tape, args, outputs))
            results.append(result)
        return results

    def exchange(self, xs: Sequence[Any], forward: Any, backward: Any, block: int, what: str) -> list[Any]:
        """Run ``forward`` on one tensor per device now, ``backward`` on their gradients on the way back.

        Each takes one tensor per device and returns ``(results, trace)``, trace None when nothing is
        sent. The four operators at a split region's edge are this call with different pairs.
        """
        outputs, trace = forward(list(xs))
        if trace is not None:
            self.log.records.append(("forward", block, what, trace))
        self._steps.append(("exchange", list(xs), outputs, backward, block, what))
        return outputs

    def gradient(self, losses: Sequence[Any], sources: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Each device's gradients for its ``sources[d]`` (its variables): ``result[d][i]`` for ``sources[d][i]``,
        None where unused.

        Each device seeds its backward pass with its own loss (``losses[d]``, gradient 1) and every
        exchange runs the backward collective it was given. With Megatron's f and g, where every
        device computes the same loss, that is the gradient of that one loss (g's backward is the
        identity, so it isn't counted t times); with sequence parallelism's pairs, where each device's
        loss is its chunk's share, it is the gradient of their sum. The steps are let go as they are
        done, as a real backward pass frees each activation once its gradient is computed.
        """
        tf = quiet.import_tensorflow()
        pending: dict[Any, Any] = {}  # a forward tensor's gradient, summed over the steps that read it

        def add(tensor: Any, gradient: Any) -> None:
            if gradient is None:
                return
            key = tensor.ref()
            with tf.device(tensor.device):
                pending[key] = gradient if key not in pending else pending[key] + gradient

        def upstream(outputs: list[Any]) -> list[Any]:  # zeros where nothing came back (tape.gradient needs one)
            grads = [pending.pop(x.ref(), None) for x in outputs]
            return [g if g is not None else _zeros_like(tf, x) for g, x in zip(grads, outputs, strict=True)]

        for loss in losses:
            with tf.device(loss.device):
                add(loss, tf.ones_like(loss))
        found: list[dict[Any, Any]] = [{} for _ in self.devices]
        while self._steps:
            step = self._steps.pop()
            if step[0] == "compute":
                _, d, tape, args, outputs = step
                with tf.device(self.devices[d]):
                    grads = tape.gradient(outputs, [*args, *sources[d]], output_gradients=upstream(outputs))
                for x, g in zip(args, grads[:len(args)], strict=True):
                    add(x, g)
                for v, g in zip(sources[d], grads[len(args):], strict=True):
                    if g is not None:
                        key = v.ref()
                        with tf.device(self.devices[d]):
                            found[d][key] = g if key not in found[d] else found[d][key] + g
            else:
                _, xs, outputs, backward, block, what = step
                grads, trace = backward(placed_like(upstream(outputs), outputs))
                if trace is not None:
                    self.log.records.append(("backward", block, what, trace))
                for x, g in zip(xs, grads, strict=True):
                    add(x, g)
        return [[found[d].get(v.ref()) for v in sources[d]] for d in range(len(self.devices))]


def _zeros_like(tf: Any, x: Any) -> Any:
    with tf.device(x.device):
        return tf.zeros_like(x)


def keep(values: list[Any]) -> tuple[list[Any], None]:
    """The identity as an exchange: each device keeps its own tensor (a copy on its own device); nothing is sent."""
    return placed_like(values, values), None


def traced(collective: Any) -> Any:
    """A collective of :mod:`mgpu_edu.collectives` as an exchange: its results, and its trace for the log."""
    return lambda values: collective(values, trace=True)


def copy_to_region(tape: SplitTape, xs: Sequence[Any], block: int, what: str) -> list[Any]:
    """Megatron's f (its code: copy_to_tensor_model_parallel_region): forward, each device keeps its (equal) copy;
    backward, the copies' gradients are all-reduced."""
    return tape.exchange(xs, keep, traced(collectives.all_reduce), block, what)


def reduce_from_region(tape: SplitTape, partials: Sequence[Any], block: int, what: str) -> list[Any]:
    """Megatron's g (its code: reduce_from_tensor_model_parallel_region; Korthikanti et al. call it f̄): forward,
    the partial outputs are all-reduced; backward, each device passes its gradient on."""
    return tape.exchange(partials, traced(collectives.all_reduce), keep, block, what)


def gather_into_region(tape: SplitTape, chunks: Sequence[Any], block: int, what: str) -> list[Any]:
    """Sequence parallelism's entry, the paper's g: all-gather the sequence forward, reduce-scatter back."""
    return tape.exchange(chunks, traced(collectives.all_gather), traced(collectives.reduce_scatter), block, what)


def scatter_from_region(tape: SplitTape, partials: Sequence[Any], block: int, what: str) -> list[Any]:
    """Sequence parallelism's exit, the paper's ḡ: reduce-scatter the partial outputs by sequence forward,
    all-gather back."""
    return tape.exchange(partials, traced(collectives.reduce_scatter), traced(collectives.all_gather), block, what)


def parallel_block(tape: SplitTape, xs: Sequence[Any], shards: Sequence[dict[str, Any]], heads: int,
                   block: int = 0, sequence_parallel: bool = False) -> list[Any]:
    """One block on t devices: ``xs[d]`` and ``shards[d]`` on device d (``tape.devices[d]``).

    Tensor parallelism alone: ``xs[d]`` is the whole [s, b, h] input (one copy per device), and so
    is each device's output. With ``sequence_parallel``, ``xs[d]`` is chunk d of the sequence
    ([s/t, b, h]): LayerNorms, biases and residuals run on the chunk, an all-gather replaces f and a
    reduce-scatter replaces g, and device d's output is chunk d of ``gpt.block``'s. The work inside
    the split regions runs in the name scope ``split``, the rest in ``copied``, the edges in ``edge``
    (name scopes name the ops of a traced step; run eagerly, they do nothing).
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.workloads import gpt

    t = len(xs)
    enter, leave = (gather_into_region, scatter_from_region) if sequence_parallel else (copy_to_region,
                                                                                        reduce_from_region)
    with tf.name_scope("copied"):
        normed = tape.compute(lambda d, x: gpt.layer_norm(x, shards[d]["ln1_gamma"], shards[d]["ln1_beta"]), xs)
    with tf.name_scope("edge"):
        normed = enter(tape, normed, block, "attention input")
    with tf.name_scope("split"):
        partial = tape.compute(lambda d, x: gpt.dense(
            gpt.causal_attention(x, shards[d]["wq"], shards[d]["wk"], shards[d]["wv"], heads // t), shards[d]["wo"]),
            normed)
    with tf.name_scope("edge"):
        attended = leave(tape, partial, block, "attention output")
    with tf.name_scope("copied"):
        xs = tape.compute(lambda d, x, a: x + a + shards[d]["bo"], xs, attended)
        normed = tape.compute(lambda d, x: gpt.layer_norm(x, shards[d]["ln2_gamma"], shards[d]["ln2_beta"]), xs)
    with tf.name_scope("edge"):
        normed = enter(tape, normed, block, "MLP input")
    with tf.name_scope("split"):
        partial = tape.compute(lambda d, x: gpt.mlp(x, shards[d]["w1"], shards[d]["b1"], shards[d]["w2"]), normed)
    with tf.name_scope("edge"):
        out = leave(tape, partial, block, "MLP output")
    with tf.name_scope("copied"):
        return tape.compute(lambda d, x, m: x + m + shards[d]["b2"], xs, out)


@dataclasses.dataclass
class SplitRun:
    """A tensor-parallel forward and backward pass of a TinyGPT: what to compare with one device.

    ``logits[d]`` is device d's output: a copy of the whole, or, with sequence parallelism, its
    chunk of the sequence ([b, s/t, vocab]). ``gradients[d]`` maps each weight name of device d
    (``block0/wq``, ``token_embedding``, …) to its gradient; ``log`` holds every collective.
    """

    logits: list[Any]
    loss: float
    gradients: list[dict[str, Any]]
    log: CommLog
    shards: list[dict[str, Any]]
    sequence_parallel: bool = False
    #: bytes of each block's input that each device holds: block_inputs[i][d] (what full recomputation keeps)
    block_inputs: list[list[int]] = dataclasses.field(default_factory=list)

    def whole_logits(self) -> Any:
        """Device 0's logits, or with sequence parallelism every device's chunk put together: [b, s, vocab]."""
        tf = quiet.import_tensorflow()
        return tf.concat(self.logits, axis=1) if self.sequence_parallel else self.logits[0]


def model_gradients(model: Any, tokens: Any, targets: Any) -> tuple[Any, float, dict[str, Any]]:
    """The one-device reference: logits, mean next-token loss and every weight's gradient, named as in SplitRun."""
    tf = quiet.import_tensorflow()
    from mgpu_edu.workloads import gpt

    names = {id(w): n for n, w in [("token_embedding", model.tokens), ("position_embedding", model.positions),
                                   ("final_gamma", model.final_gamma), ("final_beta", model.final_beta),
                                   ("lm_head", model.head)]}
    for i, layer in enumerate(model.blocks):
        names.update({id(getattr(layer, n)): f"block{i}/{n}" for n in layer.weights_by_name()})
    variables = [w for w in model.trainable_variables]
    with tf.GradientTape() as tape:
        logits = model(tokens)
        loss = gpt.next_token_loss(logits, targets)
    grads = tape.gradient(loss, variables)
    return logits, float(loss), {names[id(v)]: tf.convert_to_tensor(g) for v, g in zip(variables, grads, strict=True)}


def _check_split(model: Any, tokens: Any, devices: Sequence[str], sequence_parallel: bool) -> None:
    t = len(devices)
    if not devices:
        raise BadArgument("forward_and_gradients needs at least one device, got an empty list.")
    check_degree(t, model.hidden, model.heads)
    seq = int(tokens.shape[1])
    if sequence_parallel and seq % t:
        raise BadArgument(f"sequence parallelism over {t} devices cuts the sequence into {t} equal chunks, but the "
                          f"sequence length {seq} doesn't divide by {t}. Use a length that does, e.g. "
                          f"{seq - seq % t or t}.")


def device_copies(model: Any, devices: Sequence[str]) -> list[dict[str, Any]]:
    """Each device's weights, as variables placed there: its slice of every block's, and a copy of the rest."""
    tf = quiet.import_tensorflow()
    from mgpu_edu.workloads import gpt

    t = len(devices)
    whole = model.weights_by_name()
    per_block = [shard_block({n: whole[f"block{i}/{n}"] for n in gpt.BLOCK_WEIGHTS}, t, model.heads)
                 for i in range(len(model.blocks))]
    copies: list[dict[str, Any]] = []
    for d, device in enumerate(devices):
        with tf.device(device):
            mine = {name: tf.Variable(w) for name, w in whole.items() if "/" not in name}
            for i, shards in enumerate(per_block):
                mine.update({f"block{i}/{n}": tf.Variable(w) for n, w in shards[d].items()})
        copies.append(mine)
    return copies


def split_forward(model: Any, copies: Sequence[dict[str, Any]], tokens: Any, targets: Any, devices: Sequence[str],
                  sequence_parallel: bool = False) -> tuple[SplitTape, list[Any], list[Any], list[list[int]]]:
    """The forward pass on each device's ``copies``: the tape, each device's logits and loss, and the bytes of each
    block's input per device. Runs eagerly or traced (``tf.function``)."""
    tf = quiet.import_tensorflow()
    import keras

    from mgpu_edu.workloads import gpt

    t, (batch, seq) = len(devices), (int(tokens.shape[0]), int(tokens.shape[1]))
    chunk = seq // t if sequence_parallel else seq
    spans = [(d * chunk, (d + 1) * chunk) if sequence_parallel else (0, seq) for d in range(t)]
    tape = SplitTape(devices)

    def embed(d: int) -> Any:
        (start, end), w = spans[d], copies[d]
        x = tf.gather(w["token_embedding"], tokens[:, start:end]) + w["position_embedding"][start:end]
        return tf.transpose(x, [1, 0, 2])  # [s, b, h]

    def head(d: int, x: Any) -> tuple[Any, Any]:
        (start, end), w = spans[d], copies[d]
        logits = gpt.head_logits(x, w["final_gamma"], w["final_beta"], w["lm_head"])
        token_losses = keras.losses.sparse_categorical_crossentropy(targets[:, start:end], logits, from_logits=True)
        # each device's own loss: the whole (tensor parallelism) or its chunk's share (sequence parallelism)
        return logits, tf.reduce_sum(token_losses) / (batch * seq)

    xs = tape.compute(embed)
    block_inputs = []
    for i in range(len(model.blocks)):
        block_inputs.append([x.shape.num_elements() * x.dtype.size for x in xs])
        shards = [{n: copies[d][f"block{i}/{n}"] for n in gpt.BLOCK_WEIGHTS} for d in range(t)]
        with tf.name_scope(f"block{i}"):
            xs = parallel_block(tape, xs, shards, model.heads, block=i, sequence_parallel=sequence_parallel)
    logits, losses = zip(*tape.compute(head, xs), strict=True)
    return tape, list(logits), list(losses), block_inputs


def split_backward(tape: SplitTape, losses: Sequence[Any], copies: Sequence[dict[str, Any]],
                   sequence_parallel: bool = False) -> list[dict[str, Any]]:
    """Every device's gradients, by weight name, from the forward pass ``tape`` recorded; with sequence
    parallelism the copied weights' gradients are then all-reduced (into ``tape.log``, as block −1)."""
    tf = quiet.import_tensorflow()
    t = len(copies)
    names = [list(c) for c in copies]
    grads = tape.gradient(losses, [[c[n] for n in names[d]] for d, c in enumerate(copies)])
    gradients: list[dict[str, Any]] = [{} for _ in range(t)]
    for d in range(t):
        for name, grad in zip(names[d], grads[d], strict=True):
            with tf.device(copies[d][name].device):  # the embeddings' (IndexedSlices) made dense on their device
                gradients[d][name] = tf.convert_to_tensor(grad)
    if sequence_parallel and t > 1:  # each copy saw its chunk only: sum the copies' gradients
        for name in names[0]:
            if "/" not in name or CUT[name.split("/")[1]] == "copied":
                mine = placed_like([gradients[d][name] for d in range(t)], [copies[d][name] for d in range(t)])
                summed, trace = collectives.all_reduce(mine, trace=True)
                tape.log.records.append(("backward", -1, f"gradient of copied {name}", trace))
                for d in range(t):
                    gradients[d][name] = summed[d]
    return gradients


def forward_and_gradients(model: Any, tokens: Any, targets: Any, devices: Sequence[str],
                          sequence_parallel: bool = False) -> SplitRun:
    """Run ``model`` (a TinyGPT) tensor-parallel over ``devices``: forward, the next-token loss, and every gradient.

    Each device gets its slice of every block (:func:`shard_block`) and its own copy of the rest,
    as variables placed there (:func:`device_copies`). Tensor parallelism alone: each device computes
    the whole loss from its own copy of the output, as each GPU of a real job does. With
    ``sequence_parallel``, device d holds chunk d of the sequence outside the split regions, computes
    the loss of its chunk's tokens, and the gradients of the copied weights (LayerNorms, biases,
    embeddings, head) are all-reduced afterwards, as Megatron-LM does. Raises a clear error when the
    heads, the MLP or (with sequence parallelism) the sequence don't divide by the number of devices.
    """
    tf = quiet.import_tensorflow()
    devices = list(devices)
    _check_split(model, tokens, devices, sequence_parallel)
    copies = device_copies(model, devices)
    tape, logits, losses, block_inputs = split_forward(model, copies, tokens, targets, devices, sequence_parallel)
    gradients = split_backward(tape, losses, copies, sequence_parallel)
    loss = float(tf.add_n([tf.identity(x) for x in losses])) if sequence_parallel else float(losses[0])
    return SplitRun(logits, loss, gradients, tape.log, [dict(c) for c in copies], sequence_parallel, block_inputs)


@dataclasses.dataclass
class TracedStep:
    """One training step of the split model, traced by TensorFlow (nothing ran), read two ways."""

    received: dict[str, int]  #: bytes each device receives from the others in the traced graph ("CPU:1": …)
    log: CommLog  #: the collectives the traced step runs, as the split model logged them while it was traced
    kept: list[Any]  #: what TensorFlow keeps for the backward pass, tensor by tensor (graphs.Kept)


def trace_step(model: Any, tokens: Any, targets: Any, devices: Sequence[str],
               sequence_parallel: bool = False) -> TracedStep:
    """Trace one training step of ``model`` (a TinyGPT) split over ``devices``, forward and backward, as one
    ``tf.function`` (nothing runs), and read TensorFlow's graph of it two ways.

    ``received``: the bytes each device receives from the others (:func:`graphs.received_in`), to compare with
    ``log``, the collectives the traced step runs: they agree when every tensor that crosses devices does so inside a
    collective, whose bytes the log counts. ``kept``: every tensor the backward pass reads from the forward pass
    (:func:`graphs.kept_in`), with its device and the name scopes it was made in: ``block0/copied/…``
    (LayerNorms and residuals, copied on every device, or with sequence parallelism on its chunk),
    ``block0/edge/…`` (what the region operators hand to the split region: each device's copy, or the
    all-gathered input), ``block0/split/…`` (attention and the MLP on the device's heads and columns); the
    embeddings and the head have no block scope.
    """
    from mgpu_edu.analysis import graphs

    devices = list(devices)
    _check_split(model, tokens, devices, sequence_parallel)
    copies = device_copies(model, devices)
    logs: list[CommLog] = []

    def forward(x: Any, y: Any) -> Any:
        result = split_forward(model, copies, x, y, devices, sequence_parallel)
        logs.append(result[0].log)  # the tape's log, which the backward pass adds to
        return result

    traced = graphs.trace(forward, lambda result: split_backward(result[0], result[2], copies, sequence_parallel),
                          tokens, targets)
    return TracedStep(graphs.received_in(traced), logs[-1], graphs.kept_in(traced))


def formula_bytes_per_block(t: int, seq: int, batch: int, hidden: int, itemsize: int = 4) -> float:
    """Bytes each device sends per block per direction: two ring all-reduces of the activations, 2 · 2(t−1)/t · b·s·h.

    Example:
        >>> formula_bytes_per_block(4, seq=16, batch=2, hidden=32)
        12288.0
    """
    if t == 1:
        return 0.0
    return 2 * 2 * (t - 1) / t * seq * batch * hidden * itemsize
