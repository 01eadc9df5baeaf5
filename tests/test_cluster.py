"""LocalCluster reliability: dead workers, time limits, busy ports, and no orphan processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from mgpu_edu import cluster, staleness

SLEEPER = Path(__file__).parent / "workers" / "sleeper.py"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_tf_config_and_addresses():
    config = json.loads(cluster.tf_config({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker", 0))
    assert config == {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
    with pytest.raises(ValueError, match="worker:2 is not in the cluster"):
        cluster.tf_config({"worker": ["a:1"]}, "worker", 2)
    ports = cluster.free_ports(3)
    assert len(set(ports)) == 3 and all(cluster.port_is_free(p) for p in ports)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_workers_finish_and_logs_come_back():
    with cluster.LocalCluster(SLEEPER, workers=3, args=["done"]) as job:
        logs = job.wait(timeout=30)
        assert all(a.startswith("127.0.0.1:") for a in job.addresses)
    assert [log.split()[1] for log in logs] == ["0", "1", "2"]


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_workers_run_on_the_cpu_unless_env_says_otherwise(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the kernel's own GPU, which it holds
    with cluster.LocalCluster(SLEEPER, workers=2, args=["gpus"]) as job:
        hidden = job.wait(timeout=30)
    with cluster.LocalCluster(SLEEPER, workers=2, args=["gpus"], env={"CUDA_VISIBLE_DEVICES": "0"}) as job:
        shown = job.wait(timeout=30)
    assert all("CUDA_VISIBLE_DEVICES=''" in log for log in hidden)
    assert all("CUDA_VISIBLE_DEVICES='0'" in log for log in shown)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_dead_worker_is_a_clear_error_not_a_hang():
    with cluster.LocalCluster(SLEEPER, workers=2, args=["fail"]) as job:
        # WorkerFailed, not the TimeoutError a hang would end in: the healthy worker sleeps 300 s
        with pytest.raises(cluster.WorkerFailed, match=r"worker 1 exited with code 3(.|\n)*on purpose"):
            job.wait(timeout=60)
        pids = job.pids
    assert not any(alive(pid) for pid in pids)  # the healthy worker was stopped too
    assert not job.log_dir.exists()  # the error carried the log's last lines; caught here, nothing is left


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_time_limit_stops_everyone():
    with cluster.LocalCluster(SLEEPER, workers=2, args=["sleep", "300"]) as job:
        with pytest.raises(TimeoutError, match="did not finish within 2 s"):
            job.wait(timeout=2)
        pids = job.pids
    assert not any(alive(pid) for pid in pids)
    assert not job.log_dir.exists()


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_error_inside_the_block_kills_workers():
    with pytest.raises(KeyboardInterrupt):
        with cluster.LocalCluster(SLEEPER, workers=2, args=["sleep", "300"]) as job:
            pids = job.pids
            raise KeyboardInterrupt  # what interrupting a notebook cell does
    assert not any(alive(pid) for pid in pids)
    shutil.rmtree(job.log_dir)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_busy_port_is_swapped_for_a_free_one():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    try:
        with cluster.LocalCluster(SLEEPER, workers=2, args=["done"], ports=[busy, cluster.free_ports(1)[0]]) as job:
            job.wait(timeout=30)
            assert f"127.0.0.1:{busy}" not in job.addresses and job.retries == 1
    finally:
        holder.close()


@pytest.mark.light  # starts processes, none of which imports TensorFlow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="orphan cleanup on kill uses Linux's PDEATHSIG")
def test_killing_the_run_midway_leaves_no_worker(tmp_path):
    """A run (like a notebook kernel) is killed outright while its workers run: none may remain."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(cluster.__file__).parents[1])!r})
        from mgpu_edu import cluster, staleness
        job = cluster.LocalCluster({str(SLEEPER)!r}, workers=3, args=["sleep", "300"])
        job.start()
        print(job.log_dir, " ".join(map(str, job.pids)), flush=True)
        time.sleep(300)
    """))
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    log_dir, *pids = run.stdout.readline().split()
    pids = [int(p) for p in pids]
    assert len(pids) == 3 and all(alive(pid) for pid in pids)
    os.kill(run.pid, signal.SIGKILL)  # no cleanup code in the run gets to execute
    run.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
    shutil.rmtree(log_dir)  # the killed run could not tidy up its logs


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_wait_for_a_line_then_kill_one_worker():
    with cluster.LocalCluster(SLEEPER, workers=2, args=["sleep", "60"]) as job:
        assert "worker 1 pid" in job.wait_for("pid", worker=1, timeout=30)
        job.kill(1)  # as a machine failure would: the other worker keeps running until wait() stops it
        with pytest.raises(cluster.WorkerFailed, match="worker 1 exited with code -9; the others were stopped"):
            job.wait(timeout=30)
        pids = job.pids
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(ValueError, match="worker=2"):
        cluster.LocalCluster(SLEEPER, workers=2).kill(2)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_wait_for_text_that_never_comes():
    with cluster.LocalCluster(SLEEPER, workers=1, args=["done"]) as job:
        with pytest.raises(cluster.WorkerFailed, match="worker 0 finished without printing 'never'"):
            job.wait_for("never", timeout=30)
    with cluster.LocalCluster(SLEEPER, workers=1, args=["sleep", "60"]) as job:
        with pytest.raises(TimeoutError, match="did not print 'never' within 1 s"):
            job.wait_for("never", timeout=1)
        pids = job.pids
    assert not any(alive(pid) for pid in pids)


def test_bad_arguments():
    with pytest.raises(ValueError, match="workers=0"):
        cluster.LocalCluster(SLEEPER, workers=0)
    with pytest.raises(FileNotFoundError, match="nope.py"):
        cluster.LocalCluster("nope.py")
    with pytest.raises(ValueError, match="staleness=-1"):
        staleness.stale_sgd(-1)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_ports_must_match_workers_and_logs_are_cleaned_up(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the clusters' log folders go here
    with pytest.raises(ValueError, match="2 ports for 3 workers"):
        cluster.LocalCluster(SLEEPER, workers=3, ports=[1, 2])
    with pytest.raises(ValueError, match="worker=2"):
        cluster.LocalCluster(SLEEPER, workers=2).kill(2)  # never started: no log folder made
    with cluster.LocalCluster(SLEEPER, workers=2, args=["done"]) as job:
        job.wait(timeout=30)
    with cluster.LocalCluster(SLEEPER, workers=1, args=["sleep", "60"]) as job:  # a failure caught inside
        with pytest.raises(TimeoutError, match="Logs are in"):
            job.wait_for("never", timeout=0.5)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TimeoutError):  # a failure that leaves the block keeps the logs its message cites
        with cluster.LocalCluster(SLEEPER, workers=1, args=["sleep", "60"]) as job:
            job.wait_for("never", timeout=0.5)
    assert list(tmp_path.iterdir()) == [job.log_dir] and (job.log_dir / "worker0.log").exists()


@pytest.mark.light  # starts processes, none of which imports TensorFlow
@pytest.mark.skipif(not cluster.network_isolation_available(), reason="needs Linux user namespaces")
def test_isolated_workers_are_unreachable_from_outside(tmp_path):
    """Workers that listen on a port are reachable on 127.0.0.1 inside their namespace only."""
    listener = tmp_path / "listen.py"
    listener.write_text(textwrap.dedent("""
        import json, os, socket, time
        config = json.loads(os.environ["TF_CONFIG"])
        me = config["cluster"]["worker"][config["task"]["index"]]
        server = socket.socket()
        server.bind(("0.0.0.0", int(me.rsplit(":", 1)[1])))  # all interfaces, as TensorFlow's gRPC does
        server.listen()
        peer = config["cluster"]["worker"][1 - config["task"]["index"]]
        for _ in range(100):  # the other worker is reachable inside the namespace
            try:
                socket.create_connection(peer.rsplit(":", 1), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit("peer unreachable")
        print("reached", peer, flush=True)
        time.sleep(2)
    """))
    with cluster.LocalCluster(listener, workers=2) as job:
        assert job.isolated
        time.sleep(0.8)
        for address in job.addresses:  # from this (outer) namespace, nothing answers
            with pytest.raises(OSError):
                socket.create_connection(address.rsplit(":", 1), timeout=1).close()
        logs = job.wait(timeout=30)
    assert all("reached 127.0.0.1:" in log for log in logs)


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_wait_for_exit_returns_one_workers_own_exit_code_and_leaves_the_others_running():
    with cluster.LocalCluster(SLEEPER, workers=2, args=["sleep", "60"]) as job:
        job.wait_for("pid", worker=1, timeout=30)
        job.kill(1)
        assert job.wait_for_exit(1, timeout=30) == -9  # killed by SIGKILL
        assert job.exit_codes == [None, -9]  # worker 0 still runs
        pids = job.pids
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(ValueError, match="worker=3"):
        cluster.LocalCluster(SLEEPER, workers=2).wait_for_exit(3)
