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

Everything runs in one Python process on logical devices with :mod:`mgpu_edu.collectives`, and the
gradients come from one ``tf.GradientTape`` over all devices: each device keeps its own copy of the
copied weights and computes its own loss, as each GPU of a real job would, so the gradient each copy
gets is the gradient one device would get. :func:`forward_and_gradients` returns everything needed
to compare the split model with the one-device model, weight by weight.
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
    """Every all-reduce the split model ran: (direction "forward" or "backward", block, what, trace)."""

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
        """How many all-reduces ran in that direction (in one block, or in all)."""
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
    """``values[d]`` on the device of ``like[d]``: TensorFlow may build a gradient on its default device."""
    tf = quiet.import_tensorflow()
    out = []
    for ref, value in zip(like, values, strict=True):
        with tf.device(ref.device):
            out.append(tf.identity(value))
    return out


def _unchanged(values: list[Any]) -> tuple[list[Any], None]:
    return placed_like(values, values), None


def _traced(collective: Any) -> Any:
    return lambda values: collective(values, trace=True)


def region_operator(xs: Sequence[Any], forward: Any, backward: Any, log: CommLog, block: int,
                    what: str) -> list[Any]:
    """One operator at a split region's edge, on one tensor per device: ``forward`` going in, ``backward`` coming back.

    Each of the two takes one tensor per device and returns ``(results, trace)``, trace None when
    nothing is sent; every trace goes into ``log``. The four operators below are this one with
    different pairs: identity and all-reduce (f), all-reduce and identity (g), all-gather and
    reduce-scatter, reduce-scatter and all-gather.
    """
    tf = quiet.import_tensorflow()

    @tf.custom_gradient
    def operator(*inputs: Any) -> Any:
        outputs, trace = forward(list(inputs))
        if trace is not None:
            log.records.append(("forward", block, what, trace))

        def grad(*upstream: Any) -> Any:
            gradients, back = backward(placed_like(upstream, outputs))
            if back is not None:
                log.records.append(("backward", block, what, back))
            return gradients

        return outputs, grad

    return list(operator(*xs))


def copy_to_region(xs: Sequence[Any], log: CommLog, block: int, what: str) -> list[Any]:
    """Megatron's f (its code: copy_to_tensor_model_parallel_region): forward, each device keeps its (equal) copy;
    backward, the copies' gradients are all-reduced."""
    return region_operator(xs, _unchanged, _traced(collectives.all_reduce), log, block, what)


def reduce_from_region(partials: Sequence[Any], log: CommLog, block: int, what: str) -> list[Any]:
    """Megatron's g (its code: reduce_from_tensor_model_parallel_region; Korthikanti et al. call it f̄): forward,
    the partial outputs are all-reduced; backward, each device passes its gradient on."""
    return region_operator(partials, _traced(collectives.all_reduce), _unchanged, log, block, what)


def gather_into_region(chunks: Sequence[Any], log: CommLog, block: int, what: str) -> list[Any]:
    """Sequence parallelism's entry, the paper's g: all-gather the sequence forward, reduce-scatter back."""
    return region_operator(chunks, _traced(collectives.all_gather), _traced(collectives.reduce_scatter), log,
                           block, what)


def scatter_from_region(partials: Sequence[Any], log: CommLog, block: int, what: str) -> list[Any]:
    """Sequence parallelism's exit, the paper's ḡ: reduce-scatter the partial outputs by sequence forward,
    all-gather back."""
    return region_operator(partials, _traced(collectives.reduce_scatter), _traced(collectives.all_gather), log,
                           block, what)


def parallel_block(xs: Sequence[Any], shards: Sequence[dict[str, Any]], heads: int, log: CommLog,
                   block: int = 0, sequence_parallel: bool = False) -> list[Any]:
    """One block on t devices: ``xs[d]`` and ``shards[d]`` on device d.

    Tensor parallelism alone: ``xs[d]`` is the whole [s, b, h] input (one copy per device), and so
    is each device's output. With ``sequence_parallel``, ``xs[d]`` is chunk d of the sequence
    ([s/t, b, h]): LayerNorms, biases and residuals run on the chunk, an all-gather replaces f and a
    reduce-scatter replaces g, and device d's output is chunk d of ``gpt.block``'s.
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.workloads import gpt

    t = len(xs)
    devices = [x.device for x in xs]

    def each(fn: Any, *inputs: Sequence[Any]) -> list[Any]:
        out = []
        for d in range(t):
            with tf.device(devices[d]):
                out.append(fn(d, *(items[d] for items in inputs)))
        return out

    enter, leave = (gather_into_region, scatter_from_region) if sequence_parallel else (copy_to_region,
                                                                                        reduce_from_region)
    normed = each(lambda d, x: gpt.layer_norm(x, shards[d]["ln1_gamma"], shards[d]["ln1_beta"]), xs)
    normed = enter(normed, log, block, "attention input")
    partial = each(lambda d, x: tf.matmul(gpt.causal_attention(x, shards[d]["wq"], shards[d]["wk"], shards[d]["wv"],
                                                                heads // t), shards[d]["wo"]), normed)
    attended = leave(partial, log, block, "attention output")
    xs = each(lambda d, x, a: x + a + shards[d]["bo"], xs, attended)
    normed = each(lambda d, x: gpt.layer_norm(x, shards[d]["ln2_gamma"], shards[d]["ln2_beta"]), xs)
    normed = enter(normed, log, block, "MLP input")
    partial = each(lambda d, x: gpt.mlp(x, shards[d]["w1"], shards[d]["b1"], shards[d]["w2"]), normed)
    out = leave(partial, log, block, "MLP output")
    return each(lambda d, x, m: x + m + shards[d]["b2"], xs, out)


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


def _model_weights(model: Any) -> dict[str, Any]:
    tf = quiet.import_tensorflow()
    weights = {"token_embedding": model.tokens, "position_embedding": model.positions,
               "final_gamma": model.final_gamma, "final_beta": model.final_beta, "lm_head": model.head}
    weights = {name: tf.convert_to_tensor(w) for name, w in weights.items()}
    for i, layer in enumerate(model.blocks):
        weights.update({f"block{i}/{name}": w for name, w in layer.weights_by_name().items()})
    return weights


def model_gradients(model: Any, tokens: Any, targets: Any) -> tuple[Any, float, dict[str, Any]]:
    """The one-device reference: logits, mean next-token loss and every weight's gradient, named as in SplitRun."""
    tf = quiet.import_tensorflow()
    import keras

    names = {id(w): n for n, w in [("token_embedding", model.tokens), ("position_embedding", model.positions),
                                   ("final_gamma", model.final_gamma), ("final_beta", model.final_beta),
                                   ("lm_head", model.head)]}
    for i, layer in enumerate(model.blocks):
        names.update({id(getattr(layer, n)): f"block{i}/{n}" for n in layer.weights_by_name()})
    variables = [w for w in model.trainable_variables]
    with tf.GradientTape() as tape:
        logits = model(tokens)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))
    grads = tape.gradient(loss, variables)
    return logits, float(loss), {names[id(v)]: tf.convert_to_tensor(g) for v, g in zip(variables, grads, strict=True)}


def forward_and_gradients(model: Any, tokens: Any, targets: Any, devices: Sequence[str],
                          sequence_parallel: bool = False) -> SplitRun:
    """Run ``model`` (a TinyGPT) tensor-parallel over ``devices``: forward, the next-token loss, and every gradient.

    Each device gets its slice of every block (:func:`shard_block`) and its own copy of the rest,
    as variables placed there. Tensor parallelism alone: each device computes the whole loss from
    its own copy of the output, as each GPU of a real job does. With ``sequence_parallel``, device d
    holds chunk d of the sequence outside the split regions, computes the loss of its chunk's
    tokens, and the gradients of the copied weights (LayerNorms, biases, embeddings, head) are
    all-reduced afterwards, as Megatron-LM does. Raises a clear error when the heads, the MLP or
    (with sequence parallelism) the sequence don't divide by the number of devices.
    """
    tf = quiet.import_tensorflow()
    import keras

    from mgpu_edu.workloads import gpt

    devices, t = list(devices), len(devices)
    if not devices:
        raise BadArgument("forward_and_gradients needs at least one device, got an empty list.")
    check_degree(t, model.hidden, model.heads)
    seq, batch = int(tokens.shape[1]), int(tokens.shape[0])
    if sequence_parallel and seq % t:
        raise BadArgument(f"sequence parallelism over {t} devices cuts the sequence into {t} equal chunks, but the "
                          f"sequence length {seq} doesn't divide by {t}. Use a length that does, e.g. "
                          f"{seq - seq % t or t}.")
    chunk = seq // t if sequence_parallel else seq
    whole = _model_weights(model)
    per_block = [shard_block({n: whole[f"block{i}/{n}"] for n in gpt.BLOCK_WEIGHTS}, t, model.heads)
                 for i in range(len(model.blocks))]
    copies: list[dict[str, Any]] = []
    for d, device in enumerate(devices):
        with tf.device(device):
            mine = {name: tf.Variable(w) for name, w in whole.items() if "/" not in name}
            for i, shards in enumerate(per_block):
                mine.update({f"block{i}/{n}": tf.Variable(w) for n, w in shards[d].items()})
        copies.append(mine)
    log = CommLog()
    with tf.GradientTape() as tape:
        xs, spans = [], [(d * chunk, (d + 1) * chunk) if sequence_parallel else (0, seq) for d in range(t)]
        for d, device in enumerate(devices):
            with tf.device(device):
                w, (start, end) = copies[d], spans[d]
                x = tf.gather(w["token_embedding"], tokens[:, start:end]) + w["position_embedding"][start:end]
                xs.append(tf.transpose(x, [1, 0, 2]))
        block_inputs = []
        for i in range(len(model.blocks)):
            block_inputs.append([int(tf.size(x)) * x.dtype.size for x in xs])
            shards = [{n: copies[d][f"block{i}/{n}"] for n in gpt.BLOCK_WEIGHTS} for d in range(t)]
            xs = parallel_block(xs, shards, model.heads, log, block=i, sequence_parallel=sequence_parallel)
        logits, losses = [], []
        for d, device in enumerate(devices):
            with tf.device(device):
                w, (start, end) = copies[d], spans[d]
                x = gpt.layer_norm(xs[d], w["final_gamma"], w["final_beta"])
                logits.append(tf.transpose(tf.matmul(x, w["lm_head"]), [1, 0, 2]))
                token_losses = keras.losses.sparse_categorical_crossentropy(targets[:, start:end], logits[d],
                                                                            from_logits=True)
                losses.append(tf.reduce_sum(token_losses) / (batch * (end - start if not sequence_parallel
                                                                           else seq)))
        # each device's own loss: the whole (tensor parallelism) or its chunk's share (sequence parallelism)
        total = tf.add_n(losses)
    names = [list(c) for c in copies]
    grads = tape.gradient(total, [[c[n] for n in names[d]] for d, c in enumerate(copies)])
    gradients = [{n: tf.convert_to_tensor(g) for n, g in zip(names[d], grads[d], strict=True)} for d in range(t)]
    if sequence_parallel and t > 1:  # each copy saw its chunk only: sum the copies' gradients
        for name in names[0]:
            if "/" not in name or CUT[name.split("/")[1]] == "copied":
                mine = placed_like([gradients[d][name] for d in range(t)], [copies[d][name] for d in range(t)])
                summed, trace = collectives.all_reduce(mine, trace=True)
                log.records.append(("backward", -1, f"gradient of copied {name}", trace))
                for d in range(t):
                    gradients[d][name] = summed[d]
    loss = float(tf.add_n([tf.identity(x) for x in losses])) if sequence_parallel else float(losses[0])
    return SplitRun(logits, loss, gradients, log, [dict(c) for c in copies], sequence_parallel, block_inputs)


def formula_bytes_per_block(t: int, seq: int, batch: int, hidden: int, itemsize: int = 4) -> float:
    """Bytes each device sends per block per direction: two ring all-reduces of the activations, 2 · 2(t−1)/t · b·s·h.

    Example:
        >>> formula_bytes_per_block(4, seq=16, batch=2, hidden=32)
        12288.0
    """
    if t == 1:
        return 0.0
    return 2 * 2 * (t - 1) / t * seq * batch * hidden * itemsize
