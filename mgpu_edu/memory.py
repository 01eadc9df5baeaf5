"""Memory per device, as arithmetic: the weights, their gradients and the optimizer's state.

The accounting follows the ZeRO paper (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models"). Every parameter costs bytes for its value, its
gradient and the optimizer's state:

| precision | value | gradient | optimizer state (Adam / SGD with momentum / SGD) |
|---|---:|---:|---|
| ``"fp32"`` | 4 | 4 | 8 / 4 / 0 (Adam's two moments; the momentum) |
| ``"mixed"`` | 2 | 2 | 12 / 8 / 4 (an fp32 master copy of the weights, plus the above) |

Mixed-precision Adam keeps K = 12 bytes of optimizer state per parameter: 16 bytes in all.
ZeRO stage 1 shards the optimizer state over the data-parallel devices, stage 2 the gradients
too, stage 3 the values too. Pure arithmetic: no TensorFlow, no GPU.
"""

from __future__ import annotations

import dataclasses

from mgpu_edu._validate import one_of, whole_number

#: Bytes per parameter for (value, gradient) in each precision.
PRECISIONS: dict[str, tuple[int, int]] = {"fp32": (4, 4), "mixed": (2, 2)}
#: Bytes of optimizer state per parameter, in each precision (mixed adds an fp32 master copy).
OPTIMIZER_STATE: dict[str, dict[str, int]] = {
    "fp32": {"adam": 8, "momentum": 4, "sgd": 0},
    "mixed": {"adam": 12, "momentum": 8, "sgd": 4},
}
ZERO_STAGES = (0, 1, 2, 3)


@dataclasses.dataclass(frozen=True)
class ModelStates:
    """Bytes one device holds for the model's states: values, gradients, optimizer state, and their sum."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_states(params: int, data_parallel: int = 1, zero_stage: int = 0, optimizer: str = "adam",
                 precision: str = "mixed") -> ModelStates:
    """Bytes per device for ``params`` parameters, with ZeRO ``zero_stage`` over ``data_parallel`` devices.

    Stage 0 is plain data parallelism: every device holds everything. Stage 1 divides the
    optimizer state by ``data_parallel``, stage 2 the gradients too, stage 3 the values too.
    It reproduces the ZeRO paper's example, 7.5 B parameters on 64 GPUs with mixed-precision
    Adam: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB for stages 0 to 3.

    Example:
        >>> [round(model_states(7_500_000_000, 64, stage).total / 1e9, 1) for stage in (0, 1, 2, 3)]
        [120.0, 31.4, 16.6, 1.9]
    """
    whole_number("params", params)
    whole_number("data_parallel", data_parallel, example=8)
    whole_number("zero_stage", zero_stage, minimum=0, maximum=3, hint="ZeRO has stages 0 (none), 1, 2 and 3.")
    one_of("precision", precision, PRECISIONS, hint="'mixed' keeps 16-bit values and gradients.")
    one_of("optimizer", optimizer, OPTIMIZER_STATE[precision], hint="'momentum' is SGD with momentum.")
    value, grad = PRECISIONS[precision]
    state = OPTIMIZER_STATE[precision][optimizer]
    n = data_parallel
    return ModelStates(params * value / (n if zero_stage >= 3 else 1),
                       params * grad / (n if zero_stage >= 2 else 1),
                       params * state / (n if zero_stage >= 1 else 1))
