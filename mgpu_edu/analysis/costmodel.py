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
from mgpu_edu.analysis.memory import RECOMPUTE
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


# ----------------------------------------------------------------------------- a transformer's FLOPs, and MFU


@dataclasses.dataclass(frozen=True)
class TokenFlops:
    """Training FLOPs per token of a transformer: each block's and the head's (an embedding multiplies nothing)."""

    layer: float
    head: float
    layers: int

    @property
    def total(self) -> float:
        """Every block's and the head's."""
        return self.layers * self.layer + self.head


def transformer_flops(model: Any, recompute: str = "none") -> TokenFlops:
    """FLOPs to train on one token of a ``memory.Transformer``, counted matrix product by matrix product.

    A matrix product of a token by a k × n weight costs 2·k·n FLOPs forward and twice that backward.
    Per block and token, forward: 2 × its matrix weights (the experts a token is routed to, and the
    router), plus attention's scores and weighted sum, 2·s·h each (a query against all s keys, as the
    papers count it; a causal kernel that skips the masked half does half of it). The head adds 2·h·V.
    Training is three forward passes' worth. Recomputation adds forward work that model FLOPs leave out:
    ``"full"`` every block's forward once more, ``"selective"`` the scores and weighted sum (4·s·h per block).

    For a GPT block (4h², 8h², no GQA) this is Korthikanti et al.'s Eq. 7, 72·s·l·h²·(1 + s/(6h) +
    V/(12·l·h)) per sequence, and with ``"full"`` Narayanan et al.'s Eq. 3, 96·s·l·h²·(1 + s/(6h) +
    V/(16·l·h)). Korthikanti et al.'s Eq. 8 for selective recomputation adds 12·s²·h per block, three
    times the 4·s²·h its text redoes; this counts what is redone. Biases and norms are left out, as the
    papers leave them.

    Example:
        >>> from mgpu_edu.analysis.memory import Transformer
        >>> gpt3 = Transformer(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
        >>> round(transformer_flops(gpt3).total / (6 * gpt3.params), 3)  # 6 per weight, plus attention
        1.024
    """
    one_of("recompute", recompute, RECOMPUTE)
    attention, mlp = model.matrices()
    routed = mlp * model.top_k + (model.hidden * model.experts if model.experts > 1 else 0)
    matmuls = 2 * (attention + routed)
    scores = 4 * model.seq * model.hidden
    extra = {"none": 0, "selective": scores, "full": matmuls + scores}[recompute]
    return TokenFlops(3 * (matmuls + scores) + extra, 3 * 2 * model.hidden * model.vocab, model.layers)


def mfu(model: Any, tokens_per_second: float, devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's training FLOPs per second (:func:`transformer_flops`, without
    recomputation) over the devices' peak. Chowdhery et al. (2022, PaLM, Appendix B) define it; Korthikanti
    et al. (Table 5) and the Llama 3 paper (Table 4) report it.

    Example:
        >>> from mgpu_edu.analysis.memory import Transformer
        >>> gpt3 = Transformer(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
        >>> round(mfu(gpt3, 64 * 2048 / 13.75, 64, 312e12), 3)  # Korthikanti et al., Table 5: 51.4 %
        0.514
    """
    positive_number("tokens_per_second", tokens_per_second)
    whole_number("devices", devices)
    positive_number("peak_flops", peak_flops)
    return transformer_flops(model).total * tokens_per_second / (devices * peak_flops)
