"""The 3-D grid's bookkeeping: which weights each pipeline stage holds, and which device each coordinate is.

The 3-D run itself is lesson 16's, which asserts it (three runs per make test: Colab-like, Binder-like, its
student version), so no test runs it again: after 3 Adam steps on the 2 × 2 × 2 grid, the losses and every
device's share of every weight equal one device's Keras Adam training; every device sent and held exactly what
the planner predicts; 1F1B kept P − s micro-batches in flight; the run's update copy is half the device's share;
and Keras's Adam updates a gather's repeated rows (an IndexedSlices gradient) differently from the dense
gradient.
"""

from __future__ import annotations

import pytest

from mgpu_edu import threed
from mgpu_edu._validate import BadArgument


def test_stage_weights_and_grid():
    names = ["token_embedding", "position_embedding", "block0/wq", "block1/wq", "block2/wq", "block3/wq",
             "final_gamma", "lm_head"]
    assert threed.stage_weights(names, 4, 2) == [names[:4], names[4:]]
    with pytest.raises(BadArgument, match="can't share 4 blocks"):
        threed.stage_weights(names, 4, 3)
    grid = threed.Grid(2, 2, 2, 4)
    assert [grid.device(k, s, r) for s in range(2) for k in range(2) for r in range(2)] == list(range(8))
