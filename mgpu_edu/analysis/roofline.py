"""When communication costs time: each axis's threshold, from a device's FLOP/s and a link's bandwidth.

A step hides its communication only if the computation it can overlap takes at least as long. For a
weight matrix of D × F (for tensor parallelism, the MLP's pair, D × F and F × D, between two all-reduces),
with b tokens per device, N devices and links of W bytes/s one way
(lesson 03's α-β model with α = 0, ring collectives, 2-byte values):

- **data parallelism**: the backward pass computes 4·b·D·F FLOPs while the gradient's ring all-reduce sends
  2(N − 1)/N · 2·D·F bytes: communication-bound below b = (N − 1)/N · C/W tokens per device;
- **FSDP (ZeRO-3)**: the forward and backward compute 6·b·D·F while two all-gathers of the weights and a
  reduce-scatter of the gradient send 3 · (N − 1)/N · 2·D·F: the same threshold;
- **tensor parallelism** of degree Y (Megatron's MLP): each pass computes 4·b·D·F/Y while one all-reduce of
  the b × D activations sends 2(Y − 1)/Y · 2·b·D: communication-bound unless F > (Y − 1) · C/W, whatever b;
- **a matmul against memory**: its arithmetic intensity 2BDF / 2(BD + DF + BF) must exceed C / HBM
  bandwidth, about B for B ≪ D, F.

The JAX scaling book ("How to Scale Your Model", its training and GPU chapters) derives the same
thresholds: per-device tokens B/X > C/W for data parallelism and FSDP (2,200 tokens on an H100 with
450 GB/s of NVLink, about 2,500 across nodes), and Y < F·W/C for tensor parallelism. Across nodes a flat
ring runs at one GPU's network link (``inside=False``: 50 GB/s on an H100 node of eight 400 Gb/s cards); a
hierarchical all-reduce, as NCCL runs it, uses each node's whole 400 GB/s, which is the book's 2,500. Pure
arithmetic: no TensorFlow.
"""

from __future__ import annotations

import dataclasses

from mgpu_edu._validate import one_of, positive_number, whole_number
from mgpu_edu.parallelism.allreduce import alpha_beta_time


@dataclasses.dataclass(frozen=True)
class Device:
    """A device's datasheet peaks: 16-bit matrix FLOP/s, memory bandwidth, and the bandwidth (one direction)
    each device has to another inside a node and to other nodes, bytes/s."""

    flops: float
    memory_bandwidth: float
    intra_bandwidth: float
    inter_bandwidth: float


#: Datasheet peaks, dense 16-bit (fp16 on a T4, bf16 on A100 and H100). The T4 and the laptop have no
#: NVLink: devices talk over PCIe (T4) or share the machine's memory (the course's logical CPUs on a laptop:
#: a copy between them is a memory copy). Approximate; every figure is a peak, not what training reaches.
DEVICES: dict[str, Device] = {
    "T4": Device(65e12, 320e9, 12e9, 12e9),
    "A100": Device(312e12, 2.0e12, 300e9, 25e9),
    "H100": Device(989e12, 3.35e12, 450e9, 50e9),
    "laptop CPU": Device(1e12, 60e9, 20e9, 20e9),
}
AXES = ("data", "fsdp", "tensor")


def data_parallel_tokens(device: Device, n: int, inside: bool = True) -> float:
    """Tokens per device below which data parallelism (or FSDP) is communication-bound: (N − 1)/N · C/W.

    Example:
        >>> round(data_parallel_tokens(DEVICES["H100"], 8))  # 7/8 · 989e12 / 450e9
        1923
    """
    whole_number("n", n, minimum=2, hint="It is the number of devices the gradients are summed over.")
    return (n - 1) / n * device.flops / _link(device, inside)


def tensor_parallel_width(device: Device, degree: int, inside: bool = True) -> float:
    """The MLP width F below which tensor parallelism of degree Y is communication-bound: (Y − 1) · C/W.

    Example:
        >>> round(tensor_parallel_width(DEVICES["H100"], 8))  # 7 · 989e12 / 450e9
        15384
    """
    whole_number("degree", degree, minimum=2, hint="It is the tensor-parallel degree Y.")
    return (degree - 1) * device.flops / _link(device, inside)


def critical_intensity(device: Device) -> float:
    """FLOPs per byte of memory traffic above which a kernel is compute-bound: C / HBM bandwidth.

    Example:
        >>> round(critical_intensity(DEVICES["H100"]))  # 989e12 / 3.35e12
        295
    """
    return device.flops / device.memory_bandwidth


def matmul_intensity(b: int, d: int, f: int, bytes_per_value: int = 2) -> float:
    """A [b, d] × [d, f] product's FLOPs per byte moved: 2·b·d·f / (bytes · (b·d + d·f + b·f)).

    Example:
        >>> round(matmul_intensity(512, 8192, 8192), 1)  # about b when b ≪ d, f
        455.1
    """
    for name, value in (("b", b), ("d", d), ("f", f)):
        whole_number(name, value)
    return 2 * b * d * f / (bytes_per_value * (b * d + d * f + b * f))


def axis_seconds(axis: str, device: Device, n: int, tokens: float, d: int, f: int,
                 inside: bool = True) -> tuple[float, float]:
    """(compute, communication) seconds for one D × F weight matrix on one ``axis``, at datasheet peak, with
    the α-β model of lesson 03 (α = 0: the threshold is about bandwidth) for the collectives.

    ``tokens`` is per device. Data: the backward pass's 4·b·D·F against the gradient's ring all-reduce;
    FSDP: forward and backward, 6·b·D·F, against two all-gathers and a reduce-scatter; tensor (degree
    ``n``): one pass, 4·b·D·F/Y, against one all-reduce of the b × D activations.

    Example:
        >>> compute, comm = axis_seconds("data", DEVICES["H100"], 8, data_parallel_tokens(DEVICES["H100"], 8), 4096,
        ...                              16384)
        >>> round(compute / comm, 9)  # at the threshold they are equal
        1.0
    """
    one_of("axis", axis, AXES)
    whole_number("n", n, minimum=2)
    positive_number("tokens", tokens)
    beta = 1 / _link(device, inside)
    weights = 2 * d * f  # bytes of one 16-bit matrix (and of its gradient)
    if axis == "data":
        return 4 * tokens * d * f / device.flops, alpha_beta_time("ring", n, weights, 0.0, beta)
    if axis == "fsdp":  # an all-gather or a reduce-scatter is half a ring all-reduce
        return 6 * tokens * d * f / device.flops, 3 * alpha_beta_time("ring", n, weights, 0.0, beta) / 2
    return 4 * tokens * d * f / (n * device.flops), alpha_beta_time("ring", n, 2 * tokens * d, 0.0, beta)


def _link(device: Device, inside: bool) -> float:
    return device.intra_bandwidth if inside else device.inter_bandwidth
