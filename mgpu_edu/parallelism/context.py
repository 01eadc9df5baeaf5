"""Context parallelism: attention over a sequence split across devices (ring attention).

Tensor and sequence parallelism (:mod:`mgpu_edu.tensor`) still run attention on the whole
sequence on every device. For long sequences the sequence itself is split: device d holds the
queries, keys and values of its own positions, and attention needs every key. Ring attention
(Liu et al., 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context") passes
the key/value blocks round the ring, one send/receive per step (:func:`collectives.send_receive`),
while each device adds each block's contribution to its queries' outputs with the online softmax
of FlashAttention (Dao et al., 2022; Milakov and Gimelshein, 2018): a running maximum (``peak``), a
running sum of exp(score − peak) (``total``), and a running output (``out``), rescaled whenever the
peak grows. After N
steps every device has seen every block, and its output is exactly softmax(q·kᵀ/√d + mask)·v for
its queries.

Causal attention makes the work uneven: with the sequence cut in N contiguous blocks, device d's
queries see only blocks 0…d, so device N−1 computes N blocks while device 0 computes one, and the
others wait for it. The zig-zag layout (from the Llama 3 paper's context parallelism and the
ring-flash-attention project) cuts the sequence into 2N chunks and gives device d chunks d and
2N−1−d: an early and a late one, so every device computes the same amount.

Everything runs on logical devices in one process, and sends only through
:func:`collectives.send_receive`. A ``tf.GradientTape`` over :func:`ring_attention` gives the right
gradients, but computes them on one device (TensorFlow runs a tape's gradient ops on its default device)
and keeps every key/value block that passed through each device. :func:`ring_attention_backward` is the
backward pass as a ring: the blocks go round again, each device recomputes each block's probabilities
from one kept statistic per query (:func:`block_gradients`), and the key/value gradients travel with their
blocks, home at the end.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, one_of
from mgpu_edu.parallelism import collectives
from mgpu_edu.runtime import quiet

LAYOUTS = ("contiguous", "zigzag")
_MASKED = -1e9  # a score that exp() turns into 0 next to any real one (as the one-device attention's mask)


def chunks_of(device: int, n: int, layout: str = "contiguous") -> list[int]:
    """The sequence chunks device ``device`` of ``n`` holds: [d] of N chunks, or [d, 2N−1−d] of 2N (zig-zag).

    Example:
        >>> [chunks_of(d, 4, "zigzag") for d in range(4)]
        [[0, 7], [1, 6], [2, 5], [3, 4]]
    """
    one_of("layout", layout, LAYOUTS)
    return [device] if layout == "contiguous" else [device, 2 * n - 1 - device]


def blocks_computed(n: int, causal: bool = True, layout: str = "contiguous") -> list[int]:
    """How many (query chunk, key chunk) products each device computes; a causal product whose keys all lie
    in its queries' future is skipped. Chunks are s/N long (contiguous) or s/2N (zig-zag).

    Example:
        >>> blocks_computed(4), blocks_computed(4, layout="zigzag")
        ([1, 2, 3, 4], [9, 9, 9, 9])
    """
    count = len(chunks_of(0, n, layout)) * n
    out = []
    for d in range(n):
        mine = chunks_of(d, n, layout)
        out.append(sum(1 for q in mine for k in range(count) if not causal or k <= q))
    return out


def _split(x: Any, name: str, n: int, layout: str) -> list[list[Any]]:
    """x [b, h, s, d] cut into each device's chunks (not yet placed)."""
    tf = quiet.import_tensorflow()
    pieces = len(chunks_of(0, n, layout)) * n
    s = int(x.shape[2])
    if s % pieces:
        what = f"2N = {pieces} chunks (zig-zag)" if layout == "zigzag" else f"N = {n} blocks"
        good = s - s % pieces if s > pieces else pieces
        raise BadArgument(f"ring_attention: {name} has sequence length {s}, which doesn't cut into {what} of equal "
                          f"length. Use a length that divides by {pieces}, e.g. {good}.")
    cut = tf.split(x, pieces, axis=2)
    return [[cut[c] for c in chunks_of(d, n, layout)] for d in range(n)]


@dataclasses.dataclass
class RingTrace:
    """What a ring attention moved and computed, per device."""

    bytes_sent: list[int]
    bytes_received: list[int]
    steps: int  #: send/receive steps round the ring (N − 1)
    blocks: list[int]  #: (query chunk, key chunk) products each device computed (see :func:`blocks_computed`)
    per_step: list[list[int]] = dataclasses.field(default_factory=list)  #: per_step[r][d]: products at step r


def _check(q: Any, k: Any, v: Any, devices: Sequence[str]) -> None:
    if not devices:
        raise BadArgument("ring_attention needs at least one device, got an empty list.")
    if len(q.shape) != 4 or q.shape != k.shape or k.shape != v.shape:
        raise BadArgument(f"ring_attention: q, k and v must have one shape [batch, heads, sequence, head_dim], got "
                          f"{list(q.shape)}, {list(k.shape)} and {list(v.shape)}.")


def _place(q: Any, k: Any, v: Any, devices: list[str], layout: str) -> tuple[list[list[Any]], list[Any]]:
    """Each device's query chunks, and its keys and values as one message: [k | v] side by side, chunk after chunk."""
    tf = quiet.import_tensorflow()
    n = len(devices)
    cut = {name: _split(x, name, n, layout) for name, x in (("q", q), ("k", k), ("v", v))}
    queries, messages = [], []
    for d, device in enumerate(devices):
        with tf.device(device):
            queries.append([tf.identity(chunk) for chunk in cut["q"][d]])
            messages.append(tf.concat([tf.concat([kc, vc], axis=-1) for kc, vc in zip(cut["k"][d], cut["v"][d],
                                                                                      strict=True)], axis=2))
    return queries, messages


def ring_attention(q: Any, k: Any, v: Any, devices: Sequence[str], causal: bool = True, layout: str = "contiguous",
                   trace: bool = False) -> Any:
    """softmax(q·kᵀ/√head_dim + causal mask)·v with the sequence split over ``devices``, by ring attention.

    ``q``, ``k`` and ``v`` are [batch, heads, sequence, head_dim]; the sequence is cut into N equal
    blocks, device d holding block d (``layout="contiguous"``), or into 2N chunks with device d
    holding chunks d and 2N−1−d (``"zigzag"``). Each device keeps its queries and passes its key/value
    block round the ring, N−1 send/receive steps, folding in each block with the online softmax.
    Returns the whole output [batch, heads, sequence, head_dim] in sequence order (put together on
    ``devices[0]``), equal to :func:`gpt.attention` on one device; with ``trace=True``,
    ``(output, RingTrace)``. Raises a clear error when the sequence doesn't cut evenly.

    Example:
        >>> out = ring_attention(q, k, v, layout[:4])  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    devices = list(devices)
    one_of("layout", layout, LAYOUTS)
    _check(q, k, v, devices)
    queries, kv = _place(q, k, v, devices, layout)
    state, record = _ring_forward(queries, kv, devices, causal, layout)
    outputs: dict[int, Any] = {}
    for d, device in enumerate(devices):
        with tf.device(device):
            for (_, total, out), chunk in zip(state[d], chunks_of(d, len(devices), layout), strict=True):
                outputs[chunk] = out / total
    with tf.device(devices[0]):
        whole = tf.concat([outputs[c] for c in sorted(outputs)], axis=2)
    return (whole, record) if trace else whole


def _ring_forward(queries: list[list[Any]], kv: list[Any], devices: list[str], causal: bool,
                  layout: str) -> tuple[list[list[tuple]], RingTrace]:
    """The forward ring: each device's (peak, total, out) per query chunk, and what it sent and computed."""
    tf = quiet.import_tensorflow()
    n, first = len(devices), queries[0][0]
    batch, heads, width, dim = first.shape.as_list()
    scale = 1 / math.sqrt(dim)
    state = []  # per device, per query chunk: (peak, total, out), as fold_block keeps them
    for d, device in enumerate(devices):
        with tf.device(device):
            state.append([(tf.fill([batch, heads, width, 1], tf.constant(-math.inf, first.dtype)),
                           tf.zeros([batch, heads, width, 1], first.dtype),
                           tf.zeros([batch, heads, width, dim], first.dtype)) for _ in chunks_of(d, n, layout)])
    record = RingTrace([0] * n, [0] * n, n - 1, [0] * n, [[0] * n for _ in range(n)])
    for step in range(n):
        for d, device in enumerate(devices):
            source = (d - step) % n  # whose key/value block device d holds at this step
            with tf.device(device):
                keys, values = (tf.split(x, len(chunks_of(source, n, layout)), axis=2)
                                for x in tf.split(kv[d], 2, axis=-1))
                for i, qc in enumerate(chunks_of(d, n, layout)):
                    for kc, kk, vv in zip(chunks_of(source, n, layout), keys, values, strict=True):
                        if causal and kc > qc:
                            continue  # every key in this chunk lies in these queries' future
                        state[d][i] = fold_block(state[d][i], queries[d][i], kk, vv, scale, causal and kc == qc)
                        record.blocks[d] += 1
                        record.per_step[step][d] += 1
        if step < n - 1:  # pass the key/value blocks one device on round the ring
            kv = _pass_on(kv, record)
    return state, record


def _pass_on(tensors: list[Any], record: RingTrace) -> list[Any]:
    """One send/receive round the ring (device d's tensor to device d + 1), its bytes added to ``record``."""
    moved, sent = collectives.send_receive(tensors, offset=1, trace=True)
    record.bytes_sent = [a + b for a, b in zip(record.bytes_sent, sent.bytes_sent, strict=True)]
    record.bytes_received = [a + b for a, b in zip(record.bytes_received, sent.bytes_received, strict=True)]
    return moved


def ring_attention_backward(q: Any, k: Any, v: Any, d_out: Any, devices: Sequence[str], causal: bool = True,
                            layout: str = "contiguous", trace: bool = False) -> Any:
    """The gradients of :func:`ring_attention` for the output's gradient ``d_out``, computed as a ring.

    Each device keeps what a FlashAttention-style forward pass leaves it: its queries, keys, values, output
    and one statistic per query (the log of its softmax's sum, ``peak + log(total)``). The key/value blocks go
    round the ring a second time, and each device adds each block's share of the gradients with
    :func:`block_gradients`: its queries' gradient stays home; the block's key and value gradients travel with
    the block, as one more message, and after the last step they take one more step home. Every device sends
    N − 1 key/value blocks and N − 1 key/value gradient blocks, twice the forward pass's bytes
    (:func:`formula_bytes` with ``backward=True``), and holds one foreign block and its gradients at a time.
    (A device's own block is done first and its gradients kept at home, so the travelling ones start on
    the next device: N − 1 sends, not N.)

    Returns ``(dq, dk, dv)``, each [batch, heads, sequence, head_dim] in sequence order, put together on
    ``devices[0]``; equal to a ``tf.GradientTape``'s gradients of ``ring_attention`` (and of
    :func:`gpt.attention`) for ``output_gradients=d_out``. With ``trace=True``, ``((dq, dk, dv), RingTrace)``
    for the backward ring alone (its ``steps`` count every round that sends).

    Example:
        >>> dq, dk, dv = ring_attention_backward(q, k, v, upstream, layout[:4])  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    devices = list(devices)
    one_of("layout", layout, LAYOUTS)
    _check(q, k, v, devices)
    if d_out.shape != q.shape:
        raise BadArgument(f"ring_attention_backward: d_out is the output's gradient, shaped like q {list(q.shape)}; "
                          f"got {list(d_out.shape)}.")
    n = len(devices)
    scale = 1 / math.sqrt(int(q.shape[-1]))
    queries, kv = _place(q, k, v, devices, layout)
    upstream = _split(tf.convert_to_tensor(d_out, q.dtype), "d_out", n, layout)
    # what the forward pass keeps on each device, per query chunk: the output and its softmax's log-sum
    state, _ = _ring_forward(queries, kv, devices, causal, layout)
    kept, dq = [], []
    for d, device in enumerate(devices):
        with tf.device(device):
            rows = []
            for (peak, total, out), grad in zip(state[d], upstream[d], strict=True):
                grad = tf.identity(grad)
                rows.append((grad, peak + tf.math.log(total), tf.reduce_sum(grad * (out / total), -1, keepdims=True)))
            kept.append(rows)
            dq.append([tf.zeros_like(x) for x in queries[d]])
    record = RingTrace([0] * n, [0] * n, 0, [0] * n, [[0] * n for _ in range(n)])
    home: list[Any] = []  # each device's own block's [dk | dv], from step 0
    travelling: list[Any] = []  # the [dk | dv] of the block each device holds, moving with it
    for step in range(n):
        if step:
            kv = _pass_on(kv, record)
            if step > 1:
                travelling = _pass_on(travelling, record)
            else:  # the first foreign blocks' gradients start at zero, on the device that holds them
                travelling = []
                for device, block in zip(devices, kv, strict=True):
                    with tf.device(device):
                        travelling.append(tf.zeros_like(block))
            record.steps += 1
        for d, device in enumerate(devices):
            source = (d - step) % n
            pieces = len(chunks_of(source, n, layout))
            with tf.device(device):
                keys, values = (tf.split(x, pieces, axis=2) for x in tf.split(kv[d], 2, axis=-1))
                grads = tf.zeros_like(kv[d]) if step == 0 else travelling[d]
                d_keys, d_values = (list(tf.split(x, pieces, axis=2)) for x in tf.split(grads, 2, axis=-1))
                for i, qc in enumerate(chunks_of(d, n, layout)):
                    for j, kc in enumerate(chunks_of(source, n, layout)):
                        if causal and kc > qc:
                            continue
                        gq, gk, gv = block_gradients(queries[d][i], keys[j], values[j], *kept[d][i], scale,
                                                     causal and kc == qc)
                        dq[d][i] += gq
                        d_keys[j] += gk
                        d_values[j] += gv
                        record.blocks[d] += 1
                        record.per_step[step][d] += 1
                grads = tf.concat([tf.concat([a, b], axis=-1) for a, b in zip(d_keys, d_values, strict=True)], axis=2)
            if step == 0:
                home.append(grads)
            else:
                travelling[d] = grads
    if n > 1:  # the last blocks' gradients take one more step, home to the device that holds the block
        travelling = _pass_on(travelling, record)
        record.steps += 1
        for d, device in enumerate(devices):
            with tf.device(device):
                home[d] = home[d] + travelling[d]
    pieces: dict[str, dict[int, Any]] = {"dq": {}, "dk": {}, "dv": {}}
    for d, device in enumerate(devices):
        mine = chunks_of(d, n, layout)
        with tf.device(device):
            d_keys, d_values = (tf.split(x, len(mine), axis=2) for x in tf.split(home[d], 2, axis=-1))
            for i, chunk in enumerate(mine):
                pieces["dq"][chunk], pieces["dk"][chunk], pieces["dv"][chunk] = dq[d][i], d_keys[i], d_values[i]
    with tf.device(devices[0]):
        grads = tuple(tf.concat([part[c] for c in sorted(part)], axis=2) for part in pieces.values())
    return (grads, record) if trace else grads


def block_gradients(q: Any, k: Any, v: Any, d_out: Any, log_sum: Any, delta: Any, scale: float,
                    diagonal: bool = False) -> tuple[Any, Any, Any]:
    """One (query block, key block) product's share of attention's gradients: (dq, dk, dv).

    ``d_out`` is the gradient of the queries' output, ``log_sum`` the log of each query's softmax sum over
    every key (``peak + log(total)`` from :func:`fold_block`), and ``delta`` each query's Σ d_out·out. The
    block's probabilities come back from its scores without the other blocks: p = exp(scores − log_sum). Then
    dv = pᵀ·d_out, and through the softmax ds = p ∘ (d_out·vᵀ − delta), dq = ds·k·scale, dk = dsᵀ·q·scale
    (FlashAttention's backward pass, Dao et al., 2022, Algorithm 4; one kept log-sum per query, rather than
    the maximum and the sum, as FlashAttention-2 keeps it, Dao, 2023).
    """
    tf = quiet.import_tensorflow()
    with tf.name_scope("block_gradients"):  # what op_devices(scope="block_gradients") finds, device by device
        scores = _scores(q, k, scale, diagonal)
        p = tf.exp(scores - log_sum)  # this block's softmax probabilities, exactly the forward pass's
        ds = p * (tf.matmul(d_out, v, transpose_b=True) - delta)  # the gradient of the scores
        return (tf.matmul(ds, k) * scale, tf.matmul(ds, q, transpose_a=True) * scale,
                tf.matmul(p, d_out, transpose_a=True))


def fold_block(state: tuple[Any, Any, Any], q: Any, k: Any, v: Any, scale: float, diagonal: bool = False) -> tuple:
    """Fold one key/value block into a query block's running (maximum, sum, output): the online softmax.

    ``state`` starts as (−∞, 0, 0); after every block is folded in, output / sum is softmax(q·kᵀ·scale)·v
    over all of them. With ``diagonal``, the block holds the queries' own positions: position i sees j ≤ i.
    """
    tf = quiet.import_tensorflow()
    peak, total, out = state
    with tf.name_scope("scores"):  # what is chunk × chunk (kept_per_device tells it by this name)
        scores = _scores(q, k, scale, diagonal)
        # the maximum only keeps exp() in range: out / total doesn't depend on it, so no gradient flows through it
        new_peak = tf.stop_gradient(tf.maximum(peak, tf.reduce_max(scores, axis=-1, keepdims=True)))
        weights = tf.exp(scores - new_peak)
    rescale = tf.exp(peak - new_peak)  # how much the earlier sum and output shrink when the maximum grows
    total = total * rescale + tf.reduce_sum(weights, axis=-1, keepdims=True)
    return new_peak, total, out * rescale + tf.matmul(weights, v)


def _scores(q: Any, k: Any, scale: float, diagonal: bool) -> Any:
    """q·kᵀ·scale for one block; with ``diagonal`` (the queries' own positions), position i sees j ≤ i only."""
    tf = quiet.import_tensorflow()
    scores = tf.matmul(q, k, transpose_b=True) * scale
    if diagonal:
        w = int(scores.shape[-1])
        ones = tf.ones([w, w], scores.dtype)
        scores += (tf.linalg.band_part(ones, 0, -1) - tf.linalg.band_part(ones, 0, 0)) * _MASKED
    return scores


def kept_per_device(q: Any, k: Any, v: Any, devices: Sequence[str], causal: bool = True,
                    layout: str = "contiguous") -> list[dict[str, int]]:
    """Bytes each device keeps for the backward pass of :func:`ring_attention` (TensorFlow's traced graph, via
    :func:`graphs.kept_for_backward`), by kind: ``scores`` (tensors shaped like a block of scores, chunk ×
    chunk), ``blocks`` (shaped like a chunk of q, k, v or the output) and ``statistics`` (one number per
    query: the factors that rescale the running sum and output, and the final sum; no gradient reads the
    running maximum). The backward pass starts from a fixed gradient of the output."""
    tf = quiet.import_tensorflow()
    from mgpu_edu.analysis import graphs

    devices = list(devices)
    weights = tf.random.stateless_normal(q.shape, seed=[0, 0], dtype=q.dtype)

    def forward(*qkv: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(qkv)
            out = ring_attention(*qkv, devices, causal=causal, layout=layout)
        return tape, out, qkv

    kept = graphs.kept_for_backward(
        forward, lambda r: r[0].gradient(r[1], list(r[2]), output_gradients=weights), q, k, v)
    out = [{"scores": 0, "blocks": 0, "statistics": 0} for _ in devices]
    for item in kept:
        kind = "statistics" if item.shape[-1] == 1 else "scores" if "scores" in item.scopes() else "blocks"
        out[int(item.device.rsplit(":", 1)[1])][kind] += item.nbytes
    return out


def formula_bytes(n: int, batch: int, heads: int, seq: int, head_dim: int, itemsize: int = 4,
                  backward: bool = False) -> float:
    """Bytes each device sends (and receives) in one ring attention: N−1 steps of its key and value block,
    (N−1) · 2 · b·h·(s/N)·d · itemsize; with ``backward``, what :func:`ring_attention_backward` sends, twice
    that: the blocks go round again, and their gradients go round once.

    Example:
        >>> formula_bytes(4, batch=2, heads=4, seq=64, head_dim=8), formula_bytes(4, 2, 4, 64, 8, backward=True)
        (24576.0, 49152.0)
    """
    return float((2 if backward else 1) * (n - 1) * 2 * batch * heads * (seq / n) * head_dim * itemsize)
