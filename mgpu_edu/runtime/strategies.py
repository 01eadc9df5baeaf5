"""MirroredStrategy objects that can share one process.

A real job makes one strategy per process. Lessons and tests that compare 1, 2 and 4 replicas, or
fit against a custom loop, make several in one kernel: :func:`make_strategy` lets them coexist.
"""

from __future__ import annotations

from typing import Any

from mgpu_edu.runtime import quiet

#: Collective keys each new strategy skips ahead by (see make_strategy).
_KEY_STRIDE = 10_000


def make_strategy(devices: list[str], cross_device_ops: Any = None) -> Any:
    """A MirroredStrategy over ``devices`` that can live beside earlier ones in this process.

    Every MirroredStrategy numbers its collective all-reduces from the same starting key, so a
    second strategy over a different number of devices in one process can collide with the
    first ("... is joining a group with size 4, but that group has size 2", tensorflow#61314).
    A real job makes one strategy per process; a lesson that compares 1, 2 and 4 replicas makes
    several, so each gets its own key range, as TensorFlow's own tests do.
    """
    tf = quiet.import_tensorflow()
    tf.distribute.MirroredStrategy._collective_key_base += _KEY_STRIDE
    return tf.distribute.MirroredStrategy(list(devices), cross_device_ops=cross_device_ops)
