"""Stale gradients: what asynchronous training does to gradient descent, in the simplest case.

Pure arithmetic: no TensorFlow, no workers.
"""

from __future__ import annotations

from mgpu_edu._validate import whole_number


def stale_sgd(staleness: int, steps: int = 60, learning_rate: float = 0.3, curvature: float = 1.0) -> list[float]:
    """Gradient descent on f(w) = curvature · w² / 2 when each gradient is ``staleness`` steps old.

    Asynchronous workers apply gradients computed from weights that others have since
    changed; this is the simplest picture of it. Returns |w| after each step, from w = 1.

    Example:
        >>> round(stale_sgd(0, steps=3)[-1], 3)
        0.343
    """
    whole_number("staleness", staleness, minimum=0, hint="It counts the updates a gradient is behind.")
    history = [1.0]
    for _ in range(steps):
        old = history[max(0, len(history) - 1 - staleness)]
        history.append(history[-1] - learning_rate * curvature * old)
    return [abs(w) for w in history[1:]]
