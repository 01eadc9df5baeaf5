"""Train one model on several machines with MultiWorkerMirroredStrategy and a custom loop.

Runs as is on a real cluster and on one machine:

- **TF_CONFIG** (default): every worker gets the same cluster and its own task, e.g.
  ``{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}``.
  Kubernetes operators (TFJob) and ``mgpu_edu.cluster.LocalCluster`` set it for you.
- **Slurm**, on GPU nodes: ``srun python multi_worker_train.py --cluster slurm`` reads the job's
  nodes and tasks through ``tf.distribute.cluster_resolver.SlurmClusterResolver``. That resolver
  takes each node's GPUs from ``CUDA_VISIBLE_DEVICES`` when it is set, else counts them with
  ``nvidia-smi`` (and fails on a node with neither), then shares them out itself: it sets each
  task's ``CUDA_VISIBLE_DEVICES``. So each task must see all of its node's GPUs (a Slurm setting
  that binds one GPU per task breaks the count), or give ``--gpus-per-node N`` to skip the count;
  give ``--port-base`` when two jobs share a node (every job starts at port 8888 otherwise).

**Each worker its own data.** ``--per-worker-batch`` is what one worker trains on per step, whatever
its number of GPUs: the global batch is that times the workers, and each of a worker's replicas
takes an equal share. Each worker builds its own input pipeline with
``strategy.distribute_datasets_from_function``: TensorFlow hands the function a
``tf.distribute.InputContext`` that says how many pipelines there are, which one this is, and the
batch per replica, and the pipeline keeps every n-th example (``shard``). The other way,
``strategy.experimental_distribute_dataset`` on one dataset batched by the global batch, lets
tf.data split the data by its ``AutoShardPolicy``: FILE (each worker reads its own files), DATA
(each worker reads everything and keeps its share of every batch), OFF (no sharding: every worker
trains on the same examples), or AUTO (FILE where the data comes from files, else DATA).
``--show-input`` prints which examples each worker gets in its first two steps under each.

Each worker prints one line per step and writes its final weights to ``--out``; every worker
must end with the same weights. ``--try-fit`` first tries Keras ``fit`` under this strategy and
reports how it fails with Keras 3 (keras-team/keras#20585) before running the custom loop.

**Surviving failures.** With ``--checkpoint-dir DIR --checkpoint-every K``, the workers save the
model, the optimizer and the step counter every K steps with a ``tf.train.CheckpointManager``,
as TensorFlow's multi-worker guide prescribes: every worker calls ``save`` (saving takes part in
the strategy's collective work), the chief (worker 0) into DIR, the others into temporary
folders they delete afterwards. Started again with the same DIR, every worker restores the
chief's latest checkpoint and resumes at its step, reading the same batches it would have read
(the dataset skips the steps already done). ``--stall WORKER STEP`` makes one worker stop after
that step (before the last) and wait, so a test or a lesson can kill it at a known point: its
peers are then waiting in the next step's all-reduce, as they would be for a machine that died
mid-run. Nothing else ends the wait: by default a worker that is alive but stuck is never noticed.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Exit about 0.8 s sooner: after importing TensorFlow (and Keras) a process holds some 300,000 Python
# objects, and Python's garbage collector sweeps them as it shuts down, just before the OS frees the
# memory anyway. Frozen objects are skipped. (It matters when a course starts many short jobs.)
atexit.register(gc.freeze)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")
import keras  # noqa: E402


def make_strategy(cluster: str, gpus_per_node: int | None = None, port_base: int = 8888) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy from TF_CONFIG, or from Slurm's environment (GPU nodes)."""
    if cluster == "slurm":
        options = {"port_base": port_base}
        if gpus_per_node is not None:
            options["gpus_per_node"] = gpus_per_node
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(**options)
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    return tf.distribute.MultiWorkerMirroredStrategy()


def write_dir(checkpoint_dir: Path, strategy: tf.distribute.Strategy) -> Path:
    """Where this worker writes checkpoints: the chief into ``checkpoint_dir``, every other worker
    into a temporary folder of its own inside it. TensorFlow decides who is chief: the ``chief``
    task if the cluster has one, else worker 0 (``strategy.extended.should_checkpoint``). On real
    machines ``checkpoint_dir`` must be storage every worker can read (NFS, a cloud bucket): each
    restores from the chief's copy."""
    if strategy.extended.should_checkpoint:
        return checkpoint_dir
    resolver = strategy.cluster_resolver
    return checkpoint_dir / f"temp-{resolver.task_type}-{resolver.task_id}"


def show_input(strategy: tf.distribute.Strategy, say: Callable[[str], None], global_batch: int = 8) -> None:
    """Print which examples this worker gets in its first two steps, for each way of sharding the input.

    The examples are numbered 0, 1, 2, …; in "files", file f holds 10·f, 10·f + 1, … ."""
    def first_two(distributed: object) -> str:
        batches = iter(distributed)
        return ", ".join(str([int(v) for v in strategy.experimental_local_results(next(batches))[0].numpy()])
                         for _ in range(2))

    def policy(dataset: tf.data.Dataset, name: str) -> tf.data.Dataset:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, name)
        return dataset.with_options(options)

    numbers = tf.data.Dataset.range(64).batch(global_batch)
    for name in ("DATA", "OFF"):
        say(f"input {name:<13} {first_two(strategy.experimental_distribute_dataset(policy(numbers, name)))}")
    folder = Path(tempfile.mkdtemp())  # four files of 8 records each, this worker's own copy
    try:
        for f in range(4):
            (folder / f"part-{f}.txt").write_text("\n".join(str(10 * f + i) for i in range(8)))
        files = tf.data.Dataset.list_files(str(folder / "part-*.txt"), shuffle=False)
        records = files.interleave(tf.data.TextLineDataset, cycle_length=1).map(
            lambda line: tf.strings.to_number(line, tf.int64)).batch(global_batch)
        by_file = strategy.experimental_distribute_dataset(policy(records, "FILE"))
        say(f"input {'FILE (files)':<13} {first_two(by_file)}")
    finally:
        shutil.rmtree(folder)

    def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return (tf.data.Dataset.range(64).shard(context.num_input_pipelines, context.input_pipeline_id)
                .batch(context.get_per_replica_batch_size(global_batch)))
    say(f"input {'from_function':<13} {first_two(strategy.distribute_datasets_from_function(per_worker))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", choices=["tf_config", "slurm"], default="tf_config")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--per-worker-batch", type=int, default=32,
                        help="examples each worker trains on per step (split between its replicas)")
    parser.add_argument("--show-input", action="store_true",
                        help="first print which examples each worker gets, for each way of sharding the input")
    parser.add_argument("--out", type=Path, default=None, help="folder for each worker's final weights")
    parser.add_argument("--try-fit", action="store_true", help="first try Keras fit under this strategy")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="Slurm: GPUs per node (else CUDA_VISIBLE_DEVICES, else nvidia-smi)")
    parser.add_argument("--port-base", type=int, default=8888, help="Slurm: first port of the job's workers")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="save and resume from checkpoints here")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: never)")
    parser.add_argument("--stall", type=int, nargs=2, metavar=("WORKER", "STEP"), default=None,
                        help="worker WORKER stops after step STEP and waits to be killed (tests, lessons)")
    args = parser.parse_args()
    stall = f"--stall {args.stall[0]} {args.stall[1]}" if args.stall is not None else ""
    if args.stall is not None and args.steps < 2:
        parser.error(f"{stall}: a stall needs --steps 2 or more, so that a next step waits for it")
    if args.stall is not None and not 1 <= args.stall[1] < args.steps:
        parser.error(f"{stall}: give a step from 1 to {args.steps - 1} (one before --steps {args.steps}): the other "
                     "workers must have a next step in which to wait for the stalled one")

    strategy = make_strategy(args.cluster, args.gpus_per_node, args.port_base)
    resolver = strategy.cluster_resolver
    workers_in_cluster = len(resolver.cluster_spec().as_dict().get("worker", []))
    if args.stall is not None and workers_in_cluster == 0:
        parser.error(f"{stall}: this process runs alone, not in a cluster of workers (TF_CONFIG or --cluster "
                     "slurm), so no peer would wait for it; leave --stall out")
    if args.stall is not None and not 0 <= args.stall[0] < workers_in_cluster:
        parser.error(f"{stall}: this cluster's workers are numbered 0 to {workers_in_cluster - 1}; give one of "
                     "them (a chief task can't be stalled)")
    task = f"{resolver.task_type}:{resolver.task_id}"
    local_replicas = len(strategy.extended.worker_devices)  # this worker's GPUs (or its one CPU)
    workers = strategy.num_replicas_in_sync // local_replicas
    if args.per_worker_batch % local_replicas:
        parser.error(f"--per-worker-batch {args.per_worker_batch}: each worker has {local_replicas} replicas, which "
                     f"share its batch equally; give a multiple of {local_replicas}")
    global_batch = args.per_worker_batch * workers
    started = time.time()

    def say(message: str) -> None:
        print(f"[{task} +{time.time() - started:5.2f}s] {message}", flush=True)

    say(f"cluster {json.dumps(resolver.cluster_spec().as_dict())}, {strategy.num_replicas_in_sync} replicas in sync")
    if args.show_input:
        show_input(strategy, say)
    rng = np.random.default_rng(0)  # the same data on every worker; the strategy shards it
    x = rng.normal(size=(2048, 16)).astype("float32")
    y = (x @ rng.normal(size=(16, 1)) > 0).astype("int32").ravel()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")  # steps done: saved with the weights
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    manager = None
    if args.checkpoint_dir is not None:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
        latest = tf.train.latest_checkpoint(str(args.checkpoint_dir))  # the chief's: every worker reads it
        if latest is not None:
            checkpoint.restore(latest).assert_existing_objects_matched()
            resumed = int(step.numpy())
            say(f"resumed from step {resumed} ({Path(latest).name})")
            if args.stall is not None and args.stall[1] <= resumed:
                parser.error(f"{stall}: this run resumes after step {resumed} ({Path(latest).name}), so it never "
                             f"finishes step {args.stall[1]}; give a later step, or leave --stall out")
        mine = write_dir(args.checkpoint_dir, strategy)
        manager = tf.train.CheckpointManager(checkpoint, str(mine), max_to_keep=2)

    done = int(step.numpy())

    def worker_input(context: tf.distribute.InputContext) -> tf.data.Dataset:
        """This worker's own pipeline: every n-th example of n pipelines, batched per replica."""
        shard = tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines, context.input_pipeline_id)
        # a resumed run reads the batches an unbroken run would: each step took one batch per local replica
        return shard.repeat().batch(context.get_per_replica_batch_size(global_batch)).skip(done * local_replicas)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)  # for --try-fit only

    if args.try_fit:
        try:
            with strategy.scope():
                model.compile(optimizer=keras.optimizers.SGD(0.1),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)
            say("fit: ran")
        except Exception as error:  # reported, then the custom loop runs
            first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
            say(f"fit: failed with {type(error).__name__}: {first}")

    @tf.function
    def train_step(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def replica_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                # every batch is full (the dataset repeats), so the constant global batch is the real one
                loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)),
                                                  global_batch_size=global_batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=False))
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=next(iterator)), axis=None)

    iterator = iter(strategy.distribute_datasets_from_function(worker_input))
    while int(step.numpy()) < args.steps:
        loss = float(train_step(iterator))
        step.assign_add(1)
        done = int(step.numpy())
        say(f"step {done}: loss {loss:.4f}")
        if manager is not None and args.checkpoint_every and done % args.checkpoint_every == 0:
            manager.save(checkpoint_number=done)  # every worker saves; only the chief's copy is kept
            if mine != args.checkpoint_dir:
                tf.io.gfile.rmtree(str(mine))
            say(f"checkpoint saved at step {done}")
        if args.stall == [resolver.task_id, done] and resolver.task_type == "worker":
            say(f"stalled after step {done}, waiting to be killed")
            while True:  # the others wait in the next step's all-reduce
                time.sleep(60)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez(args.out / f"worker{resolver.task_id}.npz", *[np.asarray(w) for w in model.get_weights()])
        say(f"weights saved to {args.out}")


if __name__ == "__main__":
    main()
