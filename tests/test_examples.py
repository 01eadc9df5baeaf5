"""The worker scripts in examples/, run for real with LocalCluster, as lesson 08 runs them.

They check what lesson 08 says TensorFlow and Keras do: Keras 3 fit fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585) and under ParameterServerStrategy, the custom
loop keeps every worker's weights identical, and parameter-server steps finish out of order with
stale gradients.
"""

from __future__ import annotations

import json

import numpy as np

from mgpu_edu import cluster, course

EXAMPLES = course.shipped_folder("examples")


def test_multi_worker_custom_loop_agrees_and_fit_fails(tmp_path):
    with cluster.LocalCluster(EXAMPLES / "multi_worker_train.py", workers=2,
                              args=["--steps", "2", "--out", str(tmp_path), "--try-fit"]) as job:
        logs = job.wait(timeout=240)
    for log in logs:
        assert "2 replicas in sync" in log
        assert "fit: failed with ValueError" in log  # Keras 3 fit under MultiWorkerMirroredStrategy
        assert "step 2: loss" in log
    first, second = (np.load(tmp_path / f"worker{i}.npz") for i in range(2))
    assert all(np.array_equal(first[k], second[k]) for k in first.files)


def test_parameter_server_steps_are_stale_and_fit_cannot_drive_them():
    with cluster.LocalCluster(EXAMPLES / "parameter_server.py", workers=1, args=["--steps", "8", "--try-fit"]) as job:
        log = job.wait(timeout=240)[0]
    result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    assert result["fit"].startswith("failed with ValueError")  # Keras 3 has no ClusterCoordinator support
    assert sorted(result["finished"]) == result["scheduled"] == list(range(8))
    assert len(result["staleness"]) == 8 and min(result["staleness"]) >= 0
    assert result["updates"] == 2 + 8  # two warm-up steps and eight: every update landed exactly once
