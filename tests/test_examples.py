"""The worker scripts in examples/, run for real with LocalCluster, as lessons 09 and 11 run them.

They check what lessons 09 and 11 say TensorFlow and Keras do, beyond what the lessons' own cells
assert: parameter-server steps survive a lost worker (not a lost parameter server), a run whose
worker is killed resumes from its last checkpoint to the weights of a run never interrupted (lesson
11 asserts the survivor's UnavailableError and the resume itself), a stall no peer would wait for is
refused, and a stuck worker goes unnoticed where a silent one is caught by the heartbeats.

Lesson 09 runs the two plain runs and asserts what they show, three times per make test (Colab-like,
Binder-like, student version), so they are not run again here: Keras 3 fit fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585) and under ParameterServerStrategy, the custom
loop keeps every worker's weights identical, and parameter-server steps finish out of order with
stale gradients, each once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mgpu_edu import cluster, course

pytestmark = pytest.mark.slow  # clusters of TensorFlow processes: make test runs them, make check doesn't

EXAMPLES = course.shipped_folder("examples")


@pytest.mark.parametrize("lost", ["worker", "ps"])
def test_a_parameter_server_job_survives_a_lost_worker_not_a_lost_parameter_server(lost):
    """Lesson 09: each task a process of its own. Kill worker 1 mid-run: the coordinator reschedules its
    steps on worker 0 and every step returns, at least once (the parameter server counts an update for
    every step, and more when a step that had updated ran again). Kill the parameter server: join raises
    UnavailableError, and the job must be restarted."""
    with cluster.LocalCluster(EXAMPLES / "parameter_server.py", workers=1,
                              args=["--steps", "12", "--processes", "--kill", lost]) as job:
        log = job.wait(timeout=240)[0]
    result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    if lost == "worker":
        assert result["error"] is None and sorted(result["finished"]) == result["scheduled"] == list(range(12))
        assert result["warm_up_updates"] + 12 <= result["updates"] <= result["warm_up_updates"] + 12 + 2
    else:
        assert result["error"].startswith("UnavailableError")


def _weights(folder):
    return [np.load(folder / f"worker{i}.npz") for i in range(2)]


def test_a_killed_worker_stops_the_run_and_a_restart_resumes_from_the_last_checkpoint(tmp_path):
    checkpoints, weights, unbroken = tmp_path / "checkpoints", tmp_path / "weights", tmp_path / "unbroken"
    args = ["--steps", "8", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2", "--out", str(weights)]
    script = EXAMPLES / "multi_worker_train.py"
    with cluster.LocalCluster(script, workers=2, args=[*args, "--stall", "1", "5"]) as job:
        job.wait_for("stalled after step 5", worker=1, timeout=240)  # after its step-4 checkpoint and cleanup
        job.kill(1)
        # The survivor is waiting in step 6's all-reduce; the dead process's connections close, and
        # TensorFlow aborts its collectives: it exits by itself with UnavailableError, nobody stops it.
        assert job.wait_for_exit(0, timeout=120) == 1 and job.exit_codes == [1, -9]
        assert "UnavailableError" in job.log(0) and "Collective ops is aborted" in job.log(0)
        assert "step 5: loss" in job.log(0) and "step 6: loss" not in job.log(0)
        pids = job.pids
    assert not any(cluster.running(pid) for pid in pids)
    saved = max(int(p.stem.split("-")[1]) for p in checkpoints.glob("ckpt-*.index"))
    assert saved == 4 and not weights.exists()  # it never finished
    assert not list(checkpoints.glob("temp-*"))  # the non-chief worker deletes its own copies
    with cluster.LocalCluster(script, workers=2, args=[*args, "--stall", "1", "3"]) as job:
        with pytest.raises(cluster.WorkerFailed, match="exited with code 2") as failed:
            job.wait(timeout=240)  # a stall the resumed run would never reach is refused, before any save
    assert "--stall 1 3: this run resumes after step 4 (ckpt-4), so it never finishes step 3" in str(failed.value)
    with cluster.LocalCluster(script, workers=2, args=args) as job:
        logs = job.wait(timeout=240)
    for log in logs:
        assert f"resumed from step {saved} (ckpt-{saved})" in log
        assert f"step {saved}: loss" not in log and f"step {saved + 1}: loss" in log and "step 8: loss" in log
    with cluster.LocalCluster(script, workers=2, args=["--steps", "8", "--out", str(unbroken)]) as job:
        job.wait(timeout=240)
    resumed, reference = _weights(weights), _weights(unbroken)
    for k in resumed[0].files:
        assert np.array_equal(resumed[0][k], resumed[1][k])  # every worker ends with the same weights
        np.testing.assert_allclose(resumed[0][k], reference[0][k], rtol=1e-6, atol=1e-7)  # as if never broken


def test_a_stall_no_peer_would_wait_for_is_refused_with_what_to_give():
    script = EXAMPLES / "multi_worker_train.py"

    def alone(*args):
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=240)
        assert done.returncode == 2
        return done.stderr

    assert ("--stall 1 6: give a step from 1 to 5 (one before --steps 6): the other workers must have a next step"
            in alone("--steps", "6", "--stall", "1", "6"))
    assert "--stall 0 1: a stall needs --steps 2 or more" in alone("--steps", "1", "--stall", "0", "1")
    assert ("--stall 0 1: this process runs alone, not in a cluster of workers (TF_CONFIG or --cluster slurm)"
            in alone("--steps", "6", "--stall", "0", "1"))
    with cluster.LocalCluster(script, workers=2, args=["--steps", "2", "--stall", "2", "1"]) as job:
        with pytest.raises(cluster.WorkerFailed, match="exited with code 2") as failed:
            job.wait(timeout=240)
    assert "--stall 2 1: this cluster's workers are numbered 0 to 1; give one of them" in str(failed.value)


def test_a_stuck_worker_is_never_noticed_and_a_silent_one_is_by_the_heartbeats():
    """What lessons 09 and 11 say: a peer that is alive but stuck keeps the others waiting (no timeout by
    default); one that falls silent (a frozen process, like a machine off the network) is noticed by the
    coordination service MultiWorkerMirroredStrategy starts, whose heartbeats time out after 10 s."""
    args = ["--steps", "4", "--stall", "1", "2"]
    with cluster.LocalCluster(EXAMPLES / "multi_worker_train.py", workers=2, args=args) as job:
        job.wait_for("stalled after step 2", worker=1, timeout=240)
        time.sleep(15)  # longer than the heartbeat timeout: the stuck worker still sends heartbeats
        assert job.exit_codes == [None, None] and "step 3: loss" not in job.log(0)
        os.kill(job.pids[1], signal.SIGSTOP)  # frozen: its connections stay open, it sends nothing
        frozen = time.monotonic()
        assert job.wait_for_exit(0, timeout=120) == 1
        noticed_after = time.monotonic() - frozen
        log = job.log(0)
    # the coordination service's own words say it was the heartbeats; the time (about the 10 s timeout on an idle
    # machine, longer on a busy one) only shows it was not an immediate connection error
    assert "UnavailableError" in log and "stopped sending heartbeats" in log
    assert noticed_after > 5, noticed_after
