"""A worker for tests/test_allreduce.py: how many all-reduces Keras's own ``apply_gradients`` launches per
step under MultiWorkerMirroredStrategy, given the strategy's ``communication_options`` (and, beside it,
a custom step that passes the same options itself). Prints one JSON line."""

import atexit
import gc
import json
import sys

atexit.register(gc.freeze)  # a faster exit: see mgpu_edu/runtime/processes.py

from mgpu_edu import allreduce, models, quiet  # noqa: E402

tf = quiet.import_tensorflow()
pack = int(sys.argv[1])
options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=pack)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
with strategy.scope():
    model = models.mlp(64, 10, seed=0)
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "keras": allreduce.gradient_allreduces(strategy, model),
                  "custom": allreduce.gradient_allreduces(strategy, model, bytes_per_pack=pack)}), flush=True)
