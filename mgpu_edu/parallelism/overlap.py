"""Hiding communication behind computation: a collective matmul, and which work a step's communication can
overlap.

A tensor-parallel layer whose input arrives split by rows (sequence parallelism) all-gathers it, then
multiplies: nothing computes while the gather runs. The **collective matmul** (Wang et al., 2023; the JAX
scaling book's "collective matmul"; UvA's tensor-parallel notebooks) cuts the two into N steps: each device
multiplies the chunk of rows it holds by its weight columns while it passes that chunk on round the ring,
so every send but none of the products waits: each step's send overlaps that step's product. The bytes are
the all-gather's; what changes is that the product no longer waits for all of them.

:func:`collective_matmul` runs it on logical devices (sends through :func:`collectives.send_receive`),
equal to the all-gather followed by the product; its trace counts, step by step, the bytes in flight and the
multiply-adds that can run meanwhile. Logical devices run one op at a time, so the overlap is counted, not
timed: on GPUs the send and the product run on different engines at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument
from mgpu_edu.parallelism import collectives
from mgpu_edu.runtime import quiet


@dataclasses.dataclass
class OverlapTrace:
    """What a decomposed collective moved and computed, step by step (every device alike)."""

    bytes_sent: list[int]  #: per device, over the whole run
    sent_per_step: list[int]  #: bytes each device sends at step k (0 at the last: nothing left to pass on)
    flops_per_step: list[int]  #: FLOPs device 0 computes at step k, while that step's send is in flight

    @property
    def overlapped_steps(self) -> int:
        """Steps whose product runs while a send is in flight: every step but the last."""
        return sum(1 for sent in self.sent_per_step if sent)


def collective_matmul(x_shards: Sequence[Any], w_shards: Sequence[Any], trace: bool = False) -> Any:
    """All-gather then multiply, decomposed: device d ends with [x_0; x_1; …; x_{N−1}] · w_d.

    ``x_shards[d]`` ([rows/N, k]) and ``w_shards[d]`` ([k, n_d]) sit on device d (the input split by rows, as
    sequence parallelism leaves it; the weight split by columns, as a column-parallel layer holds it). At step
    j device d multiplies the chunk it holds, chunk (d − j) mod N, by w_d, and passes the chunk on to device
    d + 1, N − 1 sends in all: an all-gather's (N − 1)/N of the input, moved one chunk at a time while the
    products run. Returns one [rows, n_d] tensor per device (its rows in order), or ``(outputs,
    OverlapTrace)`` with ``trace=True``.

    Example:
        >>> outputs = collective_matmul(x_shards, w_shards)  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    x_shards, w_shards = list(x_shards), list(w_shards)
    n = len(x_shards)
    if n == 0 or len(w_shards) != n:
        raise BadArgument(f"collective_matmul needs one input shard and one weight shard per device, got "
                          f"{len(x_shards)} and {len(w_shards)}.")
    rows, k = (int(v) for v in x_shards[0].shape)
    if any(tuple(x.shape) != (rows, k) for x in x_shards) or any(int(w.shape[0]) != k for w in w_shards):
        raise BadArgument(f"collective_matmul: every input shard must be [rows/N, k] and every weight shard [k, n_d]: "
                          f"got inputs {[list(x.shape) for x in x_shards]} and weights "
                          f"{[list(w.shape) for w in w_shards]}.")
    devices = [x.device for x in x_shards]
    held = list(x_shards)
    parts: list[dict[int, Any]] = [{} for _ in range(n)]
    record = OverlapTrace([0] * n, [], [])
    for step in range(n):
        for d in range(n):
            with tf.device(devices[d]):
                parts[d][(d - step) % n] = tf.matmul(held[d], w_shards[d])  # this step's product
        record.flops_per_step.append(2 * rows * k * int(w_shards[0].shape[-1]))
        if step < n - 1:  # meanwhile, the chunk goes on to the next device
            held, sent = collectives.send_receive(held, offset=1, trace=True)
            record.bytes_sent = [a + b for a, b in zip(record.bytes_sent, sent.bytes_sent, strict=True)]
            record.sent_per_step.append(sent.bytes_sent[0])
        else:
            record.sent_per_step.append(0)
    outputs = []
    for d in range(n):
        with tf.device(devices[d]):
            outputs.append(tf.concat([parts[d][c] for c in range(n)], axis=0))
    return (outputs, record) if trace else outputs
