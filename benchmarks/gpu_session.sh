#!/bin/bash
# Runs on a GPU machine without internet access or TensorFlow (docs/gpu-runs.md): unpacks the
# TensorFlow 2.21 + CUDA 12 site that benchmarks/gpu_pack.sh made, from the parts copied to /tmp/parts,
# then prints what TensorFlow says about the card, runs benchmarks/gpu_checks.py (CHECKS=0 skips it), then
# the lessons under nbval on logical GPUs, one pytest process per lesson with its own log and JUnit file,
# in the order LESSONS names them (by number, e.g. "15 16 02"; all by default), until LESSONS_S seconds
# after the start: a lesson still running then is stopped with SIGINT (pytest still writes both files) and
# the ones not started are listed. Logs go to $OUT/logs.tgz.
#
# LESSONS_AT_ONCE (default 1) runs several lessons side by side. setup_devices gives a process's logical
# GPUs 80 % of the card between them, so several processes at once need a smaller share: a `sitecustomize`
# written below makes every Python process plan with the card's memory divided by LESSONS_AT_ONCE + 2
# (tests/offline/sitecustomize.py, which the tests put first on PYTHONPATH, runs it after itself, so the
# lesson kernels get it too). USABLE_FRACTION itself stays: lesson 00's T4 arithmetic uses it.
set -u
OUT=${OUT:-/tmp/gpu-out}; LOGS=/tmp/gpu-logs; mkdir -p "$OUT" "$LOGS"
SITE=${SITE:-/tmp/site}; PY=${PY:-python3}
LESSONS=${LESSONS:-$(ls lessons/[0-9]*.ipynb | sed 's#lessons/\([0-9]*\)_.*#\1#')}
AT_ONCE=${LESSONS_AT_ONCE:-1}
t0=$(date +%s)
if [ ! -d "$SITE/tensorflow" ]; then
  Z=zstd; command -v zstd >/dev/null || { Z=$(ls .gpu*/zstd | tail -1); export LD_LIBRARY_PATH=$(dirname "$Z"); }
  cat /tmp/parts/* | $Z -d --long=27 | tar x -C /tmp || exit 3
fi
echo "unpacked in $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=$(ls -d "$SITE"/nvidia/*/lib 2>/dev/null | paste -sd:)
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
if [ "$AT_ONCE" -gt 1 ]; then   # each process's share of the card (see above)
  mkdir -p /tmp/share
  # the card each process plans with is smaller; USABLE_FRACTION stays, as lesson 00 computes with it
  printf '%s\n' 'from mgpu_edu.runtime import devices' '_card = devices._gpu_memory_mb' \
    "devices._gpu_memory_mb = lambda env, name: (_card(env, name) or 0) // $(( AT_ONCE + 2 )) or None" \
    > /tmp/share/sitecustomize.py
  PYTHONPATH=/tmp/share:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
[ "${BRIEF:-0}" = 1 ] || $PY -c "import tensorflow as tf, keras; print('TF', tf.__version__, 'Keras', keras.__version__, tf.config.list_physical_devices('GPU'))" 2>&1 | tail -3
[ "${BRIEF:-0}" = 1 ] || $PY -m mgpu_edu doctor 2>&1 | tee "$LOGS/doctor.log" | grep -E "GPU|✗|TensorFlow" | head -8
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -l 2 > "$LOGS/smi.log" &
smi=$!
if [ "${CHECKS:-1}" != 0 ]; then
  timeout "${CHECKS_S:-200}" $PY benchmarks/gpu_checks.py > "$LOGS/checks.log" 2>&1
fi
export PY LOGS DEADLINE=$(( t0 + ${LESSONS_S:-600} ))
run_lesson() {   # one lesson under nbval, stopped at the deadline
  left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -le 5 ]; then echo "$1: not started (LESSONS_S reached)"; return; fi
  timeout -s INT -k 20 "$left" $PY -m pytest lessons/"$1"_*.ipynb -q --tb=short -rfE -p no:cacheprovider \
    -p no:benchmark --junitxml="$LOGS/$1.xml" > "$LOGS/$1.log" 2>&1
}
export -f run_lesson
printf '%s\n' $LESSONS | xargs -P "$AT_ONCE" -I{} bash -c 'run_lesson {}'
echo "lessons done after $(( $(date +%s) - t0 )) s"
kill $smi 2>/dev/null
[ -f "$LOGS/checks.log" ] && grep -E "^CHECK|^\(" "$LOGS/checks.log" | cut -c1-300
for number in $LESSONS; do [ -f "$LOGS/$number.log" ] && grep -E "^(FAILED|ERROR)" "$LOGS/$number.log" | cut -c1-240 | head -12; done
$PY - "$LOGS"/[0-9]*.xml <<'PY'
import sys, xml.etree.ElementTree as ET
total = [0, 0, 0.0]
for path in sys.argv[1:]:
    cases = list(ET.parse(path).iter("testcase"))
    bad = sum(any(c.tag in ("failure", "error") for c in case) for case in cases)
    seconds = sum(float(case.get("time", 0)) for case in cases)
    print(f"{path.rsplit('/', 1)[-1][:-4]}: {len(cases)} cells, {bad} failed, {seconds:.1f} s")
    total = [total[0] + len(cases), total[1] + bad, total[2] + seconds]
print(f"all: {total[0]} cells, {total[1]} failed, {total[2]:.1f} s (cell times summed)")
PY
sort -t, -k2 -n "$LOGS/smi.log" | tail -1 | sed 's/^/most GPU memory used (all processes): /'
echo "total $(( $(date +%s) - t0 )) s"
tar czf "$OUT/logs.tgz" -C "$LOGS" .   # one archive: easy to copy back
