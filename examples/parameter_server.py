"""Asynchronous training with ParameterServerStrategy and a ClusterCoordinator, on one machine.

The cluster (2 workers, 1 parameter server, all on 127.0.0.1) runs inside this process, as
TensorFlow's own tutorial does; on a real cluster each task is a separate process started with
its TF_CONFIG, and this script would be the coordinator. The coordinator schedules steps; each
runs on whichever worker is free, reads the variables from the parameter server, and writes its
update back without waiting for the others. Steps therefore finish out of order, and a step may
use weights that other steps have already changed (stale gradients). Every fourth step does more
work than the others, and step 0 stands for a slow worker: it reads the weights first (the other
steps wait for that), then starts its work only once another step's update has landed, so it always
finishes after at least one step scheduled later, with a gradient at least one update stale, however
busy the machine is (short of a wait of a whole minute: a guard against a hang, never reached in a
healthy run).

Prints one JSON line: the order steps were scheduled in, the order they finished in (the order the
parameter server counted their updates: a counter beside the weights that each step increments right
after its update, reading the new count in the same locked operation, so every update gets a number
of its own, in the order they landed, however busy the machine is; timestamps taken inside the steps
disagreed with that order on a loaded machine), each step's staleness (how many other updates
reached the parameter server between the step reading the weights and applying its own update; it
depends on which steps happened to overlap, and it is approximate: the weights and the update
counter are two variables, updated one after the other, not together), the number of updates the
parameter server applied, and the final loss.
``--try-fit`` first tries Keras 3 ``fit`` under this strategy and reports how it fails (Keras 3 has
no ClusterCoordinator support; tf-keras 2's ``fit`` had), in the JSON's "fit" field.

**Losing a task.** ``--processes`` runs each worker and the parameter server as a process of its
own (this script, with ``--serve``), as on a real cluster. ``--kill worker`` kills worker 1 once a
few steps have updated the weights: the coordinator notices (its requests to the dead worker fail),
puts that worker's unfinished steps back in its queue, and the other workers run them, so every
scheduled step still returns. A step runs at least once, not exactly once: one that had already
updated the weights when its worker died runs, and updates, again. ``--kill ps`` kills the parameter
server instead: the coordinator's ``join`` raises ``UnavailableError`` (reported in the JSON's
"error" field), and the job must be restarted, the coordinator too, from a checkpoint.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time

# Exit about 0.8 s sooner: after importing TensorFlow (and Keras) a process holds some 300,000 Python
# objects, and Python's garbage collector sweeps them as it shuts down, just before the OS frees the
# memory anyway. Frozen objects are skipped. (It matters when a course starts many short jobs.)
atexit.register(gc.freeze)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # fail, don't hang, when a task is unreachable
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")


def free_ports(count: int) -> list[int]:
    """Free ports on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def serve(spec: dict, job: str, index: int) -> None:
    """Run one task of the cluster (a worker or the parameter server) until this process is stopped."""
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index, protocol="grpc",
                                  start=True)
    print(f"serving {job}:{index}", flush=True)
    server.join()


def start_servers(spec: dict, workers: int, in_process: bool) -> list:
    """The cluster's tasks: in-process servers (TensorFlow's tutorial), or one process each (a real cluster)."""
    cluster = tf.train.ClusterSpec(spec)
    tasks = [("worker", i) for i in range(workers)] + [("ps", 0)]
    if in_process:
        # In-process workers need enough inter-op threads, or they wait on each other (TF's tutorial).
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=max(os.cpu_count() or 1, workers + 1))
        return [tf.distribute.Server(cluster, job_name=job, task_index=i, config=config if job == "worker" else None,
                                     protocol="grpc", start=True) for job, i in tasks]
    processes = [subprocess.Popen([sys.executable, __file__, "--serve", job, str(i), "--cluster", json.dumps(spec)],
                                  stdout=subprocess.PIPE, text=True) for job, i in tasks]
    for process in processes:  # each says so once its server listens
        if not (process.stdout.readline() or "").startswith("serving"):
            raise RuntimeError("a parameter-server task failed to start; run it alone to see why")
    return processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--try-fit", action="store_true", help="first try Keras fit under this strategy")
    parser.add_argument("--processes", action="store_true", help="run each task as a process of its own")
    parser.add_argument("--kill", choices=["worker", "ps"],
                        help="with --processes: kill worker 1, or the parameter server, once some steps have updated")
    parser.add_argument("--serve", nargs=2, metavar=("JOB", "INDEX"), help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.cluster), args.serve[0], int(args.serve[1]))
        return
    if args.kill and not (args.processes and args.workers >= 2):
        parser.error(f"--kill {args.kill} needs --processes and --workers 2 or more: a task in this process can't "
                     "be killed alone, and the job needs another worker to carry on")

    ports = free_ports(args.workers + 1)
    spec = {"worker": [f"127.0.0.1:{p}" for p in ports[:-1]], "ps": [f"127.0.0.1:{ports[-1]}"]}
    cluster = tf.train.ClusterSpec(spec)
    servers = start_servers(spec, args.workers, in_process=not args.processes)
    if args.processes:  # leave no task behind, however this process ends
        atexit.register(lambda: [p.kill() for p in servers if p.poll() is None])

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    fit = None
    if args.try_fit:
        import keras

        try:
            with strategy.scope():
                model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1)])
                model.compile(optimizer="sgd", loss="mse")
            model.fit(tf.zeros((32, 16)), tf.zeros((32, 1)), epochs=1, steps_per_epoch=2, verbose=0)
            fit = "ran"
        except Exception as error:  # reported in the JSON line, then the coordinator runs
            fit = f"failed with {type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
    with strategy.scope():
        w = tf.Variable(tf.zeros((16, 1)), name="w")
        version = tf.Variable(0, dtype=tf.int64, name="version")  # updates the parameter server has applied
        step0_read = tf.Variable(False, name="step0_read")  # step 0 has read the weights
        target = tf.constant(tf.linspace(-1.0, 1.0, 16)[:, None])

    workers = args.workers
    last_update = tf.constant(args.workers + args.steps - 1, tf.int64)  # warm-ups, then every step but step 0

    def wait_while(pending, since: tf.Tensor) -> tf.Tensor:
        """Spin while pending() holds, for at most a minute after `since` (a guard against a hang, never reached
        in a healthy run); returns the number of turns, for control dependencies."""
        return tf.while_loop(lambda n: tf.logical_and(pending(), tf.timestamp() - since < 60.0), lambda n: n + 1,
                             [tf.constant(0)])

    @tf.function
    def step(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        # step 0 stands for a slow worker (with two workers or more). The other scheduled steps (not the
        # warm-ups, numbered from 1001) first wait until it has read the weights: on a busy machine its
        # worker may be slow to start, and the others must not all finish before it reads
        slow = tf.logical_and(tf.equal(index, 0), workers > 1)
        others = tf.logical_and(tf.logical_and(index > 0, index < 1000), workers > 1)
        after_step0 = wait_while(lambda: tf.logical_and(others, tf.logical_not(step0_read.read_value())),
                                 tf.timestamp())
        with tf.GradientTape() as tape:
            with tf.control_dependencies([after_step0]):
                seen = version.read_value()  # the weights' version this step starts from
            with tf.control_dependencies([seen]):
                current = w.read_value()  # read right after the version: the weights this step uses
            with tf.control_dependencies([current]):  # step 0 lets the others go once it has read
                told = tf.cond(slow, lambda: step0_read.assign(True).read_value(), lambda: tf.constant(False))
            # step 0 then starts only once another step's update has landed, so it can't finish first, and
            # its gradient is at least 1 update stale (none is left to wait for once every other step has
            # updated: a rerun after a lost worker)
            with tf.control_dependencies([told]):
                since = tf.timestamp()

            def no_new_update() -> tf.Tensor:
                now = version.read_value()
                return tf.logical_and(slow, tf.logical_and(now <= seen, now < last_update))
            waited = wait_while(no_new_update, since)
            # uneven work, done only after both reads: every fourth step (0, 4, 8, ...) does 6 big products
            with tf.control_dependencies([current, waited]):
                x = tf.random.stateless_normal((256, 16), seed=tf.stack([index, 0]))
                heavy = tf.equal(tf.math.floormod(index, 4), 0)
                busy = tf.zeros((768, 768))
                for k in range(6):
                    if k == 0 or heavy:
                        busy += tf.matmul(tf.random.stateless_normal((768, 768), seed=tf.stack([index, k])),
                                          tf.random.stateless_normal((768, 768), seed=tf.stack([k, index])))
            loss = tf.reduce_mean((x @ current - x @ target) ** 2) + 0.0 * tf.reduce_sum(busy)
        gradient = tape.gradient(loss, w)
        with tf.control_dependencies([busy]):  # the step's work is done before its update lands
            update = w.assign_sub(0.1 * gradient)
        with tf.control_dependencies([update]):  # counted after the update (a waiting step 0 then goes on)
            # this step's update is number `applied`: the count goes up and is read in one locked operation on the
            # parameter server, so two steps never get the same number (assign_add then a read could)
            applied = tf.raw_ops.ResourceCountUpTo(resource=version.handle, limit=2**62, T=tf.int64) + 1
        return index, applied, loss, applied - 1 - seen  # other updates that landed in between

    for warm_up in range(args.workers):  # every worker connects and builds the step first
        coordinator.schedule(step, args=(tf.constant(1001 + 4 * warm_up),))
    coordinator.join()
    warm_ups = int(version.numpy())
    results = [coordinator.schedule(step, args=(tf.constant(i),)) for i in range(args.steps)]
    error = None
    if args.kill:
        while int(version.numpy()) - warm_ups < 2:  # a few steps' updates have reached the parameter server
            time.sleep(0.01)
        victim = servers[1] if args.kill == "worker" else servers[-1]  # worker 1, or the parameter server
        victim.send_signal(signal.SIGKILL)  # a machine failure
        victim.wait()
    try:
        coordinator.join()
    except tf.errors.UnavailableError as lost:  # the parameter server is gone: nothing can go on
        error = f"{type(lost).__name__}: {str(lost).strip().splitlines()[0][:120]}"
    if error is not None:
        print(json.dumps({"scheduled": list(range(args.steps)), "error": error, "cluster": spec}), flush=True)
    else:
        fetched = [r.fetch() for r in results]
        finished = [int(i) for i, _, _, _ in sorted(fetched, key=lambda r: int(r[1]))]  # by update number
        print(json.dumps({"scheduled": list(range(args.steps)), "finished": finished,
                          "staleness": [int(r[3]) for r in fetched], "updates": int(version.numpy()),
                          "warm_up_updates": warm_ups, "killed": args.kill, "final_loss": float(fetched[-1][2]),
                          "cluster": spec, "fit": fit, "error": None}), flush=True)
    if args.processes:  # the coordinator's thread for a dead worker waits for it to come back: don't wait
        for process in servers:
            process.kill()
        os._exit(0)


if __name__ == "__main__":
    main()
