"""The claims only a real GPU can check (docs/gpu-runs.md), run on one NVIDIA GPU.

    python benchmarks/gpu_checks.py          # each check in a fresh process; prints what it read

Each check prints ``CHECK <name>: <what TensorFlow said>`` and never stops the others. Devices
can't change once TensorFlow has set them up, so the layouts run in separate processes. The
timings printed are shown, not asserted: docs/gpu-runs.md records them with the card they ran on.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

SPLIT = """
import time, numpy as np
from mgpu_edu import setup_devices
from mgpu_edu.runtime import quiet
tf = quiet.import_tensorflow()
tf32_default = tf.config.experimental.tensor_float_32_execution_enabled()  # before setup_devices sets it
layout = setup_devices(4)
gpus = tf.config.list_logical_devices("GPU")
print("CHECK banner:", layout.banner)
print("CHECK logical GPUs:", [d.name for d in gpus], "limits MB:", layout.memory_limits_mb)

# 00 section 3: over the limit on one logical GPU fails there; the others hold nothing
limit = layout.memory_limits_mb[1]
try:
    with tf.device("/GPU:1"):
        big = tf.ones([int(limit * 1.2) * 1024 * 1024 // 4])
        big.numpy()[:1]
    print("CHECK over-limit on GPU:1: no error (limit not enforced)")
except tf.errors.ResourceExhaustedError as error:
    print("CHECK over-limit on GPU:1: ResourceExhaustedError:", str(error).splitlines()[0][:160])
with tf.device("/GPU:1"):
    fits = tf.ones([int(limit * 0.5) * 1024 * 1024 // 4])
print("CHECK half the limit on GPU:1 fits: MiB held",
      {d: tf.config.experimental.get_memory_info(d)["current"] // 2**20 for d in ("GPU:0", "GPU:1", "GPU:2", "GPU:3")})
del fits

# 03 section 6: what MirroredStrategy's all-reduce runs on logical GPUs
from mgpu_edu.parallelism import allreduce
tensors = []
for i, d in enumerate(layout):
    with tf.device(d):
        tensors.append(tf.fill([1000], float(i + 1)))
result = allreduce.tf_allreduce(tensors)
print("CHECK tf_allreduce on logical GPUs:", result.implementation, dict(result.graph_ops),
      "sum ok:", all(np.allclose(r.numpy(), 10.0) for r in result.sums))

# 08 section 3: TF32 on by default on compute capability >= 8.0 (setup_devices turns it off)
details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
print("CHECK device details:", details)
print("CHECK TF32 enabled by default:", tf32_default, "after setup_devices:",
      tf.config.experimental.tensor_float_32_execution_enabled())
rng = np.random.default_rng(0)
a64, b64 = rng.standard_normal((4096, 4096)), rng.standard_normal((4096, 4096))
exact = a64 @ b64
with tf.device("/GPU:0"):
    a, b = tf.constant(a64, tf.float32), tf.constant(b64, tf.float32)
    for tf32 in (True, False):
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        c = tf.matmul(a, b); c.numpy()
        start = time.perf_counter()
        for _ in range(20):
            c = tf.matmul(a, b)
        c.numpy()
        seconds = (time.perf_counter() - start) / 20
        error = float(np.max(np.abs(c.numpy() - exact)) / np.max(np.abs(exact)))
        print(f"CHECK matmul 4096^2 float32, TF32 {'on ' if tf32 else 'off'}: {seconds * 1e3:.2f} ms,"
              f" {2 * 4096**3 / seconds / 1e12:.1f} TFLOP/s, max error relative to float64 {error:.1e}")
tf.config.experimental.enable_tensor_float_32_execution(True)

# 01 section 2: eager GPU kernels are launched asynchronously
with tf.device("/GPU:0"):
    x = tf.random.normal([4096, 4096]); x.numpy()
    start = time.perf_counter()
    for _ in range(10):
        y = tf.matmul(x, x)
    launched = time.perf_counter() - start
    y.numpy()
    finished = time.perf_counter() - start
print(f"CHECK async launch: 10 matmuls launched in {launched * 1e3:.2f} ms, done after {finished * 1e3:.2f} ms")

# 08 section 3: which mixed-precision policy this card gets
import keras
cc = details.get("compute_capability")
policy = "mixed_bfloat16" if cc and cc >= (8, 0) else "mixed_float16"
keras.mixed_precision.set_global_policy(policy)
opt = keras.optimizers.SGD(0.1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
model.compile(optimizer=opt, loss="mse")
print("CHECK mixed precision:", cc, policy, "optimizer", type(model.optimizer).__name__)
keras.mixed_precision.set_global_policy("float32")

# 10 section 1: a step's memory on the GPU allocator, with and without recomputation
from mgpu_edu.analysis import tradeoffs
from mgpu_edu.workloads import models
for layers, batch, segment in ((8, 512, 2), (16, 2048, 4)):
    keras.utils.set_random_seed(0)
    m = models.mlp(64, 10, hidden=(256,) * layers)
    xs = tf.random.normal([batch, 64]); ys = tf.zeros([batch], tf.int32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    for seg in (None, segment):
        s = tradeoffs.step_memory(m, loss, xs, ys, segment=seg, device="GPU:0")
        print(f"CHECK step_memory GPU:0 {layers} layers batch {batch} segment {seg}: "
              f"kept {s.kept / 2**20:.2f} MiB, peak {s.peak / 2**20:.2f} MiB")
"""

GROWTH_THEN_SPLIT = """
from mgpu_edu.runtime import quiet
tf = quiet.import_tensorflow()
gpu = tf.config.list_physical_devices("GPU")[0]
tf.config.experimental.set_memory_growth(gpu, True)
try:
    tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=1024)] * 2)
    print("CHECK growth then split: no error;", len(tf.config.list_logical_devices("GPU")), "logical GPUs")
except Exception as error:
    print("CHECK growth then split:", type(error).__name__, error)
with tf.device("/GPU:0"):
    x = tf.ones([64 * 1024 * 1024 // 4])
try:
    with tf.device("/GPU:0"):
        y = tf.ones([1536 * 1024 * 1024 // 4])
    y.numpy()[:1]
    print("CHECK growth then split: 1.5 GB on a 1 GB logical GPU fit (limit ignored)")
except tf.errors.ResourceExhaustedError:
    print("CHECK growth then split: 1.5 GB on a 1 GB logical GPU raised ResourceExhaustedError (limit kept)")
"""


def run(name: str, code: str) -> None:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    for line in done.stdout.splitlines():
        print(line)
    if done.returncode:
        print(f"CHECK {name}: exit {done.returncode}")
        print(done.stderr[-3000:])
    print(f"({name}: {time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    run("split into four", SPLIT)
    run("growth then split", GROWTH_THEN_SPLIT)
