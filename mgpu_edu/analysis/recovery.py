"""Surviving failures: what a checkpointed run loses when a worker dies, and how often to checkpoint.

Pure arithmetic, no TensorFlow. Lesson 11 runs the real thing: ``keras.callbacks.BackupAndRestore``
with ``fit``, and a ``tf.train.CheckpointManager`` in the multi-worker custom loop of
``examples/multi_worker_train.py``, killed and restarted with :class:`mgpu_edu.cluster.LocalCluster`.
"""

from __future__ import annotations

import math

from mgpu_edu._validate import real_number, whole_number


def last_checkpoint(steps_done: int, every: int) -> int:
    """The step of the last checkpoint saved when a run dies after ``steps_done`` steps.

    Checkpoints are saved after steps every, 2·every, …; a restarted run resumes from the
    last one and runs the steps after it again.

    Example:
        >>> last_checkpoint(137, 50), 137 - last_checkpoint(137, 50)  # resumes at 100, redoes 37 steps
        (100, 37)
    """
    done = whole_number("steps_done", steps_done, minimum=0, example=137)
    k = whole_number("every", every, example=50, hint="It is steps between checkpoints.")
    return done // k * k


def checkpoint_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's (1974) interval between checkpoints that loses the least time: √(2 · save time · MTBF).

    Checkpoint more often and saving costs more; less often and each failure throws away more
    work (on average half an interval). ``mtbf_seconds`` is the mean time between failures of
    the whole job, which shrinks as it uses more machines. A first-order rule, good while the
    save time is much shorter than the MTBF.

    Example:
        >>> round(checkpoint_interval(30, 8 * 3600))  # a 30 s save, a failure every 8 hours
        1315
    """
    save = real_number("save_seconds", save_seconds, minimum=0, above=True, example=30,
                       hint="It is how long one checkpoint takes to write.")
    mtbf = real_number("mtbf_seconds", mtbf_seconds, minimum=0, above=True, example=8 * 3600,
                       hint="It is the job's mean time between failures.")
    return math.sqrt(2 * save * mtbf)


def machines_mtbf(machine_mtbf_seconds: float, machines: int) -> float:
    """The mean time between failures of a job on ``machines`` machines that fail independently.

    Example:
        >>> machines_mtbf(1000 * 3600, 1000) / 3600  # machines that fail every 1,000 h: hourly, on 1,000
        1.0
    """
    mtbf = real_number("machine_mtbf_seconds", machine_mtbf_seconds, minimum=0, above=True, example=3.6e6)
    n = whole_number("machines", machines, example=1000)
    return mtbf / n


def time_lost_fraction(interval_seconds: float, save_seconds: float, mtbf_seconds: float) -> float:
    """The share of a job's time lost to checkpoints and failures, to first order: δ/τ + τ/(2M).

    Saving takes δ every τ seconds; a failure, every M seconds on average, throws away half an
    interval. :func:`checkpoint_interval` is the τ that makes this smallest.

    Example:
        >>> round(time_lost_fraction(checkpoint_interval(30, 28_800), 30, 28_800), 4)
        0.0456
    """
    tau = real_number("interval_seconds", interval_seconds, minimum=0, above=True, example=1315)
    save = real_number("save_seconds", save_seconds, minimum=0, above=True, example=30)
    mtbf = real_number("mtbf_seconds", mtbf_seconds, minimum=0, above=True, example=28_800)
    return save / tau + tau / (2 * mtbf)
