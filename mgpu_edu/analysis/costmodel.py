"""An analytic model of one synchronous data-parallel training step, and how it scales.

step time = compute + all-reduce − the part of the all-reduce hidden behind compute:

- compute: FLOPs per example × per-replica batch ÷ the FLOP/s the device sustains (its
  datasheet peak × the share of it that training really reaches, often well under half);
- all-reduce: the chosen algorithm's bytes over the link, plus a latency per message
  (lesson 03's α + β·bytes model, :func:`mgpu_edu.allreduce.alpha_beta_time`);
- overlap: the fraction of the all-reduce that runs while the backward pass still computes.

It leaves out the input pipeline, stragglers, framework overhead and memory limits: real runs
are slower. Pure arithmetic: no TensorFlow, no GPU needed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mgpu_edu._validate import one_of, positive_number, real_number, whole_number
from mgpu_edu.parallelism.allreduce import ALGORITHMS, alpha_beta_time

#: Datasheet **peak** dense throughput, TFLOP/s: plain fp32; "tf32", the tensor-core format TensorFlow
#: uses for float32 matrix products by default on A100 and H100 (a T4 has none); and 16-bit on tensor
#: cores ("mixed": fp16 on a T4, bf16 or fp16 on A100 and H100 SXM). Training sustains a fraction of
#: these: multiply by the share of peak reached (``utilisation``) to get the rate :func:`step_time` needs.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "T4": {"fp32": 8.1, "mixed": 65.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "mixed": 312.0},
    "H100": {"fp32": 67.0, "tf32": 495.0, "mixed": 989.0},
}
#: Approximate one-direction bandwidth between two devices, GB/s (PCIe: x16 slots, effective).
LINKS: dict[str, float] = {"PCIe 3": 12.0, "PCIe 4": 25.0, "PCIe 5": 50.0, "NVLink 3 (A100)": 300.0,
                           "NVLink 4 (H100)": 450.0, "Ethernet 10G": 1.25}


def training_flops(forward_macs: float) -> float:
    """FLOPs of one training step for one example, from the forward pass's multiply-adds.

    A multiply-add is 2 FLOPs, and the backward pass costs about twice the forward, so a
    training step is about 3 × 2 × MACs. Papers often quote MACs as "FLOPs": ResNet-50's
    "4.1 GFLOPs" per 224 × 224 image are multiply-adds, 8.2 GFLOPs forward.

    Example:
        >>> training_flops(4.1e9) / 1e9  # ResNet-50, one image, forward and backward
        24.6
    """
    positive_number("forward_macs", forward_macs)
    return 3 * 2 * forward_macs


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds for one training step, and where they go."""

    compute_s: float
    comm_s: float
    hidden_s: float
    total_s: float
    replicas: int


def step_time(params: float, flops_per_example: float, batch_per_replica: int, replicas: int,
              device_tflops: float, link_gbytes_per_s: float, algorithm: str = "ring", latency_s: float = 1e-5,
              bytes_per_param: float = 4, overlap: float = 0.0) -> StepTime:
    """Model one synchronous data-parallel step; returns compute_s, comm_s and total_s.

    ``flops_per_example`` counts the whole training step for one example (forward and
    backward, :func:`training_flops`). ``device_tflops`` is the rate the device *sustains*,
    not its datasheet peak. One replica communicates nothing.

    Example:
        >>> t = step_time(25.6e6, 24.6e9, 64, 2, device_tflops=8.1, link_gbytes_per_s=12)
        >>> round(t.compute_s, 3), round(t.comm_s, 4)
        (0.194, 0.0086)
    """
    for name, value in (("params", params), ("flops_per_example", flops_per_example),
                        ("device_tflops", device_tflops), ("link_gbytes_per_s", link_gbytes_per_s),
                        ("bytes_per_param", bytes_per_param)):
        positive_number(name, value)
    whole_number("batch_per_replica", batch_per_replica)
    whole_number("replicas", replicas)
    one_of("algorithm", algorithm, ALGORITHMS)
    real_number("latency_s", latency_s, minimum=0, example=1e-5, hint="It is seconds per message.")
    real_number("overlap", overlap, 0, 1, hint="It is the share of the all-reduce hidden: 0 none, 1 all.")
    compute = flops_per_example * batch_per_replica / (device_tflops * 1e12)
    comm = alpha_beta_time(algorithm, replicas, params * bytes_per_param, alpha_s=latency_s,
                           beta_s_per_byte=1 / (link_gbytes_per_s * 1e9))
    hidden = overlap * min(comm, compute)
    return StepTime(compute, comm, hidden, compute + comm - hidden, replicas)


def speedup(params: float, flops_per_example: float, batch_per_replica: int, replicas: int, device_tflops: float,
            link_gbytes_per_s: float, algorithm: str = "ring", latency_s: float = 1e-5, bytes_per_param: float = 4,
            overlap: float = 0.0) -> float:
    """Throughput of ``replicas`` over one, at a fixed per-replica batch: t(1) × N ÷ t(N).

    Example:
        >>> round(speedup(25.6e6, 24.6e9, 64, 2, device_tflops=8.1, link_gbytes_per_s=12), 2)
        1.92
    """
    args = (params, flops_per_example, batch_per_replica)
    options = {"device_tflops": device_tflops, "link_gbytes_per_s": link_gbytes_per_s, "algorithm": algorithm,
               "latency_s": latency_s, "bytes_per_param": bytes_per_param, "overlap": overlap}
    one = step_time(*args, 1, **options).total_s
    many = step_time(*args, replicas, **options).total_s
    return one * replicas / many


def scaling(params: float, flops_per_example: float, batch_per_replica: int, max_replicas: int,
            **options: Any) -> dict[str, list[float]]:
    """Speed-up and efficiency (speed-up ÷ N) for N = 1 … max_replicas."""
    whole_number("max_replicas", max_replicas)
    ns = list(range(1, max_replicas + 1))
    s = [speedup(params, flops_per_example, batch_per_replica, n, **options) for n in ns]
    return {"replicas": ns, "speedup": s, "efficiency": [v / n for v, n in zip(s, ns, strict=True)]}
