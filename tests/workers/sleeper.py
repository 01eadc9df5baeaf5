"""A stand-in worker for cluster tests: prints its task, then sleeps (or fails, or exits)."""

import json
import os
import sys
import time

task = json.loads(os.environ["TF_CONFIG"])["task"]
print(f"worker {task['index']} pid {os.getpid()}", flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "sleep"
if mode == "fail" and task["index"] == 1:
    print("something went wrong on purpose", flush=True)
    sys.exit(3)
if mode == "done":
    sys.exit(0)
if mode == "gpus":  # which GPUs this worker may use
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}", flush=True)
    sys.exit(0)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 300)
