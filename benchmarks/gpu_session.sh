#!/bin/bash
# Runs on a lent GPU machine that has no TensorFlow and no package registry: unpacks the
# TensorFlow 2.21 + CUDA 12 site that benchmarks/gpu_pack.sh split into parts and earlier calls
# carried, one each, into /tmp/parts (`mkdir -p /tmp/parts; mv .gpuNN/part /tmp/parts/NN`), then
# prints what TensorFlow says about the card, runs benchmarks/gpu_checks.py and every lesson under
# nbval on logical GPUs. Logs go to $OUT. docs/gpu-runs.md says what was seen.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
t0=$(date +%s)
if [ ! -d /tmp/site/tensorflow ]; then
  Z=zstd; command -v zstd >/dev/null || { Z=$(ls .gpu*/zstd | tail -1); export LD_LIBRARY_PATH=$(dirname "$Z"); }
  cat /tmp/parts/* | $Z -d --long=27 | tar x -C /tmp || exit 3
fi
echo "unpacked in $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=$(ls -d /tmp/site/nvidia/*/lib | paste -sd:)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
python3 -c "import tensorflow as tf, keras; print('TF', tf.__version__, 'Keras', keras.__version__, tf.config.list_physical_devices('GPU'))" 2>&1 | tail -3
python3 -m mgpu_edu doctor 2>&1 | tee "$OUT/doctor.log" | grep -E "GPU|✗|TensorFlow" | head -8
timeout "${CHECKS_S:-150}" python3 benchmarks/gpu_checks.py > "$OUT/checks.log" 2>&1; echo "checks exit $?"
grep -E "^CHECK|^\(" "$OUT/checks.log" | cut -c1-400
timeout "${LESSONS_S:-330}" python3 -m pytest lessons/[0-9]*.ipynb -q --durations=0 -p no:cacheprovider \
  > "$OUT/lessons.log" 2>&1; echo "lessons exit $?"
grep -E "passed|failed|error|s call" "$OUT/lessons.log" | grep -v "^ " | tail -60 | cut -c1-300
echo "total $(( $(date +%s) - t0 )) s"
