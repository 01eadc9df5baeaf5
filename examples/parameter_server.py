"""Asynchronous training with ParameterServerStrategy and a ClusterCoordinator, on one machine.

The cluster (2 workers, 1 parameter server, all on 127.0.0.1) runs inside this process, as
TensorFlow's own tutorial does; on a real cluster each task is a separate process started with
its TF_CONFIG, and this script would be the coordinator. The coordinator schedules steps; each
runs on whichever worker is free, reads the variables from the parameter server, and writes its
update back without waiting for the others. Steps therefore finish out of order, and a step may
use weights that other steps have already changed (stale gradients).

Prints one JSON line: the order steps were scheduled in, the order they finished in, each
step's staleness (how many other updates reached the parameter server between the step reading
the weights and applying its own update; it depends on which steps happened to overlap), the
number of updates the parameter server applied, and the final loss. ``--try-fit`` first tries
Keras 3 ``fit`` under this strategy and reports how it fails (Keras 3 has no ClusterCoordinator
support; tf-keras 2's ``fit`` had), in the JSON's "fit" field.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import socket

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--try-fit", action="store_true", help="first try Keras fit under this strategy")
    args = parser.parse_args()

    ports = free_ports(args.workers + 1)
    spec = {"worker": [f"127.0.0.1:{p}" for p in ports[:-1]], "ps": [f"127.0.0.1:{ports[-1]}"]}
    cluster = tf.train.ClusterSpec(spec)
    # In-process workers need enough inter-op threads, or they wait on each other (TF's tutorial).
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=max(os.cpu_count() or 1, args.workers + 1))
    servers = [tf.distribute.Server(cluster, job_name="worker", task_index=i, config=config, protocol="grpc",
                                    start=True) for i in range(args.workers)]
    servers.append(tf.distribute.Server(cluster, job_name="ps", task_index=0, protocol="grpc", start=True))

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
        target = tf.constant(tf.linspace(-1.0, 1.0, 16)[:, None])

    @tf.function
    def step(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            seen = version.read_value()  # the weights' version this step starts from
            with tf.control_dependencies([seen]):
                current = w.read_value()  # read right after the version: the weights this step uses
            # uneven work, done only after both reads: every fourth step (0, 4, 8, ...) does 6 big products
            with tf.control_dependencies([current]):
                x = tf.random.stateless_normal((256, 16), seed=tf.stack([index, 0]))
                heavy = tf.equal(tf.math.floormod(index, 4), 0)
                busy = tf.zeros((768, 768))
                for k in range(6):
                    if k == 0 or heavy:
                        busy += tf.matmul(tf.random.stateless_normal((768, 768), seed=tf.stack([index, k])),
                                          tf.random.stateless_normal((768, 768), seed=tf.stack([k, index])))
            loss = tf.reduce_mean((x @ current - x @ target) ** 2) + 0.0 * tf.reduce_sum(busy)
        update = w.assign_sub(0.1 * tape.gradient(loss, w))
        with tf.control_dependencies([update]):
            applied = version.assign_add(1)  # this step's update is number `applied`
            finished = tf.timestamp()  # taken after this step's update, not before
        return index, finished, loss, applied - 1 - seen  # other updates that landed in between

    for warm_up in range(args.workers):  # every worker connects and builds the step first
        coordinator.schedule(step, args=(tf.constant(1001 + 4 * warm_up),))
    coordinator.join()
    results = [coordinator.schedule(step, args=(tf.constant(i),)) for i in range(args.steps)]
    coordinator.join()
    fetched = [r.fetch() for r in results]
    finished = [int(i) for i, _, _, _ in sorted(fetched, key=lambda r: float(r[1]))]
    print(json.dumps({"scheduled": list(range(args.steps)), "finished": finished,
                      "staleness": [int(r[3]) for r in fetched], "updates": int(version.numpy()),
                      "final_loss": float(fetched[-1][2]),
                      "cluster": spec, "fit": fit}), flush=True)


if __name__ == "__main__":
    main()
